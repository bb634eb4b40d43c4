"""A replica's declared outputs: found through its mounts, spooled, sent and dropped once the
server has them; symbolic links and paths outside the replica's own directories are never
followed."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from boltforge.agent.artifacts import Roots, collect, send_spooled
from boltforge.wire.agent import ReplicaSpec


def spec(*outputs: str, image: str | None = "localhost/train:1") -> ReplicaSpec:
    return ReplicaSpec(
        replica="7.1.0", job="7", epoch=1, action="run", image=image, outputs=list(outputs)
    )


def container_roots(tmp: Path) -> Roots:
    mounts = {"/scratch": tmp / "scratch", "/bolt/checkpoint": tmp / "ckpt"}
    for folder in mounts.values():
        folder.mkdir(parents=True, exist_ok=True)
    return Roots(mounts, "/scratch", container=True)


def spooled(spool: Path) -> dict[str, str]:
    return {p.relative_to(spool).as_posix(): p.read_text() for p in spool.rglob("*") if p.is_file()}


def test_a_containers_files_and_directories_are_spooled_by_their_declared_paths(
    tmp_path: Path,
) -> None:
    roots = container_roots(tmp_path)
    (tmp_path / "scratch" / "out" / "plots").mkdir(parents=True)
    (tmp_path / "scratch" / "out" / "model.txt").write_text("weights")
    (tmp_path / "scratch" / "out" / "plots" / "loss.csv").write_text("1,0.5")
    (tmp_path / "ckpt" / "model.npz").write_text("ckpt")
    (tmp_path / "scratch" / "metrics.json").write_text("{}")
    notes = collect(
        spec("/scratch/out", "/bolt/checkpoint/model.npz", "metrics.json", "/missing"),
        roots,
        tmp_path / "spool",
    )
    assert spooled(tmp_path / "spool") == {
        "7.1.0/scratch/out/model.txt": "weights",
        "7.1.0/scratch/out/plots/loss.csv": "1,0.5",
        "7.1.0/bolt/checkpoint/model.npz": "ckpt",
        "7.1.0/metrics.json": "{}",  # as declared: relative to its working directory
    }
    assert notes == ["output /missing is not under /scratch or /bolt/checkpoint"]


def test_links_out_of_the_replicas_directories_are_never_followed(tmp_path: Path) -> None:
    roots = container_roots(tmp_path)
    secret = tmp_path / "host-secret"
    secret.write_text("not yours")
    out = tmp_path / "scratch" / "out"
    out.mkdir()
    (out / "stolen").symlink_to(secret)
    (out / "subdir").symlink_to(tmp_path)
    (tmp_path / "scratch" / "alias").symlink_to(secret)
    (out / "real.txt").write_text("mine")
    notes = collect(spec("/scratch/out", "/scratch/alias"), roots, tmp_path / "spool")
    assert spooled(tmp_path / "spool") == {"7.1.0/scratch/out/real.txt": "mine"}
    assert notes == ["output /scratch/alias was not found"]


def test_a_process_outputs_are_under_its_working_directory(tmp_path: Path) -> None:
    (tmp_path / "work" / "out").mkdir(parents=True)
    (tmp_path / "work" / "out" / "a.txt").write_text("a")
    roots = Roots({}, str(tmp_path / "work"), container=False)
    assert collect(spec("out", image=None), roots, tmp_path / "spool") == []
    assert spooled(tmp_path / "spool") == {"7.1.0/out/a.txt": "a"}


def test_spooled_files_leave_once_sent_and_stay_while_the_server_is_away(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    for name in ("a.txt", "b.txt"):
        (spool / "7.1.0" / "out").mkdir(parents=True, exist_ok=True)
        (spool / "7.1.0" / "out" / name).write_text(name)
    sent: list[tuple[str, str, str]] = []
    up = True

    async def send(replica: str, name: str, path: Path, sha: str) -> bool:
        if not up:
            return False
        assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
        sent.append((replica, name, sha[:8]))
        return True

    up = False
    assert asyncio.run(send_spooled(spool, send)) == 0
    assert len(spooled(spool)) == 2
    up = True
    assert asyncio.run(send_spooled(spool, send)) == 2
    assert [(r, n) for r, n, _ in sent] == [("7.1.0", "out/a.txt"), ("7.1.0", "out/b.txt")]
    assert list(spool.iterdir()) == []
