"""``GET /metrics`` on the real server app in-process: a fleet with a dead and a cordoned
node runs, preempts and queues jobs, and every series is checked against what the API says
about the same jobs and nodes. Also: the Grafana dashboard only asks for exported series."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, Fleet, make_spec
from prometheus_client.parser import text_string_to_metric_families

from boltforge.control.scheduling.lifecycle import ALLOWED
from boltforge.control.store.models import NodeRow
from boltforge.spec.teams import Budget

DASHBOARD = Path(__file__).resolve().parents[4] / "deploy" / "grafana-dashboard.json"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(fleet: Fleet) -> Samples:
    """Every sample of an unauthenticated scrape, by name and labels."""
    r = fleet.http.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def tick(fleet: Fleet, seconds: int, silent: tuple[str, ...] = ()) -> None:
    """Let ``seconds`` pass, every node but the ``silent`` ones heartbeating as agents do."""
    for _ in range(seconds // 2):
        fleet.clock.advance(2)
        for node in fleet.nodes.values():
            if node.name not in silent:
                node.heartbeat()


def jobs(fleet: Fleet) -> list[dict[str, Any]]:
    """Every job, whatever its state, as ``bolt queue`` lists it."""
    r = fleet.http.get("/v1/jobs", params={"state": ",".join(ALLOWED)}, headers=ADMIN)
    listed: list[dict[str, Any]] = r.json()["jobs"]
    return listed


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Six 8-GPU nodes: host-4 goes silent until it is dead, host-5 is cordoned; team
    research has a budget."""
    with Fleet(tmp_path, hosts=6, budgets={"research": Budget(monthly=1000.0)}) as f:
        with f.rt.db.session() as s:
            node = s.get(NodeRow, "host-5")
            assert node is not None
            node.cordoned = True
        tick(f, 20, silent=("host-4",))
        f.settle()
        yield f


def preempted_fleet(fleet: Fleet) -> dict[str, str]:
    """``low`` (32 GPUs) runs, ``high`` (16) preempts it; ``low`` requeues; two more wait."""
    ids = {"low": fleet.submit(make_spec("low", 32, priority="low"))}
    fleet.start_everything()
    tick(fleet, 60)
    ids["high"] = fleet.submit(make_spec("high", 16, team="nlp", priority="high"))
    assert fleet.job(ids["low"]).state == "preempting"
    both = scrape(fleet)  # high's replicas wait on GPUs low's still hold: counted once
    assert value(both, "bolt_gpus", pool="h100", state="allocated") == 32
    fleet.stop_everything()
    fleet.start_everything()
    tick(fleet, 4)
    ids["w1"] = fleet.submit(make_spec("w1", 32, team="nlp", priority="normal"))
    ids["w2"] = fleet.submit(make_spec("w2", 24, priority="normal"))
    return ids


def test_a_scrape_reports_capacity_queue_jobs_nodes_and_preemption_exactly(
    fleet: Fleet,
) -> None:
    ids = preempted_fleet(fleet)
    m = scrape(fleet)
    # hosts 0-3 and the cordoned host-5 are live; dead host-4 is not capacity
    assert value(m, "bolt_gpus", pool="h100", state="total") == 40
    assert value(m, "bolt_gpus", pool="h100", state="allocated") == 16
    assert value(m, "bolt_utilization_allocated_ratio", pool="h100") == pytest.approx(0.4)
    nodes = {s: value(m, "bolt_nodes", state=s) for s in ("ready", "suspect", "dead", "cordoned")}
    assert nodes == {"ready": 4, "suspect": 0, "dead": 1, "cordoned": 1}
    # free: hosts 2-3 whole (16), host-4 dead (8), host-5 cordoned (8)
    assert value(m, "bolt_fragmentation_index", pool="h100") == pytest.approx(0.5)

    listed = jobs(fleet)
    waiting = [j for j in listed if j["state"] in ("pending", "requeued")]
    assert {(j["priority_name"], j["team"]) for j in waiting} == {
        ("low", "research"),
        ("normal", "nlp"),
        ("normal", "research"),
    }
    for j in waiting:
        labels = {"priority_class": j["priority_name"], "team": j["team"]}
        assert value(m, "bolt_queue_depth", **labels) == 1
    assert sum(v for (n, _), v in m.items() if n == "bolt_queue_depth") == len(waiting)
    held = sum(j["gpus"] for j in listed if j["state"] in ("scheduled", "running"))
    assert held == 16
    states = {j["state"] for j in listed}
    for state in ("pending", "requeued", "running", "succeeded", "failed", "cancelled"):
        expected = sum(j["state"] == state for j in listed)
        assert value(m, "bolt_jobs", state=state) == expected, state
    assert states == {"pending", "requeued", "running"}

    assert value(m, "bolt_preemptions_total") == 1
    [evicted] = [e for e in fleet.job(ids["low"]).events if e.kind == "preempted"]
    assert evicted.data["lost_gpu_s"] == 32 * (60 + 60)  # 60 s unsaved + 60 s restart
    assert value(m, "bolt_gpu_hours_lost_total") == pytest.approx(32 * 120 / 3600)
    assert value(m, "bolt_time_to_schedule_seconds_count") == 2  # low and high
    assert value(m, "bolt_time_to_schedule_seconds_bucket", le="0.001") == 2


