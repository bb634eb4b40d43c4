"""The Slurm commands the bridge runs, against stand-in ``sinfo``/``squeue``/``scontrol``/
``sbatch``/``scancel`` scripts on ``PATH`` that record their arguments and answer what the
test says: which arguments each call passes, how answers are filtered to the managed
partitions, and how a failing, silent or hanging command is reported."""

from __future__ import annotations

import asyncio
import json
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from slurm_builders import sinfo_node, squeue_job

from boltforge.slurm.commands import Slurm, SlurmError

T = TypeVar("T")
COMMANDS = ("sinfo", "squeue", "scontrol", "sbatch", "scancel", "runuser")
# Each stand-in appends its name, the SLURM_CONF it saw and its arguments, NUL-separated, as
# one record ended by \x1e; then answers with the files <name>.out/.err/.rc, or hangs.
FAKE = """#!/bin/sh
d="$FAKE_SLURM_DIR"
n=$(basename "$0")
printf '%s\\0' "$n" "${SLURM_CONF-unset}" "$@" >> "$d/calls"
printf '\\036' >> "$d/calls"
env > "$d/$n.env"
[ -f "$d/$n.hang" ] && exec sleep 30
[ -f "$d/$n.out" ] && cat "$d/$n.out"
[ -f "$d/$n.err" ] && cat "$d/$n.err" >&2
[ -f "$d/$n.rc" ] && exit "$(cat "$d/$n.rc")"
exit 0
"""


