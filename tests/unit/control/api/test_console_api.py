"""The console's reads on the real server app: the fleet map, a host, a job's ranks, teams,
utilization, simulation reports, the change feed, and who may see what."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, Fleet, later, make_spec, postgres_server, report_steps, store_url
from test_control_api import token

from boltforge.control.api.stream import _change
from boltforge.control.nodes.agents import LeaseTerms
from boltforge.control.notify import Notifier
from boltforge.spec.teams import parse_teams

__all__ = ["postgres_server", "store_url"]  # fixtures used by name
DAY = 86400.0


@pytest.fixture
def fleet(tmp_path: Path, store_url: str) -> Iterator[Fleet]:
    teams = parse_teams(
        {
            "teams": {
                "nlp": {"quota": {"guaranteed": 16, "burst": 24}, "budget": {"monthly": 1000}},
                "vision": {"quota": {"guaranteed": 8}},
            }
        }
    )
    reports = tmp_path / "reports"
    reports.mkdir()
    lasting = LeaseTerms(2.0, DAY, DAY)  # leases outlast the hours tests skip
    config: dict[str, Any] = {"teams": teams, "budgets": teams.budgets(), "terms": lasting}
    config |= {"reports_dir": str(reports), "sample_every_s": DAY}  # samples taken by tests
    with Fleet(tmp_path, hosts=4, db_url=store_url, **config) as f:
        yield f


def get(fleet: Fleet, path: str, headers: dict[str, str] = ADMIN) -> Any:
    r = fleet.http.get(path, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def owners_on_map(page: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Host name -> the owner of each held GPU, from a map reply."""
    hosts = [h for pod in page["pods"] for rack in pod["racks"] for h in rack["hosts"]]
    return {h["name"]: [page["owners"][i] for i in h["gpus"] if i >= 0] for h in hosts}


def test_the_map_draws_every_gpu_with_its_job(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 16, team="nlp"))
    page = get(fleet, "/v1/console/map")
    assert page["gpus"] == 32 and page["gpus_used"] == 16
    assert [p["name"] for p in page["pods"]] == ["p0"]
    assert [r["name"] for r in page["pods"][0]["racks"]] == ["r0", "r1"]
    held = owners_on_map(page)
    assert sum(len(v) for v in held.values()) == 16
    assert all(o["job"] == job and o["team"] == "nlp" for v in held.values() for o in v)
    assert {o["state"] for v in held.values() for o in v} == {"scheduled"}


def test_the_map_counts_the_fleet_and_can_be_asked_for_some_hosts(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 8, team="nlp"))
    fleet.submit(make_spec("waits", 32, team="nlp"))
    node = fleet.job(job).placement[0].node
    page = get(fleet, f"/v1/console/map?hosts={node},host-99")
    hosts = [h["name"] for pod in page["pods"] for rack in pod["racks"] for h in rack["hosts"]]
    assert hosts == [node] and page["owners"][0]["job"] == job
    assert (page["gpus"], page["gpus_used"], page["nodes"], page["nodes_ready"]) == (32, 8, 4, 4)
    assert (page["jobs_running"], page["jobs_pending"]) == (1, 1)


def test_a_cancelled_jobs_gpus_stay_its_own_until_its_processes_exit(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("leaving", 8, team="vision"))
    fleet.start_everything()
    fleet.post(f"/v1/jobs/{job}/cancel", {})
    held = owners_on_map(get(fleet, "/v1/console/map"))
    assert [(o["job"], o["team"], o["state"]) for v in held.values() for o in v] == [
        (job, "vision", "cancelled")
    ] * 8
    fleet.stop_everything()
    assert sum(len(v) for v in owners_on_map(get(fleet, "/v1/console/map")).values()) == 0


def test_a_member_sees_another_teams_gpus_only_as_that_team(fleet: Fleet) -> None:
    fleet.submit(make_spec("theirs", 8, team="vision"))
    mine = fleet.submit(make_spec("mine", 8, team="nlp"))
    alice = token(fleet, "alice", "member", "nlp")
    owners = get(fleet, "/v1/console/map", alice)["owners"]
    assert {(o["job"], o["team"]) for o in owners} == {(mine, "nlp"), (None, "vision")}
    assert all(o["name"] is None for o in owners if o["team"] == "vision")


def test_a_host_shows_its_gpus_jobs_health_and_cordon(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 8, team="nlp"))
    node = fleet.job(job).placement[0].node
    assert fleet.post(f"/v1/nodes/{node}/cordon", {}).status_code == 200
    host = get(fleet, f"/v1/console/hosts/{node}")
    assert host["state"] == "draining" and host["cordoned"] is True
    assert [s["job"] for s in host["slots"]] == [job] * 8
    assert [s["rank"] for s in host["slots"]] == [0] * 8
    assert host["jobs"] == [job] and host["job_list"][0]["name"] == "train"
    assert any("cordoned" in line for line in host["health"])
    assert any(line.startswith("last heartbeat") for line in host["health"])


