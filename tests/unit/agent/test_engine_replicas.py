"""Replicas with an image, run by the agent through a stand-in container engine: a small
script named ``podman`` (or ``docker``) that answers the engine's client commands the agent
uses and, for ``run``, execs the command with the env file's environment, as a container's
init would. No container is made. What is checked: the engine calls in their order (image
check, stale container removed, run, removed after the exit), the files handed over and
cleaned up, a missing image refused with its fix, the exit code turned into words, and a kill
sent through the engine."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import stat
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from boltforge.agent import containers as containers_module
from boltforge.agent.containers import CHECKPOINT, Engine, container_name
from boltforge.agent.outbox import Outbox
from boltforge.agent.processes import replica_paths
from boltforge.agent.runtime import AgentRuntime
from boltforge.wire.agent import ReplicaEvent, ReplicaSpec

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="replicas are Linux processes")

T = TypeVar("T")
IMAGE = "bolt/train:1"

FAKE_ENGINE = """\
#!/bin/sh
# A stand-in container engine client for the agent's tests (see the test module).
state={state}
for a in "$@"; do printf '%s\\037' "$a"; done >> "$state/calls"
printf '\\036' >> "$state/calls"
case "$1" in
image) grep -qxF -- "$3" "$state/images"; exit $? ;;
inspect) if [ -e "$state/oom" ]; then echo true; else echo false; fi; exit 0 ;;
rm) for n; do :; done; [ -e "$state/$n.pid" ]; exit $? ;;
kill) for n; do :; done; kill -s "${{3#SIG}}" "$(cat "$state/$n.pid")"; exit $? ;;
hang) exec sleep 30 ;;
run) ;;
*) exit 2 ;;
esac
shift
while [ $# -gt 0 ]; do
    case "$1" in
    --name) name=$2; shift 2 ;;
    --env-file) env_file=$2; shift 2 ;;
    *) if grep -qxF -- "$1" "$state/images"; then shift; break; fi; shift ;;
    esac
done
echo $$ > "$state/$name.pid"
exec env -i PATH="$PATH" sh -c \
    'while IFS= read -r l; do export "$l"; done < "$0"; exec "$@"' "$env_file" "$@"
"""

PRINTS_ENV = (
    "import os; print('\\n'.join(f'{k}={os.environ.get(k)}' for k in "
    "('BOLT_CHECKPOINT_DIR', 'BOLT_PROGRESS_FILE', 'HOME', 'BOLT_TOKEN', 'BOLT_JOB_ID')))"
)

IGNORES_TERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(30)
"""


class FakeEngine:
    """The stand-in engine in ``folder``: ``images`` it holds, the calls it got."""

    def __init__(self, folder: Path, kind: str = "podman", images: tuple[str, ...] = (IMAGE,)):
        self.state = folder / "engine-state"
        self.state.mkdir(parents=True)
        (self.state / "images").write_text("\n".join(images))
        self.binary = folder / "bin" / kind
        self.binary.parent.mkdir(parents=True)
        self.binary.write_text(FAKE_ENGINE.format(state=shlex.quote(str(self.state))))
        self.binary.chmod(0o755)
        self.engine = Engine(str(self.binary))

    def calls(self) -> list[list[str]]:
        path = self.state / "calls"
        if not path.exists():
            return []
        return [call.split("\x1f")[:-1] for call in path.read_text().split("\x1e")[:-1]]

    def verbs(self) -> list[str]:
        return [" ".join(c[:2]) if c[0] == "image" else c[0] for c in self.calls()]

    def saw_oom(self) -> None:
        (self.state / "oom").write_text("")


def image_spec(code: str = "print('hello from the image')", **fields: Any) -> ReplicaSpec:
    base: dict[str, Any] = {
        "replica": "j-7.1.0",
        "job": "j-7",
        "epoch": 1,
        "action": "run",
        "image": IMAGE,
        "command": [sys.executable, "-c", code],
    }
    return ReplicaSpec.model_validate({**base, **fields})


def runtime(tmp_path: Path, engine: FakeEngine | None) -> AgentRuntime:
    env = {"PATH": os.environ["PATH"], "BOLT_TOKEN": "agent-secret"}
    return AgentRuntime(
        tmp_path / "work",
        Outbox(),
        on_exit=lambda: None,
        env=env,
        engine=engine.engine if engine else None,
    )


def events(rt: AgentRuntime, kind: str) -> list[ReplicaEvent]:
    return [e for e in rt.outbox.events if e.kind == kind]