def test_time_to_schedule_counts_each_jobs_first_placement_once_however_often_scraped(
    fleet: Fleet,
) -> None:
    preempted_fleet(fleet)
    scrape(fleet)
    tick(fleet, 100)
    high = next(j for j in jobs(fleet) if j["name"] == "high")
    fleet.finish(high["id"])
    fleet.start_everything()
    scrape(fleet)
    m = scrape(fleet)

    waits = []
    for j in jobs(fleet):
        placed = [e for e in fleet.job(j["id"]).events if e.kind == "placed"]
        if placed:
            waits.append(placed[0].at - j["submitted_at"])
    assert len(waits) == 3  # low, high, and one of the 32-GPU jobs once high finished
    assert sorted(waits)[-1] >= 100
    assert value(m, "bolt_time_to_schedule_seconds_count") == len(waits)
    assert value(m, "bolt_time_to_schedule_seconds_sum") == pytest.approx(sum(waits))
    for le in ("0.001", "60.0", "300.0", "+Inf"):
        within = sum(w <= float(le) for w in waits)
        assert value(m, "bolt_time_to_schedule_seconds_bucket", le=le) == within, le
    assert value(m, "bolt_preemptions_total") == 1


def test_metrics_need_no_token_name_no_job_or_user_and_stay_out_of_the_api_document(
    fleet: Fleet,
) -> None:
    r = fleet.post("/v1/tokens", {"name": "alice", "role": "member", "team": "research"})
    alice = {"Authorization": f"Bearer {r.json()['token']}"}
    job = fleet.submit(make_spec("secret-experiment", 8), alice)
    assert fleet.job(job).user == "alice"
    text = fleet.http.get("/metrics").text
    assert "bolt_jobs" in text
    assert "secret-experiment" not in text and "alice" not in text
    assert "/metrics" not in fleet.http.get("/openapi.json").json()["paths"]


def test_two_servers_in_one_process_keep_their_own_metrics(fleet: Fleet, tmp_path: Path) -> None:
    fleet.submit(make_spec("one", 8))
    with Fleet(tmp_path / "other", hosts=2) as other:
        assert value(scrape(other), "bolt_gpus", pool="h100", state="allocated") == 0
        assert value(scrape(other), "bolt_time_to_schedule_seconds_count") == 0
    assert value(scrape(fleet), "bolt_gpus", pool="h100", state="allocated") == 8


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    assert any(v["type"] == "datasource" for v in board["templating"]["list"])
    variables = [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])] + variables


def test_every_dashboard_panel_asks_for_series_the_server_exports(fleet: Fleet) -> None:
    preempted_fleet(fleet)
    exported = {name for name, _ in scrape(fleet)}
    exprs = dashboard_exprs()
    assert len(exprs) >= 7
    for expr in exprs:
        named = {word for word in _words(expr) if word.startswith("bolt_")}
        assert named, expr
        assert named <= exported, (expr, named - exported)


def _words(expr: str) -> list[str]:
    word = "".join(c if c.isalnum() or c == "_" else " " for c in expr)
    return word.split()
