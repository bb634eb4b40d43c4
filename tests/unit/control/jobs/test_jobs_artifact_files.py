"""The artifact stores (``jobs/artifacts.py``: on disk, and in an S3-compatible bucket), without
a server: an upload is kept only when its sha256 matches, a refused or broken upload leaves the
earlier artifact and no stray file, a later epoch replaces an earlier one, and no job id or
path leaves the root. Every test runs on both stores (the bucket is ``s3_kit``'s)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest
from s3_kit import S3

from boltforge.control.jobs import artifacts
from boltforge.control.jobs.artifacts import (
    ArtifactStore,
    BadArtifact,
    DirectoryStore,
    artifact_name,
)
from boltforge.control.jobs.s3store import S3Store
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


class Kept:
    """A store under test and what it holds: the stored files (directory) or objects (bucket)
    by name under its root, and any temporary file an upload left."""

    def __init__(self, store: ArtifactStore, tmp: Path, s3: S3 | None) -> None:
        self.store, self.tmp, self.s3 = store, tmp, s3

    def files(self) -> list[str]:
        """What the store holds, relative to its root; an S3 store's spool must be empty."""
        if self.s3 is None:
            root = self.tmp / "artifacts"
            return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        assert list((self.tmp / "spool").iterdir()) == []
        return self.s3.keys("bolt/")

    def read(self, job: str, name: str) -> bytes:
        found = self.store.open(job, name)
        assert found is not None
        return b"".join(found[1])

    def manifest(self, job: str) -> list[dict[str, object]]:
        if self.s3 is None:
            raw = (self.tmp / "artifacts" / job / "manifest.json").read_bytes()
        else:
            key = f"bolt/{job}/manifest.json"
            raw = self.s3.client.get_object(Bucket=self.s3.bucket, Key=key)["Body"].read()
        data: list[dict[str, object]] = json.loads(raw)
        return data


@pytest.fixture(params=["directory", "s3"])
def kept(request: pytest.FixtureRequest, tmp_path: Path) -> Kept:
    if request.param == "directory":
        return Kept(DirectoryStore(tmp_path / "artifacts"), tmp_path, None)
    bucket: S3 = request.getfixturevalue("s3")
    (tmp_path / "spool").mkdir()
    store = S3Store(bucket.client, bucket.bucket, "bolt", spool=tmp_path / "spool")
    return Kept(store, tmp_path, bucket)


@pytest.fixture
def store(kept: Kept) -> ArtifactStore:
    return kept.store


# -- keeping an upload -----------------------------------------------------------------------


def test_an_upload_is_kept_with_its_size_hash_replica_and_epoch(
    store: ArtifactStore, kept: Kept
) -> None:
    data = b"weights " * 1000
    stored = put(store, data, epoch=2)
    assert (stored.name, stored.size, stored.sha256, stored.replica, stored.epoch) == (
        "0/out/model.pt",
        len(data),
        sha(data),
        "7.2.0",
        2,
    )
    assert store.list("7") == [stored]
    assert store.find("7", "0/out/model.pt") == stored
    assert kept.read("7", "0/out/model.pt") == data
    assert kept.files() == ["7/files/0/out/model.pt", "7/manifest.json"]


def test_the_manifest_lists_every_artifact_by_name(store: ArtifactStore, kept: Kept) -> None:
    put(store, b"b", name="1/b.txt")
    put(store, b"a", name="0/a.txt")
    put(store, b"c", name="0/z/c.txt")
    names = [a["name"] for a in kept.manifest("7")]
    assert names == ["0/a.txt", "0/z/c.txt", "1/b.txt"]
    assert [a.name for a in store.list("7")] == names


def test_an_empty_file_is_an_artifact_too(store: ArtifactStore) -> None:
    kept = put(store, b"")
    assert (kept.size, kept.sha256) == (0, sha(b""))


def test_a_later_epoch_replaces_the_same_artifact(store: ArtifactStore, kept: Kept) -> None:
    put(store, b"first run", epoch=1)
    later = put(store, b"second run, longer", epoch=3)
    assert store.list("7") == [later]
    assert kept.read("7", "0/out/model.pt") == b"second run, longer"


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
    store: ArtifactStore, kept: Kept, digest: str
) -> None:
    with pytest.raises(BadArtifact, match="must be the file's sha256 as 64 lowercase hex"):
        put(store, b"data", digest=digest)
    assert kept.files() == []


def test_a_mismatch_keeps_nothing_new_and_the_earlier_artifact_stays(
    store: ArtifactStore, kept: Kept
) -> None:
    first = put(store, b"good weights", epoch=1)
    wrong = sha(b"something else")
    with pytest.raises(BadArtifact) as refused:
        put(store, b"corrupted in transit", epoch=2, digest=wrong)
    said = str(refused.value)
    assert f"({sha(b'corrupted in transit')}) is not the one sent ({wrong})" in said
    assert "nothing was kept. To fix: send it again" in said
    assert store.list("7") == [first]
    assert kept.read("7", "0/out/model.pt") == b"good weights"
    assert kept.files() == ["7/files/0/out/model.pt", "7/manifest.json"]


def test_an_upload_past_the_size_limit_is_refused_and_leaves_no_file(
    store: ArtifactStore, kept: Kept, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifacts, "MAX_BYTES", 10)
    with pytest.raises(BadArtifact, match="an artifact may hold at most"):
        put(store, b"x" * 11, parts=11)
    assert store.list("7") == []
    assert kept.files() == []
    put(store, b"x" * 10)  # at the limit is fine
    assert [a.size for a in store.list("7")] == [10]


def test_an_upload_cut_off_midway_leaves_no_file(store: ArtifactStore, kept: Kept) -> None:
    async def cut() -> Artifact:
        return await store.put("7", "7.1.0", 1, "0/a", sha(b"abc"), stream([b"a", b"b", b"c"], 2))

    with pytest.raises(ConnectionResetError):
        asyncio.run(cut())
    assert kept.files() == []


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
    store: ArtifactStore, kept: Kept, job: str, folder: str
) -> None:
    put(store, b"x", job=job)
    assert kept.files() == [f"{folder}/files/0/out/model.pt", f"{folder}/manifest.json"]
    assert [a.sha256 for a in store.list(job)] == [sha(b"x")]
