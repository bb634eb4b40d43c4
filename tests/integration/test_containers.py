"""Containerized jobs on a real engine: a ``bolt server`` and one ``bolt agent --runtime
podman`` (then ``--runtime docker``, on a Docker engine of the tests' own) on loopback,
running the example training image built locally (``deploy/images/build.sh``). A training
container is preempted and resumes from its checkpoint; a container past its memory limit is
killed and its job says so; a container sees neither another job's files nor its processes,
nor the network; a missing image fails the job at once; an agent killed while a container ran
ends and removes it when it starts again; outputs come back as artifacts. Skipped where an
engine cannot run, unless BOLT_REQUIRE_CONTAINERS=1 (CI)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controlplane import Plane, bolt, control_plane, isolated_env

from boltforge.agent.containers import Engine, container_name
from boltforge.agent.outbox import Outbox
from boltforge.agent.runtime import AgentRuntime
from boltforge.testing.containers import (
    TRAIN_IMAGE,
    build_train_image,
    containers_conf,
    docker_daemon,
    docker_problem,
    engine_problem,
)
from boltforge.testing.processes import wait_until
from boltforge.wire.agent import ReplicaSpec
from boltforge.wire.jobs import JobDetail

TRAIN = "python3 /opt/boltforge/train.py"


def unusable(problem: str | None) -> None:
    """Skip for ``problem`` (an engine that cannot run here), or fail where one is required."""
    if problem is None:
        return
    if os.environ.get("BOLT_REQUIRE_CONTAINERS") == "1":
        raise RuntimeError(f"a container engine is required here: {problem}")
    pytest.skip(problem)


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """podman set up for this host (in the environment) and the training image built."""
    env = containers_conf(tmp_path_factory.mktemp("podman"))
    unusable(engine_problem(env))
    build_train_image(env)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        yield


@pytest.fixture(scope="module")
def docker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A Docker engine of this module's own (its client pointed at it in the environment)
    and the training image built on it."""
    unusable(docker_problem())
    with docker_daemon(tmp_path_factory.mktemp("docker")) as env:
        build_train_image(env, "docker")
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            yield


@pytest.fixture(scope="module", params=["podman", "docker"])
def engine(request: pytest.FixtureRequest) -> str:
    """The engine the module's agents run containers on, ready (podman, then docker)."""
    kind: str = request.param
    request.getfixturevalue(kind)
    return kind