class Stand:
    """The stand-in commands' folder: what they answer and what they were asked."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def answer(self, command: str, out: str = "", err: str = "", rc: int = 0) -> None:
        (self.root / f"{command}.out").write_text(out)
        (self.root / f"{command}.err").write_text(err)
        (self.root / f"{command}.rc").write_text(str(rc))

    def answer_json(self, command: str, data: Any) -> None:
        self.answer(command, json.dumps(data))

    def hang(self, command: str) -> None:
        (self.root / f"{command}.hang").write_text("")

    def calls(self) -> list[list[str]]:
        """Each call as [command, SLURM_CONF, *arguments]."""
        path = self.root / "calls"
        if not path.exists():
            return []
        records = path.read_bytes().split(b"\x1e")[:-1]
        return [r.decode().split("\0")[:-1] for r in records]

    def args(self) -> list[list[str]]:
        return [[c[0], *c[2:]] for c in self.calls()]


@pytest.fixture
def stand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Stand:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in COMMANDS:
        script = bin_dir / name
        script.write_text(FAKE.replace("$FAKE_SLURM_DIR", str(tmp_path)))  # env is not passed
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return Stand(tmp_path)


def run(call: Callable[[], Awaitable[T]]) -> T:
    async def go() -> T:
        return await call()

    return asyncio.run(go())


# --- reading the cluster ------------------------------------------------------------------


def test_nodes_asks_sinfo_for_the_partitions_and_keeps_only_nodes_serving_them(
    stand: Stand,
) -> None:
    stand.answer_json(
        "sinfo",
        {
            "nodes": [
                sinfo_node(name="n1", partitions=["bolt"]),
                sinfo_node(name="n2", partitions=["debug"]),
                sinfo_node(name="n3", partitions=["debug", "gpu"]),
            ]
        },
    )
    nodes = run(lambda: Slurm().nodes(["bolt", "gpu"]))
    assert [n.name for n in nodes] == ["n1", "n3"]
    assert stand.args() == [["sinfo", "--json", "-p", "bolt,gpu"]]


def test_jobs_asks_squeue_for_every_state_and_keeps_only_managed_partitions(
    stand: Stand,
) -> None:
    stand.answer_json(
        "squeue",
        {
            "jobs": [
                squeue_job(job_id=1, partition="bolt"),
                squeue_job(job_id=2, partition="debug"),
                squeue_job(job_id=3, partition="bolt", job_state="COMPLETED"),
            ]
        },
    )
    jobs = run(lambda: Slurm().jobs(["bolt"]))
    assert [(j.id, j.state) for j in jobs] == [("1", "PENDING"), ("3", "COMPLETED")]
    assert stand.args() == [["squeue", "--json", "--states=all", "-p", "bolt"]]


def test_a_cluster_without_jobs_or_nodes_reads_as_empty(stand: Stand) -> None:
    stand.answer_json("squeue", {"meta": {}, "errors": []})
    stand.answer_json("sinfo", {"nodes": []})
    assert run(lambda: Slurm().jobs(["bolt"])) == []
    assert run(lambda: Slurm().nodes(["bolt"])) == []


@pytest.mark.parametrize("answer", ["[]", '"ok"', "3"], ids=["a list", "a string", "a number"])
def test_json_that_is_not_an_object_is_a_slurm_error(stand: Stand, answer: str) -> None:
    stand.answer("squeue", answer)
    with pytest.raises(SlurmError, match="squeue --json gave no object"):
        run(lambda: Slurm().jobs(["bolt"]))


def test_output_that_is_not_json_is_a_slurm_error_the_bridge_retries(stand: Stand) -> None:
    stand.answer("squeue", "squeue: error: Invalid --json")
    with pytest.raises(SlurmError, match="squeue --json printed no JSON") as caught:
        run(lambda: Slurm().jobs(["bolt"]))
    assert "Invalid --json" in str(caught.value)  # what it printed, for the log


def test_the_cluster_configuration_is_passed_as_slurm_conf(stand: Stand) -> None:
    stand.answer_json("sinfo", {"nodes": []})
    run(lambda: Slurm("/etc/bolt/slurm.conf").nodes(["bolt"]))
    run(lambda: Slurm().nodes(["bolt"]))
    assert [c[1] for c in stand.calls()] == ["/etc/bolt/slurm.conf", "unset"]


# --- acting on jobs -----------------------------------------------------------------------


def test_start_on_pins_the_nodes_makes_the_job_eligible_now_then_releases_it(
    stand: Stand,
) -> None:
    run(lambda: Slurm().start_on("41", ["n2", "n1"]))
    assert stand.args() == [
        ["scontrol", "update", "JobId=41", "NodeList=n2,n1", "StartTime=now"],
        ["scontrol", "release", "41"],
    ]


def test_a_failed_pin_does_not_release_the_job(stand: Stand) -> None:
    stand.answer("scontrol", err="Invalid node name specified\n", rc=1)
    with pytest.raises(SlurmError, match="scontrol update JobId=41: Invalid node name"):
        run(lambda: Slurm().start_on("41", ["nx"]))
    assert [c[1] for c in stand.args()] == ["update"]  # never reached `scontrol release`


def test_submit_held_asks_for_whole_nodes_and_returns_the_job_id(stand: Stand) -> None:
    stand.answer("sbatch", "1234;cluster\n")
    sid = run(lambda: Slurm().submit_held("bolt", 2, 8, "bolt-9", "echo hi\nexit 0", "/work"))
    assert sid == "1234"
    assert stand.args() == [
        [
            "sbatch",
            "--parsable",
            "--hold",
            "--partition=bolt",
            "--nodes=2",
            "--ntasks-per-node=1",
            "--job-name=bolt-9",
            "--gres=gpu:8",
            "--chdir=/work",
            "--wrap=echo hi\nexit 0",
        ]
    ]


def test_submit_held_as_a_user_runs_sbatch_through_runuser_without_the_bridges_secrets(
    stand: Stand, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sbatch copies its environment into the job: the bridge's token must not be in it."""
    monkeypatch.setenv("BOLT_TOKEN", "adm-secret")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/test.conf")
    stand.answer("runuser", "55\n")
    as_nlp = ["runuser", "-u", "bolt-nlp", "--"]
    sid = run(lambda: Slurm().submit_held("bolt", 1, 0, "bolt-3", "true", "/h", as_user=as_nlp))
    assert sid == "55"
    (call,) = stand.calls()
    assert call[0] == "runuser" and call[1] == "/etc/slurm/test.conf"
    assert call[2:7] == ["-u", "bolt-nlp", "--", "sbatch", "--parsable"]
    seen = (stand.root / "runuser.env").read_text()
    assert "adm-secret" not in seen and "BOLT_TOKEN" not in seen


