"""The Python client rides out a store outage: a submission answered 503 is sent again with
the same idempotency key, saying that it waits, until the store is back (the job is made
once) or ``retry_for`` runs out (the 503 is raised)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_kit import ADMIN, Fleet, make_spec
from store_outage_kit import away

from boltforge.client import ApiFailure, Client
from boltforge.wire.jobs import SubmitReply, SubmitRequest


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path, hosts=2) as f:
        yield f


def client_of(fleet: Fleet) -> Client:
    """A client whose calls go to the fleet's in-process server."""
    client = Client("http://testserver", "adm")
    client.http.close()
    fleet.http.headers.update(ADMIN)
    client.http = fleet.http
    return client


def request() -> SubmitRequest:
    spec = make_spec("train", 8)
    return SubmitRequest(spec=spec)


def test_a_submission_waits_for_the_store_and_is_made_once(fleet: Fleet) -> None:
    client = client_of(fleet)
    told: list[str] = []
    waiting = threading.Event()

    def say(why: str, _left: float) -> None:
        told.append(why)
        waiting.set()

    replies: list[SubmitReply] = []
    with away(fleet.rt.db.engine):
        sender = threading.Thread(
            target=lambda: replies.append(client.submit(request(), "key-1", 30.0, say))
        )
        sender.start()
        assert waiting.wait(10.0)
    sender.join(30.0)
    assert told and "store is unavailable" in told[0]
    assert [r.created for r in replies] == [True]
    again = client.submit(request(), "key-1")
    assert again.job.id == replies[0].job.id
    assert not again.created


def test_a_submission_gives_up_when_retry_for_is_spent(fleet: Fleet) -> None:
    client = client_of(fleet)
    told: list[str] = []
    with away(fleet.rt.db.engine), pytest.raises(ApiFailure) as refused:
        client.submit(request(), "key-2", 0.0, lambda why, _: told.append(why))
    assert refused.value.status == 503
    assert "store is unavailable" in refused.value.message
    assert told == []