async def until(check: Callable[[], T], timeout: float = 15.0) -> T:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
    return got


def run(make: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(make(), 30)

    return asyncio.run(bounded())


def start_and_wait(rt: AgentRuntime, spec: ReplicaSpec) -> ReplicaEvent:
    async def go() -> ReplicaEvent:
        await rt.start(spec)
        [event] = await until(lambda: events(rt, "exited"))
        return event

    return run(go)


@pytest.fixture
def engine(tmp_path: Path) -> FakeEngine:
    return FakeEngine(tmp_path)


# --- a container's life ---------------------------------------------------------------------


def test_a_replica_with_an_image_runs_through_the_engine_and_is_removed_after(
    tmp_path: Path, engine: FakeEngine
) -> None:
    rt = runtime(tmp_path, engine)
    spec = image_spec(PRINTS_ENV)
    event = start_and_wait(rt, spec)
    name = container_name(spec)
    assert engine.verbs() == ["image exists", "rm", "run", "rm"]
    calls = engine.calls()
    assert calls[0] == ["image", "exists", IMAGE]
    assert calls[1] == calls[3] == ["rm", "--force", "--volumes", name]
    assert calls[2][:3] == ["run", "--name", name]
    assert event.exit_code == 0 and event.signal is None and event.detail == ""
    [started] = events(rt, "started")
    assert started.pid == event.pid


def test_the_container_sees_its_own_paths_and_not_the_agents_secrets(
    tmp_path: Path, engine: FakeEngine
) -> None:
    rt = runtime(tmp_path, engine)
    spec = image_spec(PRINTS_ENV)
    start_and_wait(rt, spec)
    rt.collect()
    out = "".join(c.data for c in rt.outbox.logs)
    assert f"BOLT_CHECKPOINT_DIR={CHECKPOINT}" in out
    assert "BOLT_PROGRESS_FILE=/bolt/progress.jsonl" in out
    assert "HOME=/scratch" in out and "BOLT_JOB_ID=j-7" in out
    assert "BOLT_TOKEN=None" in out


def test_after_the_exit_the_scratch_folder_and_env_file_go_and_the_checkpoint_stays(
    tmp_path: Path, engine: FakeEngine
) -> None:
    rt = runtime(tmp_path, engine)
    spec = image_spec()
    paths = replica_paths(rt.work_dir, spec)
    seen: dict[str, Any] = {}

    async def go() -> None:
        await rt.start(spec)
        seen["env mode"] = stat.S_IMODE(paths.env_file.stat().st_mode)
        seen["scratch"] = paths.scratch.is_dir()
        await until(lambda: events(rt, "exited"))

    run(go)
    assert seen == {"env mode": 0o600, "scratch": True}
    assert not paths.env_file.exists() and not paths.scratch.exists()
    assert paths.checkpoint.is_dir() and paths.progress.exists()


def test_docker_is_asked_with_image_inspect(tmp_path: Path) -> None:
    docker = FakeEngine(tmp_path, kind="docker")
    rt = runtime(tmp_path, docker)
    start_and_wait(rt, image_spec())
    assert docker.calls()[0] == ["image", "inspect", IMAGE]


# --- what cannot start ------------------------------------------------------------------------


def test_an_image_the_node_lacks_fails_at_once_with_the_fix(tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, images=("other:2",))
    rt = runtime(tmp_path, engine)
    run(lambda: rt.start(image_spec()))
    [failed] = events(rt, "failed")
    assert f"image {IMAGE} is not on this node and no registry is asked" in failed.detail
    assert "`podman load`, `podman build`" in failed.detail
    assert engine.verbs() == ["image exists"]  # never run, nothing pulled
    assert rt.live == {} and ("j-7.1.0", 1) in rt.finished


def test_an_image_without_a_command_fails_before_the_engine_is_asked(
    tmp_path: Path, engine: FakeEngine
) -> None:
    rt = runtime(tmp_path, engine)
    run(lambda: rt.start(image_spec(command=[])))
    [failed] = events(rt, "failed")
    assert failed.detail == "could not start: the replica has no command"
    assert engine.calls() == []


def test_an_engine_that_is_gone_reads_as_an_image_that_is_missing(tmp_path: Path) -> None:
    rt = AgentRuntime(
        tmp_path / "work", Outbox(), on_exit=lambda: None, engine=Engine("/nonexistent/podman")
    )
    run(lambda: rt.start(image_spec()))
    [failed] = events(rt, "failed")
    assert "is not on this node" in failed.detail


def test_an_engine_call_that_hangs_is_given_up(
    engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(containers_module, "ENGINE_TIMEOUT_S", 0.3)
    code, out = run(lambda: engine.engine._call("hang"))
    assert (code, out) == (-1, "")


def test_the_engine_is_found_on_the_path(
    engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(engine.binary.parent))
    found = Engine.find("podman")
    assert found.binary == str(engine.binary) and found.kind == "podman"


# --- what the exit code means -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "memory_gb", "oom", "exit_code", "sig", "words"),
    [
        pytest.param(0, 0, False, 0, None, "", id="success"),
        pytest.param(3, 0, False, 3, None, "", id="the command's own failure"),
        pytest.param(
            125,
            0,
            False,
            125,
            None,
            "the container engine could not run the container (exit 125; its log says why)",
            id="engine failure",
        ),
        pytest.param(
            127, 0, False, 127, None, "the command was not found in the image", id="no command"
        ),
        pytest.param(
            137,
            4,
            True,
            None,
            signal.SIGKILL,
            "was killed: out of memory (its limit is 4 GB). To fix: ask for more memory_gb",
            id="out of memory, as the engine saw",
        ),
        pytest.param(
            137,
            0.5,
            False,
            None,
            signal.SIGKILL,
            "out of memory, most likely (its limit is 0.5 GB)",
            id="killed with a memory limit",
        ),
        pytest.param(137, 0, False, None, signal.SIGKILL, "", id="killed without a limit"),
        pytest.param(143, 0, False, None, signal.SIGTERM, "", id="ended by SIGTERM"),
    ],
)
def test_the_containers_exit_code_is_reported_with_what_it_means(
    tmp_path: Path,
    engine: FakeEngine,
    code: int,
    memory_gb: float,
    oom: bool,
    exit_code: int | None,
    sig: int | None,
    words: str,
) -> None:
    if oom:
        engine.saw_oom()
    rt = runtime(tmp_path, engine)
    spec = image_spec(f"import sys; sys.exit({code})", memory_gb=memory_gb)
    event = start_and_wait(rt, spec)
    assert (event.exit_code, event.signal) == (exit_code, sig)
    assert words in event.detail and bool(words) == bool(event.detail)
    assert ("inspect" in engine.verbs()) is (code == 137)  # asked only for an unexplained kill


# --- stopping a container ---------------------------------------------------------------------


def test_a_container_that_ignores_the_checkpoint_signal_is_killed_through_the_engine(
    tmp_path: Path, engine: FakeEngine
) -> None:
    rt = runtime(tmp_path, engine)
    spec = image_spec(IGNORES_TERM, grace_s=30.0, memory_gb=1)
    log = replica_paths(rt.work_dir, spec).log

    async def go() -> ReplicaEvent:
        await rt.start(spec)
        await until(lambda: log.exists() and "ready" in log.read_text())
        rt.stop(spec.replica, grace_s=0)
        [event] = await until(lambda: events(rt, "exited"))
        return event

    event = run(go)
    assert ["kill", "--signal", "SIGKILL", container_name(spec)] in engine.calls()
    assert event.signal == signal.SIGKILL and event.exit_code is None
    assert event.detail == ""  # the agent killed it: not out of memory
    assert engine.verbs()[-1] == "rm"


def test_the_launch_record_and_the_spool_know_containers_like_processes(
    tmp_path: Path, engine: FakeEngine
) -> None:
    rt = runtime(tmp_path, engine)
    code = "print('trained')"
    spec = image_spec(code, outputs=["/bolt/checkpoint/model.bin", "/etc/passwd"])
    paths = replica_paths(rt.work_dir, spec)
    paths.checkpoint.mkdir(parents=True)
    (paths.checkpoint / "model.bin").write_bytes(b"weights")
    seen: list[int] = []

    async def go() -> ReplicaEvent:
        await rt.start(spec)
        seen.append(len(rt.record))
        [event] = await until(lambda: events(rt, "exited"))
        return event

    event = run(go)
    assert seen == [1] and len(rt.record) == 0
    spooled = rt.work_dir / "artifacts" / "j-7.1.0" / "bolt" / "checkpoint" / "model.bin"
    assert spooled.read_bytes() == b"weights"
    assert "output /etc/passwd is not under /scratch or /bolt/checkpoint" in event.cleanup
