"""Running the agent as a process (``serve``): its work dir, what it says when it starts, and
its exit code when the server refuses the node; and the prolog/epilog runner's answers for
scripts that die by a signal, cannot be run at all, or say too much."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_fake_server import FakeServer

from boltforge.agent.cleanup import end_group, remove_shm
from boltforge.agent.containers import Engine
from boltforge.agent.hooks import TAIL_CHARS, run_script, run_scripts
from boltforge.agent.loop import EXIT_REFUSED
from boltforge.agent.preflight import NodeHooks
from boltforge.agent.serve import default_work_dir, serve
from boltforge.wire.agent import Inventory

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the agent runs on Linux")

INVENTORY = Inventory(name="host-0", gpu="H100-80GB", gpus=8, gpu_memory_gb=80)


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer(token="the-right-token") as fake:
        yield fake


# --- serve --------------------------------------------------------------------------------------


def test_a_node_the_server_refuses_ends_the_agent_with_exit_2(
    server: FakeServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    work = tmp_path / "deep" / "work"
    prolog = script(tmp_path / "prolog.sh", "exit 0\n")
    hooks = NodeHooks(prologs=(prolog,), epilogs=(tmp_path,), timeout_s=5.0)
    caplog.set_level(logging.INFO, logger="boltforge.agent")
    code = serve(server.url, "a-wrong-token", INVENTORY, work, hooks=hooks)
    assert code == EXIT_REFUSED
    assert work.is_dir()
    assert server.registrations == []  # refused at the door: nothing registered
    said = [r.getMessage() for r in caplog.records if r.name == "boltforge.agent"]
    assert f"agent for host-0 (8 x H100-80GB) against {server.url}, work dir {work}, " in said[0]
    assert said[0].endswith("replicas with an image run nowhere (no --runtime engine)")
    assert "preflight: GPU checks skipped: the inventory is declared, not read from NVML" in said
    assert f"prolog: {prolog} (timeout 5 s)" in said
    assert f"epilog: {tmp_path} (timeout 5 s)" in said
    assert any("the server refused this node: 401 bad token" in m for m in said)


def test_the_agent_says_which_engine_runs_replicas_with_an_image(
    server: FakeServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="boltforge.agent")
    engine = Engine("/opt/bin/podman")
    assert serve(server.url, "wrong", INVENTORY, tmp_path / "w", engine=engine) == EXIT_REFUSED
    assert any(r.getMessage().endswith("run on /opt/bin/podman") for r in caplog.records)


def test_the_default_work_dir_is_per_node_under_the_users_data(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_work_dir("host-0") == tmp_path / "data" / "boltforge" / "agent" / "host-0"
    assert default_work_dir("../etc/x").name == "_etc_x"
    assert default_work_dir("../etc/x").parent == tmp_path / "data" / "boltforge" / "agent"


def test_roots_default_work_dir_is_one_its_replicas_users_can_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert default_work_dir("host-0") == Path("/var/lib/boltforge/agent/host-0")


# --- prolog and epilog scripts ----------------------------------------------------------------


def test_a_script_killed_by_a_signal_says_which(tmp_path: Path) -> None:
    dies = script(tmp_path / "dies.sh", "echo about to die; kill -9 $$\n")
    result = asyncio.run(run_script(dies, {"PATH": os.environ["PATH"]}, 10.0))
    assert not result.ok
    assert result.evidence == f"{dies} was killed by signal 9; output: about to die"


def test_a_file_that_cannot_be_executed_fails_without_raising(tmp_path: Path) -> None:
    garbage = tmp_path / "not-a-program"
    garbage.write_bytes(b"\x00\x01\x02 not an executable format")
    garbage.chmod(0o755)
    result = asyncio.run(run_script(garbage, {}, 10.0))
    assert not result.ok and result.seconds == 0.0
    assert result.evidence.startswith(f"{garbage} could not start: ")


def test_only_the_tail_of_a_long_output_is_kept_as_evidence(tmp_path: Path) -> None:
    chatty = script(
        tmp_path / "chatty.sh",
        "i=0; while [ $i -lt 400 ]; do echo line-$i; i=$((i+1)); done; echo THE-END; exit 4\n",
    )
    result = asyncio.run(run_script(chatty, {"PATH": os.environ["PATH"]}, 10.0))
    head, _, output = result.evidence.partition("; output: ")
    assert head == f"{chatty} exited with code 4"
    assert output.endswith("line-399\nTHE-END")
    assert len(output) == TAIL_CHARS and "line-0\n" not in output


def test_a_successful_script_carries_no_evidence(tmp_path: Path) -> None:
    quiet = script(tmp_path / "ok.sh", "echo fine\n")
    [result] = asyncio.run(run_scripts([quiet], {"PATH": os.environ["PATH"]}, 10.0))
    assert result.ok and result.evidence == "" and result.path == quiet


def test_nothing_to_run_gives_no_results(tmp_path: Path) -> None:
    (tmp_path / "empty.d").mkdir()
    (tmp_path / "empty.d" / "README").write_text("not executable")
    assert asyncio.run(run_scripts([tmp_path / "empty.d"], {}, 1.0)) == []


# --- cleanup where there is nothing to clean ------------------------------------------------


def test_cleanup_of_a_group_that_is_gone_or_a_missing_shm_folder_does_nothing(
    tmp_path: Path,
) -> None:
    assert asyncio.run(end_group(2**22 + 4321)) == ([], False)
    assert remove_shm("bolt-j-", set(), shm=tmp_path / "no-shm") == []
