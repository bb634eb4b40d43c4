"""The artifact store on disk (``jobs/artifacts.py``), without a server: an upload is kept
only when its sha256 matches, a refused or broken upload leaves the earlier artifact and no
stray file, a later epoch replaces an earlier one, and no job id or path leaves the root."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest

from boltforge.control.jobs import artifacts
from boltforge.control.jobs.artifacts import ArtifactStore, BadArtifact, artifact_name
from boltforge.wire.jobs import Artifact


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def stream(parts: Iterable[bytes], fail_after: int | None = None) -> AsyncIterator[bytes]:
    """``parts`` as an upload's chunks; the client goes away after ``fail_after`` of them."""
    for i, part in enumerate(parts):
        if fail_after is not None and i == fail_after:
            raise ConnectionResetError("the agent went away")
        yield part


def put(
    store: ArtifactStore,
    data: bytes,
    name: str = "0/out/model.pt",
    job: str = "7",
    epoch: int = 1,
    digest: str | None = None,
    parts: int = 3,
) -> Artifact:
    size = max(1, len(data) // parts)
    chunks = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
    return asyncio.run(
        store.put(
            job,
            f"{job}.{epoch}.0",
            epoch,
            name,
            sha(data) if digest is None else digest,
            stream(chunks),
        )
    )


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "artifacts")


# -- keeping an upload -----------------------------------------------------------------------


def test_an_upload_is_kept_with_its_size_hash_replica_and_epoch(store: ArtifactStore) -> None:
    data = b"weights " * 1000
    kept = put(store, data, epoch=2)
    assert (kept.name, kept.size, kept.sha256, kept.replica, kept.epoch) == (
        "0/out/model.pt",
        len(data),
        sha(data),
        "7.2.0",
        2,
    )
    assert store.list("7") == [kept]
    found = store.find("7", "0/out/model.pt")
    assert found is not None
    artifact, path = found
    assert artifact == kept and path.read_bytes() == data
    assert files_under(store.root) == ["7/files/0/out/model.pt", "7/manifest.json"]


def test_the_manifest_lists_every_artifact_by_name(store: ArtifactStore) -> None:
    put(store, b"b", name="1/b.txt")
    put(store, b"a", name="0/a.txt")
    put(store, b"c", name="0/z/c.txt")
    names = [a["name"] for a in json.loads((store.root / "7" / "manifest.json").read_text())]
    assert names == ["0/a.txt", "0/z/c.txt", "1/b.txt"]
    assert [a.name for a in store.list("7")] == names


def test_an_empty_file_is_an_artifact_too(store: ArtifactStore) -> None:
    kept = put(store, b"")
    assert (kept.size, kept.sha256) == (0, sha(b""))


def test_a_later_epoch_replaces_the_same_artifact(store: ArtifactStore) -> None:
    put(store, b"first run", epoch=1)
    later = put(store, b"second run, longer", epoch=3)
    assert store.list("7") == [later]
    found = store.find("7", "0/out/model.pt")
    assert found is not None and found[1].read_bytes() == b"second run, longer"


def test_jobs_keep_their_artifacts_apart(store: ArtifactStore) -> None:
    put(store, b"seven", job="7")
    put(store, b"eight", job="8")
    assert [a.sha256 for a in store.list("7")] == [sha(b"seven")]
    assert [a.sha256 for a in store.list("8")] == [sha(b"eight")]


def test_a_job_with_no_artifacts_lists_none_and_finds_nothing(store: ArtifactStore) -> None:
    assert store.list("99") == []
    assert store.find("99", "0/x") is None
    put(store, b"x")
    assert store.find("7", "0/other") is None


# -- refusing an upload ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "digest",
    ["", "abc", "A" * 64, "g" * 64, "0" * 63, "0" * 65],
    ids=["empty", "short", "uppercase", "not hex", "63 digits", "65 digits"],
)
def test_a_hash_that_is_not_a_sha256_is_refused_before_anything_is_written(
    store: ArtifactStore, digest: str
) -> None:
    with pytest.raises(BadArtifact, match="must be the file's sha256 as 64 lowercase hex"):
        put(store, b"data", digest=digest)
    assert not store.root.exists()


def test_a_mismatch_keeps_nothing_new_and_the_earlier_artifact_stays(store: ArtifactStore) -> None:
    first = put(store, b"good weights", epoch=1)
    wrong = sha(b"something else")
    with pytest.raises(BadArtifact) as refused:
        put(store, b"corrupted in transit", epoch=2, digest=wrong)
    said = str(refused.value)
    assert f"({sha(b'corrupted in transit')}) is not the one sent ({wrong})" in said
    assert "nothing was kept. To fix: send it again" in said
    assert store.list("7") == [first]
    found = store.find("7", "0/out/model.pt")
    assert found is not None and found[1].read_bytes() == b"good weights"
    assert files_under(store.root) == ["7/files/0/out/model.pt", "7/manifest.json"]


def test_an_upload_past_the_size_limit_is_refused_and_leaves_no_file(
    store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifacts, "MAX_BYTES", 10)
    with pytest.raises(BadArtifact, match="an artifact may hold at most"):
        put(store, b"x" * 11, parts=11)
    assert store.list("7") == []
    assert files_under(store.root) == []
    put(store, b"x" * 10)  # at the limit is fine
    assert [a.size for a in store.list("7")] == [10]


def test_an_upload_cut_off_midway_leaves_no_file(store: ArtifactStore) -> None:
    async def cut() -> Artifact:
        return await store.put("7", "7.1.0", 1, "0/a", sha(b"abc"), stream([b"a", b"b", b"c"], 2))

    with pytest.raises(ConnectionResetError):
        asyncio.run(cut())
    assert files_under(store.root) == []


# -- names and folders -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rank", "path", "name"),
    [
        (0, "out/model.pt", "0/out/model.pt"),
        (2, "/abs/out.txt", "2/abs/out.txt"),
        (1, "./a/./b", "1/a/b"),
        (5, "a//b/", "5/a/b"),
        (0, "...", "0/..."),  # three dots is a name, not a way up
    ],
)
def test_an_artifacts_name_is_its_rank_then_its_path_normalized(
    rank: int, path: str, name: str
) -> None:
    assert artifact_name(rank, path) == name


@pytest.mark.parametrize("path", [".", "./", "a/..", "../x", "a/../../x", "/.."])
def test_a_path_that_names_no_file_under_its_root_is_refused(path: str) -> None:
    with pytest.raises(BadArtifact, match=r"must name a file under its root, without \.\."):
        artifact_name(0, path)


@pytest.mark.parametrize(
    ("job", "folder"),
    [("7", "7"), ("../../etc", "_.._etc"), ("a/b", "a_b"), ("...", "_"), ("", "_"), ("7_0", "7_0")],
    ids=["plain", "climbing", "a slash", "only dots", "empty", "an array task"],
)
def test_a_job_id_never_makes_a_folder_outside_the_root(
    store: ArtifactStore, job: str, folder: str
) -> None:
    put(store, b"x", job=job)
    assert files_under(store.root) == [f"{folder}/files/0/out/model.pt", f"{folder}/manifest.json"]
    assert [a.sha256 for a in store.list(job)] == [sha(b"x")]
