"""The HTTP API's edges: the shape of every error reply, 404 and 405 answers, malformed and
oversize input, compression only when asked, the OpenAPI document's replies, and the
console's event stream."""

from __future__ import annotations

import gzip
import json
import queue
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from control_kit import ADMIN, Fleet, make_spec
from starlette.routing import Match

from boltforge.control.api.methods import METHODS, allowed

JSON = {**ADMIN, "content-type": "application/json"}
ERROR_STATUSES = {"400", "401", "403", "404", "409", "422"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("edges"), hosts=2) as f:
        yield f


def error_body(r: Any, status: int) -> dict[str, Any]:
    """The reply's body, checked to be an error reply with ``status``."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body: dict[str, Any] = r.json()
    assert set(body) == {"error", "problems"}
    assert isinstance(body["error"], str) and body["error"]
    assert isinstance(body["problems"], list)
    for problem in body["problems"]:
        assert {"field", "value", "message"} <= set(problem)
        assert "To fix" in problem["message"]
    return body


def concrete(path: str) -> str:
    """``path`` with each ``{parameter}`` filled in."""
    return "/".join("x" if p.startswith("{") else p for p in path.split("/"))


def openapi(fleet: Fleet) -> dict[str, Any]:
    document: dict[str, Any] = fleet.http.get("/openapi.json").json()
    return document


# error replies


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("GET", "/v1/jobs", {}, 401),
        ("GET", "/v1/jobs", {"Authorization": "Bearer wrong"}, 401),
        ("GET", "/v1/jobs/no-such-job", ADMIN, 404),
        ("POST", "/v1/jobs/no-such-job/cancel", ADMIN, 404),
        ("GET", "/v1/console/hosts/no-such-host", ADMIN, 404),
        ("POST", "/v1/nodes/no-such-node/cordon", ADMIN, 404),
    ],
)
def test_refusals_say_what_went_wrong_and_the_fix(
    fleet: Fleet, method: str, path: str, headers: dict[str, str], status: int
) -> None:
    body = error_body(fleet.http.request(method, path, headers=headers), status)
    assert "To fix" in body["error"]


@pytest.mark.parametrize("states", ["runing", "running,pendng", " ,bogus"])
def test_listing_jobs_in_an_unknown_state_names_it_and_the_known_ones(
    fleet: Fleet, states: str
) -> None:
    body = error_body(fleet.http.get("/v1/jobs", params={"state": states}, headers=ADMIN), 422)
    [problem] = body["problems"]
    assert problem["field"] == "state"
    wrong = {s.strip() for s in states.split(",")} - {"", "running"}
    assert set(problem["value"].split(",")) == wrong
    assert "pending" in problem["message"] and "succeeded" in problem["message"]


def test_listing_jobs_in_known_states_with_spaces_is_answered(fleet: Fleet) -> None:
    r = fleet.http.get("/v1/jobs", params={"state": "pending, running"}, headers=ADMIN)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", ["/nope", "/v1/nope", "/v1/jobs/x/y/z", "/v2/jobs"])
def test_an_unknown_route_is_a_json_404(fleet: Fleet, path: str) -> None:
    body = error_body(fleet.http.get(path, headers=ADMIN), 404)
    assert body == {"error": "Not Found", "problems": []}


def test_a_405_lists_every_method_of_each_documented_path(fleet: Fleet) -> None:
    checked = 0
    for path, operations in openapi(fleet)["paths"].items():
        documented = {m.upper() for m in operations}
        wrong = next(m for m in ("PUT", "PATCH", "DELETE") if m not in documented)
        r = fleet.http.request(wrong, concrete(path), headers=ADMIN)
        body = error_body(r, 405)
        assert body["error"] == "Method Not Allowed"
        allow = set(r.headers["allow"].split(", "))
        assert documented <= allow, path
        assert wrong not in allow and allow <= set(METHODS)
        checked += 1
    assert checked >= 20


def test_the_allow_header_asks_every_route_not_just_the_first_match(fleet: Fleet) -> None:
    scope = {"type": "http", "path": "/v1/jobs", "method": "PUT", "root_path": ""}
    routes = fleet.app.router.routes
    assert allowed(routes, scope) == "GET, POST"
    assert all(r.matches({**scope, "method": "PUT"})[0] != Match.FULL for r in routes)
    assert allowed(routes, {**scope, "path": "/v1/jobs/j-1/cancel"}) == "POST"


def test_a_body_that_is_not_an_object_is_refused_naming_the_body(fleet: Fleet) -> None:
    body = error_body(fleet.http.post("/v1/jobs", content=b"[1, 2]", headers=JSON), 422)
    [problem] = body["problems"]
    assert problem["field"] == "body" and problem["value"] == "[1, 2]"
    assert fleet.http.get("/v1/jobs", headers=ADMIN).json()["jobs"] == []


@pytest.mark.parametrize("raw", [b'{"spec": ', b"not json", b'{"spec": {}'])
def test_a_body_that_is_not_json_is_refused_naming_the_body(fleet: Fleet, raw: bytes) -> None:
    body = error_body(fleet.http.post("/v1/jobs", content=raw, headers=JSON), 422)
    [problem] = body["problems"]
    assert problem["field"] == "body"


def test_a_body_that_is_not_json_is_refused_without_storing_anything(fleet: Fleet) -> None:
    body = error_body(fleet.http.post("/v1/jobs", content=b'{"spec": ', headers=JSON), 422)
    [problem] = body["problems"]
    assert problem["message"].startswith("is not valid JSON") and "To fix" in problem["message"]
    assert fleet.http.get("/v1/jobs", headers=ADMIN).json()["jobs"] == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("yaml", "x" * 1_000_001),
        ("source", "s" * 201),
        ("gpus", "8" * 41),
        ("team", "t" * 64),
        ("idempotency_key", "k" * 201),
    ],
)
def test_oversize_submit_fields_are_refused_naming_the_field(
    fleet: Fleet, field: str, value: str
) -> None:
    r = fleet.post("/v1/jobs", {"spec": make_spec("big", 8), field: value})
    body = error_body(r, 422)
    [problem] = body["problems"]
    assert problem["field"] == field
    assert len(problem["value"]) <= 200  # the offending value is quoted, shortened
    assert fleet.http.get("/v1/jobs", headers=ADMIN).json()["jobs"] == []


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/jobs?limit=10001", "query.limit"),
        ("/v1/jobs?limit=0", "query.limit"),
        ("/v1/jobs?state=" + "a" * 201, "query.state"),
        ("/v1/jobs?team=" + "t" * 64, "query.team"),
        ("/v1/jobs?ids=" + "1," * 4001, "query.ids"),
        ("/v1/jobs?ids=1,%F0%9B%AE%B7", "query.ids"),
        ("/v1/audit?limit=10001", "query.limit"),
        ("/v1/cost?since=" + "9" * 41, "query.since"),
    ],
)
def test_oversize_query_parameters_are_refused_naming_them(
    fleet: Fleet, path: str, field: str
) -> None:
    [problem] = error_body(fleet.http.get(path, headers=ADMIN), 422)["problems"]
    assert problem["field"] == field


# compression


def test_a_large_reply_is_gzipped_only_for_a_client_that_asks(fleet: Fleet) -> None:
    asked = fleet.http.get("/openapi.json", headers={"Accept-Encoding": "gzip"})
    plain = fleet.http.get("/openapi.json", headers={"Accept-Encoding": "identity"})
    assert asked.status_code == plain.status_code == 200
    assert asked.headers["content-encoding"] == "gzip"
    assert "content-encoding" not in plain.headers
    assert asked.json() == plain.json()  # the client decoded the gzip body
    assert int(plain.headers["content-length"]) > 4096
    with fleet.http.stream("GET", "/openapi.json", headers={"Accept-Encoding": "gzip"}) as r:
        wire = b"".join(r.iter_raw())
    assert len(wire) < int(plain.headers["content-length"])
    assert json.loads(gzip.decompress(wire)) == plain.json()


def test_a_small_reply_is_never_gzipped(fleet: Fleet) -> None:
    r = fleet.http.get("/healthz", headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200 and "content-encoding" not in r.headers


def test_an_error_reply_follows_the_same_rule(fleet: Fleet) -> None:
    r = fleet.http.get("/nope", headers={**ADMIN, "Accept-Encoding": "gzip"})
    assert r.status_code == 404 and "content-encoding" not in r.headers  # too small


# the OpenAPI document


def test_every_api_operation_documents_its_success_and_its_errors(fleet: Fleet) -> None:
    document = openapi(fleet)
    operations = [
        (path, method, op)
        for path, ops in document["paths"].items()
        if path.startswith("/v1/")
        for method, op in ops.items()
    ]
    assert len(operations) >= 25
    for path, method, op in operations:
        codes = set(op["responses"])
        assert codes & {"200", "201"}, (method, path)
        assert codes >= ERROR_STATUSES, (method, path)
        for code in ERROR_STATUSES:
            reply = op["responses"][code]
            assert reply["description"]
            schema = reply["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorReply"}, (method, path, code)
    schema = document["components"]["schemas"]["ErrorReply"]
    assert {"error", "problems"} <= set(schema["properties"])


def test_every_documented_path_is_served(fleet: Fleet) -> None:
    for path, operations in openapi(fleet)["paths"].items():
        for method in operations:
            r = fleet.http.request(method.upper(), concrete(path), headers=ADMIN)
            assert r.status_code not in (405, 500), (method, path, r.text)
            if r.status_code == 404:  # the parameter names nothing: not the route missing
                assert r.json()["error"] != "Not Found", (method, path)


def test_the_documented_error_statuses_include_what_a_bad_body_gets(fleet: Fleet) -> None:
    documented = set(openapi(fleet)["paths"]["/v1/jobs"]["post"]["responses"])
    got = fleet.http.post("/v1/jobs", content=b"not json", headers=JSON).status_code
    assert str(got) in documented


# the console's event stream


def test_the_event_stream_says_hello_then_names_a_submitted_job(fleet: Fleet) -> None:
    lines: queue.Queue[Any] = queue.Queue()

    def listen() -> None:
        try:
            with fleet.http.stream("GET", "/v1/console/stream", headers=ADMIN) as r:
                lines.put((r.status_code, r.headers["content-type"]))
                for line in r.iter_lines():
                    lines.put(line)
                    if line.startswith("data:") and '"jobs":["' in line:
                        return
        except Exception as e:  # the stream ended under the reader
            lines.put(e)

    reader = threading.Thread(target=listen, daemon=True)
    reader.start()
    status, kind = lines.get(timeout=10)
    if status != 200:
        pytest.skip("the test client could not open the stream")
    assert kind.startswith("text/event-stream")
    assert lines.get(timeout=10) == "event: hello"
    hello = lines.get(timeout=10)
    assert hello.startswith("data:") and json.loads(hello[5:])["who"] == "admin"
    job = fleet.submit(make_spec("streamed", 8))
    seen: list[str] = []
    while not (seen and seen[-1].startswith("data:") and '"jobs":["' in seen[-1]):
        item = lines.get(timeout=10)
        assert not isinstance(item, Exception), item
        seen.append(item)
    assert "event: change" in seen
    change = json.loads(seen[-1][5:])
    assert job in change["jobs"] and change["all"] is False
    assert change["seq"] > json.loads(hello[5:])["seq"]
    reader.join(timeout=10)
    assert not reader.is_alive()