@pytest.fixture(scope="module")
def server(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """A server that preempts at once, with one 8-GPU host whose agent runs ``engine``."""
    home = tmp_path_factory.mktemp(f"forge-{engine}")
    with control_plane(home, "--min-runtime", "0", "--churn", "1") as p:
        p.add_agents(1, args=("--runtime", engine))
        yield p


@pytest.fixture
def plane(server: Plane) -> Iterator[Plane]:
    """The module's server; every job is cancelled after the test."""
    yield server
    with server.client() as c:
        for job in c.jobs().jobs:
            c.cancel(job.id)
        wait_until(lambda: not c.jobs().jobs, 60, "the queue to empty")


def submit(plane: Plane, tmp: Path, name: str, body: str) -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(f"name: {name}\nteam: research\n{body}")
    run = plane.bolt("submit", str(path), "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    job: str = json.loads(run.stdout)["job"]["id"]
    return job


def detail(plane: Plane, job: str) -> JobDetail:
    with plane.client() as c:
        return c.job(job)


def ended(plane: Plane, job: str, timeout: float = 120.0) -> JobDetail:
    done = ("succeeded", "failed", "cancelled")
    wait_until(lambda: detail(plane, job).state in done, timeout, f"job {job} to end")
    return detail(plane, job)


def logs(plane: Plane, job: str) -> str:
    return plane.bolt("logs", job).stdout


def messages(d: JobDetail) -> str:
    return "\n".join(e.message for e in d.events)


def test_a_training_container_is_preempted_and_resumes_from_its_checkpoint(
    plane: Plane, tmp_path: Path
) -> None:
    train = f"{TRAIN} --steps 100000 --step-time 0.02 --checkpoint-every 100000 --print-every 20"
    low = submit(
        plane, tmp_path, "low", f"priority: low\ngpus: 8\nimage: {TRAIN_IMAGE}\ncommand: {train}\n"
    )
    wait_until(lambda: "step 40" in logs(plane, low), 120, "the low job to train")
    high_body = f"priority: high\ngpus: 8\nimage: {TRAIN_IMAGE}\n"
    high = submit(plane, tmp_path, "high", high_body + 'command: python3 -c "print(42)"\n')
    assert ended(plane, high).state == "succeeded"
    assert logs(plane, high).split() == ["42"]
    wait_until(lambda: "resumed from step" in logs(plane, low), 120, "the low job to resume")
    out = logs(plane, low)
    stopped = int(out.split("preempted at step ")[1].split(",")[0])
    assert f"resumed from step {stopped}" in out
    story = messages(detail(plane, low))
    assert "checkpointed in" in story and "resumed" in story


def test_a_container_past_its_memory_limit_is_killed_and_the_job_says_so(
    plane: Plane, tmp_path: Path
) -> None:
    grab = 'python3 -c "x = bytearray(1 << 30); print(len(x))"'
    job = submit(
        plane, tmp_path, "hog", f"gpus: 1\nmemory_gb: 0.25\nimage: {TRAIN_IMAGE}\ncommand: {grab}\n"
    )
    d = ended(plane, job)
    assert d.state == "failed"
    assert "out of memory" in messages(d) and "0.25 GB" in messages(d)


def test_a_container_sees_no_other_jobs_files_processes_or_network(
    plane: Plane, tmp_path: Path
) -> None:
    marker = "secret-holder-7f3a"
    holder_cmd = (
        "sh -c 'echo s3cret > /bolt/checkpoint/weights; echo s3cret > /scratch/data; "
        f'exec python3 -c "import time; time.sleep(600)" {marker}\''
    )
    holder = submit(
        plane, tmp_path, "holder", f"gpus: 4\nimage: {TRAIN_IMAGE}\ncommand: {holder_cmd}\n"
    )
    wait_until(lambda: detail(plane, holder).state == "running", 60, "the holder to run")
    holder_ckpt = plane.home / "checkpoints" / holder
    wait_until(lambda: (holder_ckpt / "weights").exists(), 60, "the holder's checkpoint")
    port = plane.url.rsplit(":", 1)[1]
    body = f"gpus: 4\nimage: {TRAIN_IMAGE}\ncommand: [python3, -c, {json.dumps(PROBE)}]\n"
    body += f"env: {{HOLDER_CKPT: '{holder_ckpt}', MARKER: {marker}, PORT: '{port}'}}\n"
    prober = submit(plane, tmp_path, "prober", body)
    d = ended(plane, prober)
    said = logs(plane, prober)
    assert d.state == "succeeded", said + messages(d)
    facts: dict[str, Any] = json.loads(said.strip().splitlines()[-1])
    assert facts["uid"] == 65534
    assert facts["root_writable"] is False
    assert facts["marker_seen"] is False
    assert facts["holder_checkpoint_visible"] is False
    assert facts["own_checkpoint"] == []
    assert facts["network"].startswith("refused")
    assert facts["processes"] <= 3  # init, python and nothing of the host's


PROBE = """
import json, os, socket
pids = [p for p in os.listdir('/proc') if p.isdigit()]
def cmdline(p):
    try:
        return open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace')
    except OSError:
        return ''
try:
    open('/etc/probe', 'w')
    writable = True
except OSError:
    writable = False
try:
    socket.create_connection(('127.0.0.1', int(os.environ['PORT'])), timeout=2).close()
    net = 'reached the server'
except OSError as e:
    net = f'refused: {e}'
print(json.dumps({
    'uid': os.getuid(),
    'root_writable': writable,
    'processes': len(pids),
    'marker_seen': any(os.environ['MARKER'] in cmdline(p) for p in pids),
    'holder_checkpoint_visible': os.path.exists(os.environ['HOLDER_CKPT']),
    'own_checkpoint': sorted(os.listdir('/bolt/checkpoint')),
    'network': net,
}))
"""


def test_a_missing_image_fails_the_job_at_once(plane: Plane, tmp_path: Path) -> None:
    job = submit(
        plane, tmp_path, "ghost", 'gpus: 1\nimage: localhost/absent:1\ncommand: ["true"]\n'
    )
    d = ended(plane, job, 60)
    assert d.state == "failed"
    assert "image localhost/absent:1 is not on this node" in messages(d)


CHECKPOINTS_ON_SIGTERM = """
import signal, sys, time
def bye(*_):
    open('/bolt/checkpoint/saved', 'w').write('x')
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
open('/bolt/checkpoint/ready', 'w').write('x')
while True:
    time.sleep(0.05)
"""


def containers_named(engine: str, name: str) -> list[str]:
    run = subprocess.run(
        [engine, "ps", "--all", "--filter", f"name=^{name}$", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return run.stdout.split()


def test_an_agent_killed_while_a_container_ran_ends_and_removes_it_when_it_starts_again(
    engine: str, tmp_path: Path
) -> None:
    work, ckpt = tmp_path / "agent", tmp_path / "ckpt"
    one = ReplicaSpec(
        replica="9.1.0",
        job="9",
        epoch=1,
        action="run",
        image=TRAIN_IMAGE,
        command=["python3", "-c", CHECKPOINTS_ON_SIGTERM],
        checkpoint_dir=str(ckpt),
        grace_s=20,
    )
    client = Engine.find(engine)

    async def start() -> None:  # the agent's run, which then dies without a word
        first = AgentRuntime(work, Outbox(), on_exit=lambda: None, engine=client)
        await first.start(one)
        first.record.renewed(time.time() + 60)  # its lease had a minute left
        first.cancel_tasks()

    asyncio.run(start())
    wait_until(lambda: (ckpt / "ready").exists(), 60, "the container to start")
    assert containers_named(engine, container_name(one)) == [container_name(one)]
    again = AgentRuntime(work, Outbox(), on_exit=lambda: None, engine=client)
    assert asyncio.run(again.end_leftovers(max_grace_s=20)) == 1
    assert (ckpt / "saved").exists()  # it got the checkpoint signal through the engine
    assert containers_named(engine, container_name(one)) == []
    [event] = list(again.outbox.events)
    assert event.kind == "exited" and event.by_node
    assert not (work / "scratch").exists() or not any((work / "scratch").iterdir())


def test_a_jobs_outputs_come_back_as_artifacts_with_matching_checksums(
    plane: Plane, tmp_path: Path
) -> None:
    write = (
        "sh -c 'mkdir -p /scratch/out && head -c 300000 /dev/urandom > /scratch/out/model.bin "
        "&& echo done > /scratch/out/log.txt && echo 7 > /bolt/checkpoint/step'"
    )
    body = f"gpus: 1\nimage: {TRAIN_IMAGE}\ncommand: {json.dumps(write)}\n"
    body += "outputs: [/scratch/out, /bolt/checkpoint/step]\n"
    job = submit(plane, tmp_path, "makes", body)
    assert ended(plane, job).state == "succeeded"
    names = ["0/bolt/checkpoint/step", "0/scratch/out/log.txt", "0/scratch/out/model.bin"]

    def listed() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = json.loads(plane.bolt("artifacts", job, "--json").stdout)[
            "artifacts"
        ]
        return out

    wait_until(lambda: len(listed()) == 3, 60, "the artifacts to arrive")
    assert [a["name"] for a in listed()] == names
    got = plane.bolt("artifacts", job, "--out", str(tmp_path / "got"))
    assert got.returncode == 0, got.stdout + got.stderr
    for a in listed():
        data = (tmp_path / "got" / a["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == a["sha256"] and len(data) == a["size"]
    assert (tmp_path / "got" / "0/scratch/out/log.txt").read_text() == "done\n"
    assert (tmp_path / "got" / "0/scratch/out/model.bin").stat().st_size == 300_000


def test_the_forge_demo_runs_the_three_classes_with_the_bill(podman: None) -> None:
    run = bolt("demo", "--forge", env=isolated_env(Path(tempfile.mkdtemp())), timeout=400)
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert "job.image: is required: this server runs containerized work only" in out
    for said in (
        "forge-train: succeeded on host-",
        "node class gpu (pool h100): it asks for GPUs",
        "forge-batch: succeeded on cpu-0; node class cpu (pool batch)",
        "forge-pipeline: succeeded on store-0; node class storage (pool data): it asks for "
        "500 GB of local storage",
        "artifact 0/scratch/manifest.json",
        "VCPU-H",
    ):
        assert said in out, out
