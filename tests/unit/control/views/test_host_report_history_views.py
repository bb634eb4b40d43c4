"""The console's smaller views: a host's health in words and its GPUs' samples
(``fleetmap.py``), simulation report folders (``simreports.py``), the utilization history
(``utilization.History``), and which jobs get a deadline outlook (``outlook.py``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_builders import get_json, make_token
from control_kit import Fleet, make_spec

from boltforge.control.outlook import has_outlook, verdict, with_outlook
from boltforge.control.store.models import NodeRow
from boltforge.control.views import simreports
from boltforge.control.views.fleetmap import health_words
from boltforge.control.views.utilization import History
from boltforge.core.queueing.deadlines import Outlook
from boltforge.wire.console import UtilSample
from boltforge.wire.jobs import JobDetail

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def node(**extra: Any) -> NodeRow:
    """A live node row (not stored) heard from 3 s ago; ``extra`` overrides columns."""
    values: dict[str, Any] = {
        "name": "gpu-1",
        "inventory": {"gpu": "H100-80GB"},
        "pool": "h100",
        "pod": "p0",
        "rack": "r0",
        "gpus": 8,
        "state": "ready",
        "cordoned": False,
        "registered_at": NOW - 100,
        "last_heartbeat": NOW - 3.0,
        "reclaim_at": None,
        "degraded_until": None,
        "health": {},
    }
    values.update(extra)
    return NodeRow(**values)


# -- a host's health in words ----------------------------------------------------------------

HEALTH = [
    pytest.param({}, False, ["last heartbeat 3.0 s ago"], id="healthy"),
    pytest.param({"last_heartbeat": None}, False, ["no heartbeat yet"], id="never-heard"),
    pytest.param(
        {"last_heartbeat": NOW + 5.0}, False, ["last heartbeat 0.0 s ago"], id="clock-skew"
    ),
    pytest.param(
        {"state": "suspect"},
        False,
        ["last heartbeat 3.0 s ago", "suspect: its lease ran out; dead if it stays silent"],
        id="suspect",
    ),
    pytest.param(
        {"state": "dead", "last_heartbeat": NOW - 90.25},
        False,
        ["last heartbeat 90.2 s ago", "dead: its jobs were requeued to resume elsewhere"],
        id="dead",
    ),
    pytest.param(
        {"cordoned": True},
        False,
        ["last heartbeat 3.0 s ago", "cordoned: takes no new work"],
        id="cordoned",
    ),
    pytest.param(
        {"reclaim_at": NOW + 120.0, "cordoned": True},
        False,
        [
            "last heartbeat 3.0 s ago",
            "cordoned: takes no new work",
            "spot reclaim notice: gone at 2027-01-15 08:02:00 UTC",
        ],
        id="reclaimed",
    ),
    pytest.param(
        {"degraded_until": NOW + 3600.0},
        True,
        [
            "last heartbeat 3.0 s ago",
            "degraded: single-host work only; a straggler was found here "
            "(until 2027-01-15 09:00:00 UTC)",
        ],
        id="straggler",
    ),
    pytest.param(
        {"degraded_until": NOW - 1.0, "health": {"degraded": "ecc errors"}},
        True,
        ["last heartbeat 3.0 s ago", "degraded: single-host work only; agent says so"],
        id="agent-flag",
    ),
]


@pytest.mark.parametrize(("columns", "degraded", "words"), HEALTH)
def test_a_hosts_health_reads_as_sentences(
    columns: dict[str, Any], degraded: bool, words: list[str]
) -> None:
    assert health_words(node(**columns), degraded, NOW) == words


def test_every_trouble_at_once_is_listed_in_a_fixed_order() -> None:
    row = node(state="suspect", cordoned=True, reclaim_at=NOW, degraded_until=NOW + 60)
    words = health_words(row, True, NOW)
    assert [w.split(":")[0].split(" ")[0] for w in words] == [
        "last",
        "suspect",
        "cordoned",
        "spot",
        "degraded",
    ]


# -- a host's GPUs as the console shows them -------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("hosts"), hosts=2) as f:
        yield f


def test_each_gpu_shows_its_nvml_sample_and_unsampled_ones_show_none(fleet: Fleet) -> None:
    samples = [
        {"index": 0, "util_pct": 87.5, "memory_used_mib": 40960.0},
        {"index": 3, "util_pct": 0.0, "memory_used_mib": 1234.0},
    ]
    assert fleet.nodes["host-1"].heartbeat(gpus=samples) == 200
    slots = get_json(fleet, "/v1/console/hosts/host-1")["slots"]
    assert [s["index"] for s in slots] == list(range(8))
    assert (slots[0]["utilization"], slots[0]["memory_used_gb"]) == (0.875, 40.0)
    assert (slots[3]["utilization"], slots[3]["memory_used_gb"]) == (0.0, 1.21)
    assert all(slots[i]["utilization"] is None for i in (1, 2, 4, 5, 6, 7))


def test_a_member_sees_which_team_holds_a_gpu_but_not_the_job(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("theirs", 8, team="vision"))
    where = fleet.job(job).placement[0].node
    nlp = make_token(fleet, "nina", "member", "nlp")
    host = get_json(fleet, f"/v1/console/hosts/{where}", nlp)
    assert {(s["team"], s["job"], s["rank"]) for s in host["slots"]} == {("vision", None, None)}
    assert (host["jobs"], host["job_list"], host["gpus_used"]) == ([], [], 8)
    admin = get_json(fleet, f"/v1/console/hosts/{where}")
    assert {s["job"] for s in admin["slots"]} == {job}
    fleet.post(f"/v1/jobs/{job}/cancel", {})


# -- simulation report folders ---------------------------------------------------------------


def write(root: Path, name: str, summary: Any, plots: tuple[str, ...] = ()) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    text = summary if isinstance(summary, str) else json.dumps(summary)
    (folder / simreports.SUMMARY).write_text(text)
    for plot in plots:
        (folder / plot).write_bytes(b"\x89PNG fake")
    return folder


def aged(folder: Path, at: float) -> None:
    os.utime(folder / simreports.SUMMARY, (at, at))


def test_a_missing_reports_folder_lists_nothing(tmp_path: Path) -> None:
    assert simreports.listing(tmp_path / "absent") == []


def test_reports_are_listed_newest_first_and_unreadable_ones_left_out(tmp_path: Path) -> None:
    aged(write(tmp_path, "old", {"title": "Old run", "policies": {"b": {}, "a": {}}}), 1000.0)
    aged(write(tmp_path, "new", {}), 2000.0)
    write(tmp_path, "broken", "{not json")
    write(tmp_path, "listy", [1, 2])
    (tmp_path / "no-summary").mkdir()
    (tmp_path / "stray.json").write_text("{}")
    listed = simreports.listing(tmp_path)
    assert [(r.name, r.title, r.policies) for r in listed] == [
        ("new", "new", []),  # no title: the folder's name
        ("old", "Old run", ["a", "b"]),
    ]
    assert [r.created_at for r in listed] == [2000.0, 1000.0]


@pytest.mark.parametrize(
    ("content", "words"),
    [("{not json", "summary.json is unreadable"), ("[1, 2]", "summary.json is not an object")],
)
def test_opening_an_unreadable_report_names_it_and_the_problem(
    tmp_path: Path, content: str, words: str
) -> None:
    write(tmp_path, "bad", content)
    with pytest.raises(simreports.ReportError, match=f"report bad: {words}"):
        simreports.report(tmp_path, "bad")


def test_opening_a_report_that_is_not_there_says_how_to_write_one(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for root, name in ((tmp_path, "nope"), (tmp_path, "empty"), (tmp_path / "gone", "x")):
        with pytest.raises(simreports.ReportError) as e:
            simreports.report(root, name)
        assert f"no report {name} in {root}" in str(e.value)
        assert f"To fix: write one with `bolt simulate ... --report {root / name}`" in str(e.value)


def test_a_table_is_built_from_the_policies_plain_figures_only(tmp_path: Path) -> None:
    policies = {
        "fifo": {"jobs": 10, "util": 0.5, "note": "x", "ok": True, "teams": {"a": 1}},
        "fair": {"jobs": 12, "extra": None},
    }
    write(tmp_path, "r", {"title": "T", "command": "bolt simulate x", "policies": policies})
    out = simreports.report(tmp_path, "r")
    assert out.columns == [
        ("policy", "Policy"),
        ("jobs", "jobs"),
        ("note", "note"),
        ("util", "util"),
    ]
    assert out.rows == [
        {"policy": "fifo", "jobs": "10", "note": "x", "util": "0.5"},
        {"policy": "fair", "jobs": "12", "note": "", "util": ""},
    ]
    assert (out.title, out.command, out.files) == ("T", "bolt simulate x", [])


def test_a_written_table_is_shown_as_text(tmp_path: Path) -> None:
    table = {"columns": [["p", "Policy"], ["n", 3]], "rows": [{"p": "fifo", "n": 1.5}]}
    write(tmp_path, "t", {"table": table}, plots=("b.png", "a.png"))
    (tmp_path / "t" / "notes.txt").write_text("not a plot")
    out = simreports.report(tmp_path, "t")
    assert out.columns == [("p", "Policy"), ("n", "3")]
    assert out.rows == [{"p": "fifo", "n": "1.5"}]
    assert out.files == ["a.png", "b.png"]  # plots only, sorted
    assert out.title == "t" and out.command == ""


@pytest.mark.parametrize("file", ["notes.txt", "c.png", "../t/a.png", simreports.SUMMARY])
def test_only_a_reports_own_plots_are_served(tmp_path: Path, file: str) -> None:
    write(tmp_path, "t", {}, plots=("a.png",))
    (tmp_path / "t" / "notes.txt").write_text("x")
    assert simreports.plot(tmp_path, "t", "a.png") == tmp_path / "t" / "a.png"
    with pytest.raises(simreports.ReportError, match=f"report t has no plot {file}"):
        simreports.plot(tmp_path, "t", file)


# -- the utilization history -----------------------------------------------------------------


def point(at: float) -> UtilSample:
    return UtilSample(at=at, gpus=8, allocated=4, compute=4, productive=2, fragmentation=0.1)


def test_the_history_keeps_the_last_window_of_samples_in_order() -> None:
    history = History(every_s=5.0, keep_s=20.0)  # four samples
    for i in range(7):
        history.add(point(100.0 + 5 * i))
    assert [p.at for p in history.since(0.0)] == [115.0, 120.0, 125.0, 130.0]
    assert [p.at for p in history.since(125.0)] == [125.0, 130.0]  # from ``at`` on
    assert history.since(131.0) == []


def test_a_history_shorter_than_one_sample_still_keeps_the_latest() -> None:
    history = History(every_s=60.0, keep_s=1.0)
    history.add(point(1.0))
    history.add(point(2.0))
    assert [p.at for p in history.since(0.0)] == [2.0]


# -- which jobs get a deadline outlook -------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "spec", "gets"),
    [
        ("pending", {"deadline": "2027-01-16T00:00:00Z"}, True),
        ("requeued", {"time_limit": "1h"}, True),
        ("running", {"time_limit": "1h"}, True),
        ("scheduled", {"deadline": "x", "time_limit": "2h"}, True),
        ("preempting", {"time_limit": "1h"}, False),  # on its way back to the queue
        ("pending", {}, False),
        ("pending", {"deadline": None, "time_limit": None}, False),
        ("succeeded", {"time_limit": "1h"}, False),
        ("cancelled", {"deadline": "2027-01-16T00:00:00Z"}, False),
    ],
)
def test_only_live_jobs_with_a_deadline_or_time_limit_get_an_outlook(
    state: str, spec: dict[str, Any], gets: bool
) -> None:
    assert has_outlook(state, spec) is gets


def test_a_job_without_an_outlook_never_reads_the_world() -> None:
    job = JobDetail(
        id="1", name="n", team="t", user="u", priority=2, priority_name="normal",
        state="succeeded", gpus=8, replicas=1, submitted_at=0.0, spec={"time_limit": "1h"},
    )  # fmt: skip

    def world_at(now: float) -> Any:
        raise AssertionError("the world was read for a finished job")

    assert with_outlook(job, world_at, NOW) is job


@pytest.mark.parametrize(
    ("deadline", "reachable", "word"),
    [
        (None, True, None),
        (NOW, None, "unknown"),
        (NOW, True, "reachable"),
        (NOW, False, "not reachable"),
    ],
)
def test_the_verdict_in_words(
    deadline: float | None, reachable: bool | None, word: str | None
) -> None:
    outlook = Outlook(
        at=NOW,
        deadline=deadline,
        reachable=reachable,
        start=NOW,
        finish=NOW + 1,
        slack=None,
        gap="",
        message="",
    )
    assert verdict(outlook) == word
