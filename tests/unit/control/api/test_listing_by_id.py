"""Listing named jobs (``GET /v1/jobs?ids=``): how the Slurm bridge and the Kubernetes
scheduler follow their own jobs, however many other jobs the server holds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cli_app_kit import app_client
from control_kit import ADMIN, Fleet, make_spec

from boltforge import client as client_module
from boltforge.control.api.jobs import MAX_LISTED_IDS


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("listing"), hosts=1) as f:
        yield f


@pytest.fixture(scope="module")
def queued(fleet: Fleet) -> list[str]:
    """Four 8-GPU jobs on one 8-GPU host: the first runs, the rest wait, in this order."""
    return [fleet.submit(make_spec(f"j{i}", 8)) for i in range(4)]


def listed(fleet: Fleet, ids: str) -> list[str]:
    r = fleet.http.get("/v1/jobs", params={"ids": ids}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return [j["id"] for j in r.json()["jobs"]]


def test_a_listing_by_ids_holds_only_those_jobs_in_queue_order(
    fleet: Fleet, queued: list[str]
) -> None:
    assert listed(fleet, f"{queued[3]}, {queued[0]},unknown") == [queued[0], queued[3]]
    assert listed(fleet, "") == queued  # no ids: every live job


def test_too_many_ids_are_refused_naming_the_field_and_the_limit(fleet: Fleet) -> None:
    ids = ",".join(f"j{i}" for i in range(MAX_LISTED_IDS + 1))
    r = fleet.http.get("/v1/jobs", params={"ids": ids}, headers=ADMIN)
    assert r.status_code == 422, r.text
    [problem] = r.json()["problems"]
    assert problem["field"] == "ids" and f"at most {MAX_LISTED_IDS}" in problem["message"]


def test_the_client_asks_for_more_ids_than_one_listing_takes_in_batches(
    fleet: Fleet, queued: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "LISTED_IDS", 3)  # so the four jobs span batches
    absent = [f"gone-{i}" for i in range(MAX_LISTED_IDS)]
    got = app_client(fleet, "adm").jobs(ids=[*queued, *absent])
    assert [j.id for j in got.jobs] == queued
    waiting = app_client(fleet, "adm").jobs("pending", ids=queued)
    assert [j.id for j in waiting.jobs] == queued[1:]