def test_submit_held_of_a_cpu_job_without_a_workdir_asks_no_gres_or_chdir(stand: Stand) -> None:
    stand.answer("sbatch", "77\n")
    assert run(lambda: Slurm().submit_held("bolt", 1, 0, "bolt-3", "true", None)) == "77"
    (call,) = stand.args()
    assert not any(a.startswith(("--gres", "--chdir")) for a in call)


@pytest.mark.parametrize(
    ("act", "expect"),
    [
        pytest.param(
            lambda s: s.signal("5"), ["scancel", "--signal=TERM", "--full", "5"], id="signal all"
        ),
        pytest.param(
            lambda s: s.signal("5", "USR1", full=False),
            ["scancel", "--signal=USR1", "5"],
            id="signal the steps only",
        ),
        pytest.param(
            lambda s: s.requeue_held("5"), ["scontrol", "requeuehold", "5"], id="requeue held"
        ),
        pytest.param(lambda s: s.hold("5"), ["scontrol", "hold", "5"], id="hold"),
        pytest.param(lambda s: s.cancel("5"), ["scancel", "5"], id="cancel"),
        pytest.param(
            lambda s: s.comment("5", "boltforge: waiting (#2 in line): capacity"),
            ["scontrol", "update", "JobId=5", "Comment=boltforge: waiting (#2 in line): capacity"],
            id="comment, spaces kept in one argument",
        ),
        pytest.param(
            lambda s: s.admin_comment("5", "boltforge job=9"),
            ["scontrol", "update", "JobId=5", "AdminComment=boltforge job=9"],
            id="admin comment",
        ),
    ],
)
def test_each_action_runs_one_command_with_these_arguments(
    stand: Stand, act: Callable[[Slurm], Awaitable[None]], expect: list[str]
) -> None:
    slurm = Slurm()
    run(lambda: act(slurm))
    assert stand.args() == [expect]


# --- failures -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("out", "err", "rc", "says"),
    [
        pytest.param("", "scancel: error: Kill job error on job id 5\n", 1,
                     "scancel: error: Kill job error on job id 5",
                     id="stderr is the message"),
        pytest.param("Job is not held\n", "", 1, "Job is not held", id="else stdout"),
        pytest.param("", "", 3, "exit 3", id="else the exit status"),
    ],
)  # fmt: skip
def test_a_failing_command_raises_what_it_said(
    stand: Stand, out: str, err: str, rc: int, says: str
) -> None:
    stand.answer("scancel", out, err, rc)
    with pytest.raises(SlurmError) as caught:
        run(lambda: Slurm().cancel("5"))
    assert str(caught.value) == f"scancel 5: {says}"


def test_a_command_that_hangs_is_killed_and_reported(stand: Stand) -> None:
    stand.hang("squeue")
    with pytest.raises(SlurmError, match=r"^squeue did not answer in 0.2s$"):
        run(lambda: Slurm(timeout_s=0.2).jobs(["bolt"]))


def test_a_missing_command_is_an_os_error_the_bridge_retries(
    stand: Stand, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(OSError):
        run(lambda: Slurm().hold("5"))


def test_the_way_out_reads_every_job_and_clears_a_pending_jobs_pin_with_its_words(
    stand: Stand,
) -> None:
    stand.answer_json("squeue", {"jobs": [squeue_job(job_id=1, partition="debug")]})
    assert [j.id for j in run(lambda: Slurm().all_jobs())] == ["1"]
    run(lambda: Slurm().unpin("1", pending=True))
    run(lambda: Slurm().unpin("2", pending=False))
    assert stand.args()[1:] == [
        [
            "scontrol",
            "update",
            "JobId=1",
            "NodeList=",
            "StartTime=now",
            "Comment=",
            "AdminComment=",
        ],
        ["scontrol", "update", "JobId=2", "Comment=", "AdminComment="],
    ]
