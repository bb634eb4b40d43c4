"""Edge cases of collecting a replica's declared outputs and sending the spool: paths that
climb out of their root, how declared paths become artifact names, a second collection of
the same output, linking versus copying, and a send that stops half way."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from boltforge.agent.artifacts import CHUNK, Roots, collect, send_spooled, sha256_of
from boltforge.wire.agent import ReplicaSpec


def spec(*outputs: str, container: bool = True) -> ReplicaSpec:
    image = "localhost/train:1" if container else None
    return ReplicaSpec(
        replica="7.1.0", job="7", epoch=1, action="run", image=image, outputs=list(outputs)
    )


def container(tmp: Path, workdir: str = "/scratch") -> Roots:
    mounts = {"/scratch": tmp / "scratch", "/bolt/checkpoint": tmp / "ckpt"}
    for folder in mounts.values():
        folder.mkdir(parents=True, exist_ok=True)
    return Roots(mounts, workdir, container=True)


def process(tmp: Path) -> Roots:
    (tmp / "work").mkdir(exist_ok=True)
    return Roots({}, str(tmp / "work"), container=False)


def spooled(spool: Path) -> dict[str, str]:
    return {p.relative_to(spool).as_posix(): p.read_text() for p in spool.rglob("*") if p.is_file()}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- where a declared path is on the host -----------------------------------------------------


@pytest.mark.parametrize(
    ("declared", "host"),
    [
        pytest.param("/scratch", "scratch", id="a mount itself"),
        pytest.param("/scratch/out/a.txt", "scratch/out/a.txt", id="under a mount"),
        pytest.param("out/a.txt", "scratch/out/a.txt", id="relative: under the workdir"),
        pytest.param("/bolt/checkpoint/step-9", "ckpt/step-9", id="the checkpoint mount"),
        pytest.param("./out//a.txt", "scratch/out/a.txt", id="dots and double slashes"),
    ],
)
def test_a_containers_paths_are_read_through_its_mounts(
    tmp_path: Path, declared: str, host: str
) -> None:
    assert container(tmp_path).host_path(declared) == tmp_path / host


@pytest.mark.parametrize("declared", ["/etc/passwd", "/scratchy/x", "/bolt/other"])
def test_a_containers_paths_outside_its_mounts_are_in_its_image(
    tmp_path: Path, declared: str
) -> None:
    roots = container(tmp_path)
    assert roots.host_path(declared) is None
    notes = collect(spec(declared), roots, tmp_path / "spool")
    assert notes == [f"output {declared} is not under /scratch or /bolt/checkpoint"]


def test_a_container_with_another_workdir_has_its_relative_paths_in_the_image(
    tmp_path: Path,
) -> None:
    roots = container(tmp_path, workdir="/app")
    assert roots.host_path("out/a.txt") is None
    assert roots.host_path("/scratch/out/a.txt") == tmp_path / "scratch" / "out" / "a.txt"


def test_a_process_may_name_any_absolute_path_the_agent_can_read(tmp_path: Path) -> None:
    elsewhere = write(tmp_path / "shared" / "report.txt", "done")
    assert collect(spec(str(elsewhere), container=False), process(tmp_path), tmp_path / "s") == []
    name = "/".join(elsewhere.parts[1:])
    assert spooled(tmp_path / "s") == {f"7.1.0/{name}": "done"}


# --- nothing leaves its root -----------------------------------------------------------------


def test_a_container_path_that_climbs_out_of_its_mount_is_not_collected(tmp_path: Path) -> None:
    write(tmp_path / "host-secret", "not yours")
    roots = container(tmp_path)
    notes = collect(spec("../host-secret", "/scratch/../host-secret"), roots, tmp_path / "spool")
    assert not (tmp_path / "spool").exists()
    assert notes == [
        "output ../host-secret was not found",
        "output /scratch/../host-secret was not found",
    ]


def test_a_process_path_that_climbs_out_of_its_workdir_is_not_collected(tmp_path: Path) -> None:
    write(tmp_path / "host-secret", "not yours")
    notes = collect(spec("../host-secret", container=False), process(tmp_path), tmp_path / "s")
    assert notes == ["output ../host-secret was not found"]
    assert not (tmp_path / "s").exists()


def test_a_linked_folder_inside_the_mount_is_not_walked(tmp_path: Path) -> None:
    roots = container(tmp_path)
    write(tmp_path / "scratch" / "real" / "a.txt", "a")
    (tmp_path / "scratch" / "out").mkdir()
    (tmp_path / "scratch" / "out" / "again").symlink_to(tmp_path / "scratch" / "real")
    write(tmp_path / "scratch" / "out" / "b.txt", "b")
    assert collect(spec("/scratch/out"), roots, tmp_path / "spool") == []
    assert spooled(tmp_path / "spool") == {"7.1.0/scratch/out/b.txt": "b"}


def test_an_empty_folder_is_reported_as_not_found(tmp_path: Path) -> None:
    roots = container(tmp_path)
    (tmp_path / "scratch" / "out" / "empty").mkdir(parents=True)
    notes = collect(spec("/scratch/out"), roots, tmp_path / "spool")
    assert notes == ["output /scratch/out was not found"]


# --- the spool --------------------------------------------------------------------------------


def test_collecting_again_replaces_what_the_spool_held(tmp_path: Path) -> None:
    roots = container(tmp_path)
    source = write(tmp_path / "scratch" / "model.txt", "first")
    collect(spec("/scratch/model.txt"), roots, tmp_path / "spool")
    source.unlink()  # a new file under the same name (not the same inode)
    write(source, "second")
    collect(spec("/scratch/model.txt"), roots, tmp_path / "spool")
    assert spooled(tmp_path / "spool") == {"7.1.0/scratch/model.txt": "second"}


def test_a_file_is_linked_into_the_spool_not_copied(tmp_path: Path) -> None:
    roots = container(tmp_path)
    source = write(tmp_path / "scratch" / "big.bin", "x" * 1000)
    collect(spec("/scratch/big.bin"), roots, tmp_path / "spool")
    target = tmp_path / "spool" / "7.1.0" / "scratch" / "big.bin"
    assert target.stat().st_ino == source.stat().st_ino


def test_a_file_that_cannot_be_linked_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cross_device(src: object, dst: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    roots = container(tmp_path)
    source = write(tmp_path / "scratch" / "big.bin", "payload")
    collect(spec("/scratch/big.bin"), roots, tmp_path / "spool")
    target = tmp_path / "spool" / "7.1.0" / "scratch" / "big.bin"
    assert target.read_text() == "payload"
    assert target.stat().st_ino != source.stat().st_ino


def test_a_send_that_fails_half_way_keeps_the_rest_for_the_next_try(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    for replica in ("a.1.0", "b.1.0"):
        for name in ("x/1.txt", "x/2.txt"):
            write(spool / replica / name, f"{replica}:{name}")
    (spool / "stray-file").write_text("not a replica's folder")
    sent: list[str] = []

    async def send(replica: str, name: str, path: Path, sha: str) -> bool:
        if (replica, name) == ("b.1.0", "x/2.txt"):
            return False
        assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
        sent.append(f"{replica}/{name}")
        return True

    assert asyncio.run(send_spooled(spool, send)) == 3
    assert sent == ["a.1.0/x/1.txt", "a.1.0/x/2.txt", "b.1.0/x/1.txt"]
    assert spooled(spool) == {
        "b.1.0/x/2.txt": "b.1.0:x/2.txt",
        "stray-file": "not a replica's folder",
    }
    assert not (spool / "a.1.0").exists()  # emptied folders go


def test_a_spool_that_was_never_made_sends_nothing(tmp_path: Path) -> None:
    async def never(replica: str, name: str, path: Path, sha: str) -> bool:
        raise AssertionError("nothing to send")

    assert asyncio.run(send_spooled(tmp_path / "missing", never)) == 0


def test_a_files_checksum_covers_all_of_it(tmp_path: Path) -> None:
    data = os.urandom(CHUNK * 2 + 17)
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_of(path) == hashlib.sha256(data).hexdigest()
    path.write_bytes(b"")
    assert sha256_of(path) == hashlib.sha256(b"").hexdigest()
