"""The API fuzzed from its own OpenAPI document (schemathesis) against a real server: no
request may cause a server error or a reply that breaks the document, and the store must
hold together afterwards (no GPU held twice, every job in a known state with its history)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import BaseSchema
from schemathesis.config import SchemathesisConfig
from sqlalchemy import select

from boltforge.control.scheduling.lifecycle import ALLOWED
from boltforge.control.store.db import Database
from boltforge.control.store.invariants import double_allocations
from boltforge.control.store.models import EventRow, JobRow
from boltforge.testing.processes import LocalCluster

AGENT_PATHS = "/v1/agents/"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data = tmp_path_factory.mktemp("fuzz")
    with LocalCluster(data, hosts=0, server_args=["--min-runtime", "0", "--churn", "1"]) as c:
        headers = {"Authorization": f"Bearer {c.agent_token}"}
        for i in range(2):
            inventory = {
                "name": f"host-{i}",
                "pool": "h100",
                "gpu": "H100-80GB",
                "gpu_memory_gb": 80,
                "gpus": 8,
                "nvlink_island": 8,
                "rack": f"r{i}",
            }
            r = httpx.post(
                f"{c.url}/v1/agents/register", json={"inventory": inventory}, headers=headers
            )
            assert r.status_code == 200, r.text
        yield c


# What counts as refusing an invalid request: schemathesis's own list, and 413 (a body past
# the server's limit is refused before it is parsed). A 5xx fails the other checks.
REJECTED = [
    *("400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"),
    "5xx",
]


@pytest.fixture(scope="module")
def api(cluster: LocalCluster) -> BaseSchema:
    checks = {"negative_data_rejection": {"expected-statuses": REJECTED}}
    config = SchemathesisConfig.from_dict({"checks": checks})
    return schemathesis.openapi.from_url(f"{cluster.url}/openapi.json", config=config)


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_causes_a_server_error_or_breaks_the_document(
    case: schemathesis.Case[Any], cluster: LocalCluster
) -> None:
    if case.query and "wait" in case.query:
        case.query["wait"] = 0
    token = cluster.agent_token if case.path.startswith(AGENT_PATHS) else cluster.admin_token
    case.call_and_validate(
        headers={"Authorization": f"Bearer {token}"},
        # A job spec is free-form JSON in the document and checked by the server, so a
        # well-typed request may still be refused with 422 naming the problem.
        excluded_checks=[schemathesis.checks.positive_data_acceptance],
    )


def test_the_store_holds_together_after_fuzzing(cluster: LocalCluster, tmp_path: Path) -> None:
    db = Database(f"sqlite:///{cluster.data / 'store.db'}")
    try:
        with db.session() as s:
            assert double_allocations(s) == []
            jobs = list(s.scalars(select(JobRow)))
            queued = set(s.scalars(select(EventRow.job_id).where(EventRow.kind == "queued")))
    finally:
        db.close()
    assert all(j.state in ALLOWED for j in jobs)
    assert all(j.id in queued for j in jobs)
