"""A replica as a container: the engine's command line, the environment it is given, what its
exit code means, and the GPUs passed in. The real engine runs these in
``tests/integration/test_containers.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from boltforge.agent.containers import (
    CHECKPOINT,
    PROGRESS,
    SCRATCH,
    Engine,
    EngineMissing,
    container_env,
    container_name,
    exit_fields,
    exit_words,
    gpu_devices,
    needs_network,
    write_env_file,
)
from boltforge.agent.processes import ReplicaPaths
from boltforge.agent.ulimits import ulimit_args
from boltforge.wire.agent import ReplicaSpec

IMAGE = "registry.acme.com/train:1"


def replica(**fields: object) -> ReplicaSpec:
    base: dict[str, object] = {
        "replica": "j-7.2.0",
        "job": "j-7",
        "epoch": 2,
        "action": "run",
        "command": ["python3", "train.py"],
        "image": IMAGE,
        "gpus": [2, 3],
    }
    return ReplicaSpec.model_validate({**base, **fields})


def files(tmp: Path) -> ReplicaPaths:
    return ReplicaPaths(
        tmp / "r.log", tmp / "p.jsonl", tmp / "ckpt", tmp / "scratch", tmp / "r.env"
    )


def option(argv: list[str], name: str) -> list[str]:
    """Every value given to ``name`` in ``argv``."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


def test_the_run_line_isolates_and_limits_the_container(tmp_path: Path) -> None:
    spec = replica(cpus=4, memory_gb=16)
    argv = Engine("podman").run_argv(spec, "bolt-x", files(tmp_path), [])
    assert argv[:2] == ["podman", "run"]
    assert argv[-3:] == [IMAGE, "python3", "train.py"]
    for flag in ("--init", "--read-only"):
        assert flag in argv
    assert option(argv, "--user") == ["65534:65534"]
    assert option(argv, "--cap-drop") == ["all"]
    assert option(argv, "--security-opt") == ["no-new-privileges"]
    assert option(argv, "--pull") == ["never"]
    assert option(argv, "--network") == ["none"]
    assert option(argv, "--cpus") == ["4"]
    assert option(argv, "--memory") == option(argv, "--memory-swap") == ["16384m"]
    assert option(argv, "--pids-limit") == ["4096"]
    assert option(argv, "--ulimit") == ulimit_args(4096)[1::2]
    assert option(argv, "--volume") == [
        f"{tmp_path / 'scratch'}:{SCRATCH}:rw",
        f"{tmp_path / 'ckpt'}:{CHECKPOINT}:rw",
        f"{tmp_path / 'p.jsonl'}:{PROGRESS}:rw",
    ]
    assert option(argv, "--env-file") == [str(tmp_path / "r.env")]
    assert option(argv, "--workdir") == [SCRATCH]


def test_unasked_limits_are_left_off_and_a_gang_gets_the_hosts_network(tmp_path: Path) -> None:
    spec = replica(env={"WORLD_SIZE": "16", "MASTER_ADDR": "10.0.0.1"}, cwd="/work")
    argv = Engine("docker").run_argv(spec, "bolt-x", files(tmp_path), ["/dev/nvidia2"])
    assert "--cpus" not in argv and "--memory" not in argv
    assert option(argv, "--network") == ["host"]
    assert option(argv, "--device") == ["/dev/nvidia2"]
    assert option(argv, "--workdir") == ["/work"]


@pytest.mark.parametrize(
    ("world", "network"), [(None, False), ("1", False), ("2", True), ("many", True)]
)
def test_only_a_gang_of_more_than_one_rank_needs_the_network(
    world: str | None, network: bool
) -> None:
    env = {} if world is None else {"WORLD_SIZE": world}
    assert needs_network(replica(env=env)) is network


def test_container_names_are_per_replica_and_epoch() -> None:
    assert container_name(replica()) == "bolt-j-7.2.0-e2"
    assert container_name(replica(replica="a/b c", epoch=3)) == "bolt-a_b_c-e3"


def test_the_container_gets_the_jobs_environment_not_the_agents() -> None:
    base = {
        "PATH": "/usr/bin",
        "AWS_SECRET_ACCESS_KEY": "agent-only",
        "BOLT_JOB_ID": "j-7",
        "BOLT_CHECKPOINT_DIR": "/var/lib/host/ckpt",
        "BOLT_PROGRESS_FILE": "/var/lib/host/p.jsonl",
    }
    env = container_env(replica(env={"RANK": "0"}), base, devices=[])
    assert "AWS_SECRET_ACCESS_KEY" not in env and "PATH" not in env
    assert env["RANK"] == "0" and env["BOLT_JOB_ID"] == "j-7"
    assert env["BOLT_CHECKPOINT_DIR"] == CHECKPOINT and env["BOLT_PROGRESS_FILE"] == PROGRESS
    assert env["HOME"] == env["TMPDIR"] == SCRATCH
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"  # no devices passed: the node's indices


def test_gpus_passed_through_are_numbered_from_zero_inside() -> None:
    env = container_env(replica(), {}, devices=["nvidia.com/gpu=2", "nvidia.com/gpu=3"])
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_gpus_go_in_by_cdi_when_the_node_has_a_spec(tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    assert gpu_devices([1, 5], tmp_path, (cdi,)) == ["nvidia.com/gpu=1", "nvidia.com/gpu=5"]


def test_gpus_go_in_as_device_files_without_cdi(tmp_path: Path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    none = (tmp_path / "no-cdi",)
    assert gpu_devices([1], tmp_path, none) == [
        str(tmp_path / "nvidia1"),
        str(tmp_path / "nvidiactl"),
        str(tmp_path / "nvidia-uvm"),
    ]
    assert gpu_devices([4], tmp_path, none) == []  # declared but not driven here
    assert gpu_devices([], tmp_path, none) == []


def test_the_env_file_is_the_agents_alone_and_refuses_line_breaks(tmp_path: Path) -> None:
    path = tmp_path / "env" / "r.env"
    write_env_file(path, {"A": "1", "B": "x=y"})
    assert path.read_text() == "A=1\nB=x=y\n"
    assert os.stat(path).st_mode & 0o777 == 0o600
    with pytest.raises(ValueError, match="C holds a line break"):
        write_env_file(path, {"C": "two\nlines"})


@pytest.mark.parametrize(
    ("code", "fields"),
    [(0, (0, None)), (3, (3, None)), (137, (None, 9)), (143, (None, 15)), (-9, (None, 9))],
)
def test_exit_codes_past_128_are_signals(code: int, fields: tuple[int | None, ...]) -> None:
    assert exit_fields(code) == fields


def test_exit_words_tell_out_of_memory_and_engine_failures() -> None:
    assert "out of memory (its limit is 0.25 GB)" in exit_words(137, False, 0.25, oom=True)
    guessed = exit_words(137, False, 0.25, oom=False)
    assert "out of memory, most likely" in guessed and "more memory_gb" in guessed
    assert exit_words(137, True, 0.25, oom=False) == ""  # the agent killed it
    assert exit_words(137, False, 0, oom=False) == ""  # no limit: something else killed it
    assert exit_words(0, False, 0.25, oom=False) == ""
    assert "not found in the image" in exit_words(127, False, 0, oom=False)
    assert "could not run the container" in exit_words(125, False, 0, oom=False)


def test_a_missing_engine_names_the_option_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(EngineMissing, match="--runtime podman: `podman` is not on this node"):
        Engine.find("podman")
