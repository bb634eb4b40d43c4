"""The console's event stream (``api/stream.py``) driven directly, one event at a time: the
hello, a change naming jobs, logs and nodes, nothing for changes the console does not show,
a keepalive in quiet, a refresh-everything after falling behind, and the end when the
client goes away. Also the app's utilization sampler, which outlives a failed sample, and
whether the app looks for OpenTelemetry."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from boltforge.control import app as app_module
from boltforge.control import notify
from boltforge.control.api import stream
from boltforge.control.auth import Caller
from boltforge.control.notify import Notifier
from boltforge.control.runtime import Runtime

ADMIN = Caller("root", "admin")


class Client:
    """The listening side: connected until ``leave``."""

    def __init__(self) -> None:
        self.gone = False

    async def is_disconnected(self) -> bool:
        return self.gone


class Server:
    """What the stream reads of a runtime for an admin: only its notifier."""

    def __init__(self) -> None:
        self.notifier = Notifier()


def events(client: Client, server: Server, who: Caller = ADMIN) -> AsyncIterator[str]:
    return stream._events(cast(Any, client), who, cast(Runtime, server))


def parsed(text: str) -> tuple[str, dict[str, Any]]:
    """An event's kind and its data."""
    head, data, blank = text.split("\n", 2)
    assert head.startswith("event: ") and data.startswith("data: ") and blank == "\n"
    return head[7:], json.loads(data[6:])


async def bound(server: Server) -> None:
    server.notifier.bind(asyncio.get_running_loop())


def test_the_stream_says_hello_with_the_sequence_and_the_listener() -> None:
    async def main() -> str:
        server = Server()
        server.notifier.notify(["job:1", "node:a"])
        return await anext(events(Client(), server))

    assert parsed(asyncio.run(main())) == ("hello", {"seq": 2, "who": "root"})


def test_a_change_names_its_jobs_logs_and_nodes_sorted() -> None:
    async def main() -> str:
        server = Server()
        await bound(server)
        feed = events(Client(), server)
        await anext(feed)
        server.notifier.notify(["job:7", "logs:3", "node:b", "node:a", "job:12", "jobs"])
        return await anext(feed)

    kind, body = parsed(asyncio.run(main()))
    assert kind == "change"
    assert body == {
        "seq": 6,
        "jobs": ["12", "7"],
        "logs": ["3"],
        "nodes": ["a", "b"],
        "all": False,
    }


def test_a_new_job_alone_still_tells_the_console_to_refresh_its_list() -> None:
    async def main() -> str:
        server = Server()
        await bound(server)
        feed = events(Client(), server)
        await anext(feed)
        server.notifier.notify(["jobs"])
        return await anext(feed)

    assert parsed(asyncio.run(main())) == (
        "change",
        {"seq": 1, "jobs": [], "logs": [], "nodes": [], "all": False},
    )


def test_changes_the_console_does_not_show_send_nothing_but_keepalives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream, "KEEPALIVE_S", 0.05)
    monkeypatch.setattr(stream, "COALESCE_S", 0.0)

    async def main() -> list[str]:
        server = Server()
        await bound(server)
        feed = events(Client(), server)
        await anext(feed)
        server.notifier.notify(["quota:nlp", "budget"])
        first = await anext(feed)
        server.notifier.notify(["node:x"])
        return [first, await anext(feed)]

    quiet, change = asyncio.run(main())
    assert quiet == ": keepalive\n\n"
    assert parsed(change)[1]["nodes"] == ["x"]


def test_a_listener_too_far_behind_is_told_to_refresh_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(notify, "LOG_SIZE", 3)

    async def main() -> str:
        server = Server()
        await bound(server)
        feed = events(Client(), server)
        await anext(feed)
        server.notifier.notify([f"job:{i}" for i in range(10)])
        return await anext(feed)

    assert parsed(asyncio.run(main())) == (
        "change",
        {"seq": 10, "jobs": [], "logs": [], "nodes": [], "all": True},
    )


def test_the_stream_ends_when_the_client_goes_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "KEEPALIVE_S", 0.05)

    async def main() -> list[str]:
        client, server = Client(), Server()
        await bound(server)
        out = []
        async for text in events(client, server):
            out.append(text)
            if text.startswith(":"):
                client.gone = True
        return out

    texts = asyncio.run(asyncio.wait_for(main(), 10.0))
    assert [t.split("\n")[0] for t in texts] == ["event: hello", ": keepalive"]


def test_the_sequence_moves_on_so_each_change_is_told_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream, "COALESCE_S", 0.0)
    monkeypatch.setattr(stream, "KEEPALIVE_S", 0.05)

    async def main() -> list[str]:
        server = Server()
        await bound(server)
        feed = events(Client(), server)
        await anext(feed)
        server.notifier.notify(["job:1"])
        first = await anext(feed)
        second = await anext(feed)  # nothing new: a keepalive, not job 1 again
        server.notifier.notify(["job:2"])
        return [first, second, await anext(feed)]

    first, quiet, third = asyncio.run(main())
    assert parsed(first)[1]["jobs"] == ["1"]
    assert quiet == ": keepalive\n\n"
    assert parsed(third)[1]["jobs"] == ["2"] and parsed(third)[1]["seq"] == 2


# -- the app's sampler and telemetry ---------------------------------------------------------


class Sampled:
    """A runtime whose first sample fails; the test ends the sampler after the third."""

    def __init__(self, done: asyncio.Event, loop: asyncio.AbstractEventLoop) -> None:
        self.calls = 0
        self.done, self.loop = done, loop
        self.config = type("Config", (), {"sample_every_s": 0.0})()

    def take_sample(self) -> None:
        self.calls += 1
        if self.calls == 3:
            self.loop.call_soon_threadsafe(self.done.set)
        if self.calls == 1:
            raise RuntimeError("the store is away")


def test_a_failed_sample_is_logged_and_the_next_ones_still_taken(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> int:
        done = asyncio.Event()
        rt = Sampled(done, asyncio.get_running_loop())
        task = asyncio.create_task(app_module._sample(cast(Runtime, rt)))
        await asyncio.wait_for(done.wait(), 10.0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return rt.calls

    with caplog.at_level("ERROR", logger="boltforge.control.app"):
        assert asyncio.run(main()) >= 3
    assert [r.getMessage() for r in caplog.records] == ["utilization sample failed"]


@pytest.mark.parametrize(
    ("env", "configured"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "bolt"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4317"}, True),
        ({"NOT_OTEL": "1", "otel_lower": "1"}, False),
    ],
)
def test_telemetry_is_on_only_when_the_environment_configures_it(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], configured: bool
) -> None:
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert app_module._otel_configured() is configured