def test_a_host_hides_another_teams_job_from_a_member(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("theirs", 8, team="vision"))
    node = fleet.job(job).placement[0].node
    alice = token(fleet, "alice", "member", "nlp")
    host = get(fleet, f"/v1/console/hosts/{node}", alice)
    assert host["jobs"] == [] and host["job_list"] == []
    assert {(s["job"], s["team"]) for s in host["slots"]} == {(None, "vision")}


def test_an_unknown_host_is_a_404_naming_it(fleet: Fleet) -> None:
    r = fleet.http.get("/v1/console/hosts/host-99", headers=ADMIN)
    assert r.status_code == 404 and "no node host-99" in r.json()["error"]


def test_ranks_show_step_times_and_the_flagged_straggler(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 16, team="nlp"))
    fleet.start_everything()
    report_steps(fleet, job, {0: 0.05, 1: 0.15})
    later(fleet, 3.0)
    page = get(fleet, f"/v1/jobs/{job}/ranks")
    assert page["epoch"] == 1
    by_rank = {r["rank"]: r for r in page["ranks"]}
    assert by_rank[0]["median_s"] == pytest.approx(0.05)
    assert by_rank[1]["median_s"] == pytest.approx(0.15)
    assert (by_rank[0]["straggler"], by_rank[1]["straggler"]) == (False, True)
    assert page["peer_median_s"] == pytest.approx(0.10)


def test_another_teams_ranks_are_forbidden_to_a_member(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("theirs", 8, team="vision"))
    alice = token(fleet, "alice", "member", "nlp")
    r = fleet.http.get(f"/v1/jobs/{job}/ranks", headers=alice)
    assert r.status_code == 403 and "team vision" in r.json()["error"]


def test_teams_show_quota_use_borrowing_standing_and_budget(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("big", 24, team="nlp"))
    fleet.start_everything()
    fleet.clock.advance(3600)
    assert fleet.job(job).state == "running", fleet.job(job).waiting
    teams = {t["team"]: t for t in get(fleet, "/v1/console/teams")["teams"]}
    nlp, vision = teams["nlp"], teams["vision"]
    assert (nlp["guaranteed"], nlp["burst"], nlp["using"], nlp["borrowing"]) == (16, 24, 24, 8)
    assert (vision["guaranteed"], vision["using"], vision["borrowing"]) == (8, 0, 0)
    assert nlp["usage_gpu_h"] == pytest.approx(24.0, rel=5e-3)  # decayed over the hour
    assert nlp["share"] == pytest.approx(0.5) and vision["factor"] == 1.0
    assert nlp["factor"] < 0.5 < vision["factor"]
    assert (vision["standing"], nlp["standing"]) == (1, 2)
    assert nlp["budget"] == 1000 and nlp["soft"] == 800 and nlp["budget_state"] == "ok"
    fleet.submit(make_spec("unlisted", 1, team="misc"))
    misc = next(t for t in get(fleet, "/v1/console/teams")["teams"] if t["team"] == "misc")
    assert (misc["share"], misc["factor"], misc["guaranteed"]) == (None, None, None)
    assert nlp["spend"] >= 0 and vision["budget"] is None


def test_utilization_samples_allocated_compute_and_productive(fleet: Fleet) -> None:
    stepping = fleet.submit(make_spec("stepping", 16, team="nlp"))
    fleet.submit(make_spec("silent", 8, team="nlp"))
    placed = fleet.submit(make_spec("placed", 8, team="vision"))
    for node in fleet.nodes.values():
        for rep in node.to_run():
            if rep.job != placed:
                node.start(rep)
    fleet.settle()
    report_steps(fleet, stepping, {0: 0.1, 1: 0.1}, steps=2)
    fleet.rt.take_sample()
    point = get(fleet, "/v1/console/utilization?window_s=60")["samples"][-1]
    assert (point["gpus"], point["allocated"]) == (32, 32)
    assert point["compute"] == 24 and point["productive"] == 16
    assert 0.0 <= point["fragmentation"] <= 1.0
    fleet.clock.advance(120)
    assert get(fleet, "/v1/console/utilization?window_s=60")["samples"] == []


def write_report(root: Path, name: str, summary: dict[str, Any]) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "utilization.png").write_bytes(b"\x89PNG\r\n\x1a\nplot")
    return folder


