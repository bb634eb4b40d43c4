"""Artifacts through the real API in-process, kept on disk and in an S3-compatible bucket
(``s3_kit``): an agent uploads a replica's output with its sha256; a mismatch keeps nothing;
another node cannot write for a replica it did not run; the job's team lists and downloads
them, other teams' members may not. A bucket that cannot be used stops the server at start,
saying why."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_kit import AGENT, Fleet, make_spec
from s3_kit import S3

from boltforge.control.jobs.artifacts import (
    BadArtifact,
    DirectoryStore,
    StoreError,
    artifact_name,
)
from boltforge.control.jobs.s3store import S3Store


@pytest.fixture(params=["directory", "s3"])
def bucket(request: pytest.FixtureRequest) -> S3 | None:
    """Where the fleet keeps artifacts: a bucket, or (None) its directory."""
    return request.getfixturevalue("s3") if request.param == "s3" else None


@pytest.fixture
def fleet(tmp_path: Path, bucket: S3 | None) -> Iterator[Fleet]:
    url = f"s3://{bucket.bucket}/bolt" if bucket else None
    with Fleet(tmp_path, artifacts_url=url, artifacts_endpoint=bucket and bucket.endpoint) as f:
        yield f


def stored(fleet: Fleet, bucket: S3 | None) -> list[str]:
    """Every file (or object) the fleet's artifact store holds."""
    if bucket is not None:
        return bucket.keys()
    assert isinstance(fleet.rt.artifacts, DirectoryStore)
    return [str(p) for p in fleet.rt.artifacts.root.rglob("*") if p.is_file()]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ran(fleet: Fleet) -> tuple[str, str, str]:
    """A job that ran one replica: its id, the replica and its node."""
    job = fleet.submit(make_spec("train", 8))
    [(node, rep)] = [(n.name, r) for n in fleet.nodes.values() for r in n.to_run()]
    return job, rep.replica, node


def upload(fleet: Fleet, node: str, replica: str, path: str, data: bytes, digest: str) -> int:
    url = f"/v1/agents/{node}/artifacts/{replica}/{path}"
    r = fleet.http.put(url, content=data, headers={**AGENT, "X-Sha256": digest})
    return int(r.status_code)


def test_an_upload_is_kept_listed_and_downloaded_with_its_sha256(fleet: Fleet) -> None:
    job, replica, node = ran(fleet)
    data = b"weights" * 1000
    assert upload(fleet, node, replica, "scratch/out/model.bin", data, sha(data)) == 201
    listed = fleet.http.get(f"/v1/jobs/{job}/artifacts", headers={"Authorization": "Bearer adm"})
    [art] = listed.json()["artifacts"]
    assert art["name"] == "0/scratch/out/model.bin"
    assert (art["size"], art["sha256"], art["replica"]) == (len(data), sha(data), replica)
    got = fleet.http.get(
        f"/v1/jobs/{job}/artifacts/0/scratch/out/model.bin",
        headers={"Authorization": "Bearer adm"},
    )
    assert got.content == data and got.headers["X-Sha256"] == sha(data)


def test_a_hash_mismatch_keeps_nothing(fleet: Fleet, bucket: S3 | None) -> None:
    job, replica, node = ran(fleet)
    assert upload(fleet, node, replica, "out.txt", b"sent", sha(b"other")) == 422
    assert fleet.rt.artifacts.list(job) == []
    assert stored(fleet, bucket) == []


def test_a_node_writes_only_for_replicas_it_ran(fleet: Fleet) -> None:
    _, replica, node = ran(fleet)
    other = next(n for n in fleet.nodes if n != node)
    assert upload(fleet, other, replica, "out.txt", b"x", sha(b"x")) == 404


def test_members_reach_only_their_teams_artifacts(fleet: Fleet) -> None:
    job, replica, node = ran(fleet)  # team research
    assert upload(fleet, node, replica, "out.txt", b"x", sha(b"x")) == 201
    tokens = {}
    for team in ("research", "vision"):
        r = fleet.post("/v1/tokens", {"name": f"m-{team}", "role": "member", "team": team})
        tokens[team] = {"Authorization": f"Bearer {r.json()['token']}"}
    mine = fleet.http.get(f"/v1/jobs/{job}/artifacts/0/out.txt", headers=tokens["research"])
    assert mine.status_code == 200 and mine.content == b"x"
    theirs = fleet.http.get(f"/v1/jobs/{job}/artifacts/0/out.txt", headers=tokens["vision"])
    assert theirs.status_code == 403
    listing = fleet.http.get(f"/v1/jobs/{job}/artifacts", headers=tokens["vision"])
    assert listing.status_code == 403


@pytest.mark.parametrize("path", ["", "/", "a/../../etc/passwd", ".."])
def test_names_never_leave_the_jobs_folder(path: str) -> None:
    with pytest.raises(BadArtifact):
        artifact_name(0, path)


def test_names_are_rank_then_path() -> None:
    assert artifact_name(3, "/scratch/./out/a.txt") == "3/scratch/out/a.txt"


def test_a_bucket_is_named_by_an_s3_url() -> None:
    with pytest.raises(StoreError, match=r"expected s3://BUCKET or s3://BUCKET/PREFIX"):
        S3Store.connect("https://bucket.example.com/x")
    with pytest.raises(StoreError, match="To fix: name the bucket"):
        S3Store.connect("s3:///prefix-only")


def test_a_bucket_that_cannot_be_reached_stops_the_server_saying_why(s3: S3) -> None:
    missing = f"{s3.bucket}-missing"
    with pytest.raises(StoreError) as e:
        S3Store.connect(f"s3://{missing}/x", s3.endpoint)
    said = str(e.value)
    assert f"bucket {missing} at {s3.endpoint} cannot be used" in said
    assert "To fix: create the bucket, or give credentials" in said


def test_the_objects_carry_their_sha256(s3: S3, tmp_path: Path) -> None:
    url = f"s3://{s3.bucket}/boltforge"
    with Fleet(tmp_path, artifacts_url=url, artifacts_endpoint=s3.endpoint) as fleet:
        job, replica, node = ran(fleet)
        data = b"checkpoint shard" * 64
        assert upload(fleet, node, replica, "out/shard.bin", data, sha(data)) == 201
    key = f"boltforge/{job}/files/0/out/shard.bin"
    head = s3.client.head_object(Bucket=s3.bucket, Key=key)
    assert head["Metadata"] == {"sha256": sha(data)} and head["ContentLength"] == len(data)
    assert s3.keys() == [key, f"boltforge/{job}/manifest.json"]