def test_reports_are_listed_opened_and_their_plots_served(fleet: Fleet) -> None:
    root = Path(str(fleet.config.reports_dir))
    table: dict[str, Any] = {
        "columns": [["policy", "Policy"], ["avg_jct_h", "Avg JCT (h)"]],
        "rows": [{"policy": "default", "avg_jct_h": "1.50"}],
    }
    write_report(root, "itp", {"title": "ITP", "command": "bolt simulate", "table": table})
    (root / "broken").mkdir()
    (root / "broken" / "summary.json").write_text("{not json")
    listed = get(fleet, "/v1/console/reports")["reports"]
    assert [r["name"] for r in listed] == ["itp"]
    report = get(fleet, "/v1/console/reports/itp")
    assert report["columns"] == [["policy", "Policy"], ["avg_jct_h", "Avg JCT (h)"]]
    assert report["rows"] == [{"policy": "default", "avg_jct_h": "1.50"}]
    assert report["files"] == ["utilization.png"]
    plot = fleet.http.get("/v1/console/reports/itp/files/utilization.png", headers=ADMIN)
    assert plot.status_code == 200 and plot.content.startswith(b"\x89PNG")
    assert plot.headers["content-type"] == "image/png"


def test_a_report_without_a_table_is_shown_from_its_figures(fleet: Fleet) -> None:
    root = Path(str(fleet.config.reports_dir))
    policies = {"fifo": {"jobs": 10, "avg_jct_s": 5.5, "teams": {}}}
    write_report(root, "old", {"title": "Old", "policies": policies})
    report = get(fleet, "/v1/console/reports/old")
    assert report["columns"] == [["policy", "Policy"], ["avg_jct_s", "avg_jct_s"], ["jobs", "jobs"]]
    assert report["rows"] == [{"policy": "fifo", "avg_jct_s": "5.5", "jobs": "10"}]


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/v1/console/reports/nope", "no report nope"),
        ("/v1/console/reports/itp/files/..%2F..%2Fstore.db", "Not Found"),
        ("/v1/console/reports/itp/files/summary.json", "no plot summary.json"),
    ],
)
def test_report_paths_outside_a_report_are_404s(fleet: Fleet, path: str, words: str) -> None:
    write_report(Path(str(fleet.config.reports_dir)), "itp", {"title": "ITP"})
    r = fleet.http.get(path, headers=ADMIN)
    assert r.status_code == 404 and words in r.json()["error"]


def test_a_server_without_a_reports_folder_says_how_to_get_one(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=1) as fleet:
        assert get(fleet, "/v1/console/reports") == {"reports": []}
        r = fleet.http.get("/v1/console/reports/x", headers=ADMIN)
        assert r.status_code == 404 and "bolt server --reports" in r.json()["error"]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/console/map",
        "/v1/console/hosts/host-0",
        "/v1/console/teams",
        "/v1/console/utilization",
        "/v1/console/reports",
        "/v1/console/stream",
    ],
)
def test_console_data_needs_a_token(fleet: Fleet, path: str) -> None:
    r = fleet.http.get(path)
    assert r.status_code == 401 and "Authorization: Bearer" in r.json()["error"]


def test_the_console_page_is_served_without_a_token(fleet: Fleet) -> None:
    page = fleet.http.get("/console/")
    assert page.status_code == 200 and "<script" in page.text
    assert "http://" not in page.text and "https://" not in page.text
    root = fleet.http.get("/", follow_redirects=False)
    assert root.status_code == 307 and root.headers["location"] == "/console/"


def test_the_openapi_document_has_the_console_reads_but_not_the_endless_stream(
    fleet: Fleet,
) -> None:
    paths = fleet.http.get("/openapi.json").json()["paths"]
    assert {"/v1/console/map", "/v1/console/teams", "/v1/jobs/{job_id}/ranks"} <= set(paths)
    assert "/v1/console/stream" not in paths


def test_the_change_feed_names_jobs_and_nodes_since_a_sequence() -> None:
    notes = Notifier()
    start = notes.seq
    notes.notify(["job:a", "jobs", "node:host-0"])
    notes.notify(["logs:a"])
    seq, keys = notes.since(start)
    assert seq == start + 4 and keys == {"job:a", "jobs", "node:host-0", "logs:a"}
    assert notes.since(seq) == (seq, set())


def test_the_change_feed_tells_a_listener_too_far_behind_to_refresh_all() -> None:
    notes = Notifier()
    notes.notify([f"job:{i}" for i in range(10_001)])
    seq, keys = notes.since(0)
    assert keys is None and seq == 10_001


def test_a_members_change_event_names_only_its_teams_jobs(fleet: Fleet) -> None:
    mine = fleet.submit(make_spec("mine", 8, team="nlp"))
    theirs = fleet.submit(make_spec("theirs", 8, team="vision"))
    alice = fleet.rt.caller(token(fleet, "alice", "member", "nlp")["Authorization"][7:])
    assert alice is not None
    keys = {f"job:{mine}", f"job:{theirs}", f"logs:{theirs}", "jobs", "node:host-0"}
    body = _change(fleet.rt, alice, keys)
    assert body == {"jobs": [mine], "logs": [], "nodes": ["host-0"], "all": False}
    admin = fleet.rt.caller("adm")
    assert admin is not None
    assert _change(fleet.rt, admin, keys) == {
        "jobs": sorted([mine, theirs]),
        "logs": [theirs],
        "nodes": ["host-0"],
        "all": False,
    }
    assert _change(fleet.rt, admin, {"node-only-key"}) is None
