"""What the agent protocol and the job API refuse, and where the refusal points: the agent's
messages take no loose types (a number as text, a float or a bool for a count), errors name
the nested field that is wrong (``replicas.0.gpus.1``), every missing field is listed at once,
while the job API's replies stay lenient for clients talking to a newer server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from boltforge.wire.agent import (
    AgentReport,
    DesiredChanges,
    DesiredState,
    Heartbeat,
    Heartbeats,
    HeartbeatsReply,
    Inventory,
    Lease,
    Progress,
    Registration,
    ReplicaEvent,
    ReplicaSpec,
)
from boltforge.wire.jobs import ErrorReply, JobSummary, SubmitRequest

RUN: dict[str, Any] = {"replica": "j-1.1.0", "job": "j-1", "epoch": 1, "action": "run"}
STEP: dict[str, Any] = {"replica": "r", "job": "j", "epoch": 1, "rank": 0, "step": 1, "at": 1.0}


def errors(model: type[BaseModel], data: dict[str, Any]) -> list[tuple[str, tuple[Any, ...]]]:
    """Each (error type, location) ``model`` finds in ``data``; fails when it accepts it."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    return [(e["type"], tuple(e["loc"])) for e in caught.value.errors()]


# --- no loose types in the agent protocol -------------------------------------------------


@pytest.mark.parametrize(
    ("model", "data", "expected"),
    [
        pytest.param(ReplicaSpec, {**RUN, "epoch": "3"}, ("int_type", ("epoch",)), id="text"),
        pytest.param(ReplicaSpec, {**RUN, "epoch": 3.0}, ("int_type", ("epoch",)), id="float"),
        pytest.param(ReplicaSpec, {**RUN, "epoch": True}, ("int_type", ("epoch",)), id="bool"),
        pytest.param(
            ReplicaSpec, {**RUN, "gpus": [0, "1"]}, ("int_type", ("gpus", 1)), id="a gpu as text"
        ),
        pytest.param(
            ReplicaSpec, {**RUN, "env": {"RANK": 1}}, ("string_type", ("env", "RANK")), id="env"
        ),
        pytest.param(
            ReplicaSpec,
            {**RUN, "command": "python train.py"},
            ("list_type", ("command",)),
            id="a command line as one string",
        ),
        pytest.param(
            ReplicaSpec, {**RUN, "cpus": -1}, ("greater_than_equal", ("cpus",)), id="negative cpus"
        ),
        pytest.param(
            ReplicaSpec,
            {**RUN, "memory_gb": -0.5},
            ("greater_than_equal", ("memory_gb",)),
            id="negative memory",
        ),
        pytest.param(
            Heartbeat, {"session": "s", "leaving": 1}, ("bool_type", ("leaving",)), id="1 for true"
        ),
        pytest.param(
            Progress,
            {**STEP, "metrics": {"loss": "0.5"}},
            ("float_type", ("metrics", "loss")),
            id="a metric as text",
        ),
        pytest.param(
            Progress, {**STEP, "checkpoint": "yes"}, ("bool_type", ("checkpoint",)), id="a mark"
        ),
    ],
)
def test_the_agent_protocol_takes_no_loose_types(
    model: type[BaseModel], data: dict[str, Any], expected: tuple[str, tuple[Any, ...]]
) -> None:
    assert errors(model, data) == [expected]


def test_a_whole_number_is_a_fine_float() -> None:
    assert ReplicaSpec.model_validate({**RUN, "grace_s": 5}).grace_s == 5.0
    assert Progress.model_validate({**STEP, "metrics": {"loss": 1}}).metrics == {"loss": 1.0}
    event = ReplicaEvent.model_validate_json(
        json.dumps({"replica": "r", "job": "j", "epoch": 1, "kind": "exited", "at": 7})
    )
    assert event.at == 7.0


def test_json_is_held_to_the_same_types_as_python() -> None:
    with pytest.raises(ValidationError) as caught:
        ReplicaSpec.model_validate_json(json.dumps({**RUN, "epoch": 3.0}))
    assert [e["type"] for e in caught.value.errors()] == ["int_type"]


# --- errors point at the nested field ---------------------------------------------------------


def test_an_error_deep_in_a_desired_state_names_the_replica_and_the_field() -> None:
    data = {"node": "n", "version": 1, "replicas": [RUN, {**RUN, "gpus": [0, "1"]}]}
    assert errors(DesiredState, data) == [("int_type", ("replicas", 1, "gpus", 1))]


def test_an_error_in_a_registrations_inventory_names_the_field() -> None:
    assert errors(Registration, {"inventory": {"name": "h", "gpus": 65}}) == [
        ("less_than_equal", ("inventory", "gpus"))
    ]


def test_an_error_in_a_reports_log_chunk_names_which_one() -> None:
    chunk = {"replica": "r", "job": "j", "epoch": 1, "seq": 0, "data": "ok"}
    data = {"session": "s", "logs": [chunk, {**chunk, "seq": 1, "data": 5}]}
    assert errors(AgentReport, data) == [("string_type", ("logs", 1, "data"))]


def test_a_heartbeat_for_many_nodes_names_the_node() -> None:
    data = {"beats": {"n1": {"session": "a"}, "n2": {"session": 7}}}
    assert errors(Heartbeats, data) == [("string_type", ("beats", "n2", "session"))]


def test_every_missing_field_is_listed_at_once() -> None:
    assert errors(Lease, {}) == [
        ("missing", ("node",)),
        ("missing", ("session",)),
        ("missing", ("lease_s",)),
        ("missing", ("heartbeat_s",)),
    ]
    assert errors(DesiredChanges, {}) == [("missing", ("seq",))]


def test_replies_for_many_nodes_default_to_nothing() -> None:
    reply = HeartbeatsReply.model_validate({})
    assert (reply.leases, reply.lost) == ({}, [])
    changes = DesiredChanges.model_validate({"seq": 0})
    assert (changes.full, changes.nodes) == (False, [])


# --- node names -------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", fullmatch=True))
def test_any_name_of_the_node_alphabet_up_to_63_characters_is_taken(name: str) -> None:
    assert Inventory(name=name).name == name


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("a" * 64, id="64 characters"),
        pytest.param("", id="empty"),
        pytest.param(".hidden", id="a leading dot"),
        pytest.param("_x", id="a leading underscore"),
        pytest.param("host 1", id="a space"),
        pytest.param("host/1", id="a slash"),
        pytest.param("hôst", id="not ASCII"),
        pytest.param("host\n", id="a trailing line break"),
    ],
)
def test_a_node_name_outside_the_alphabet_is_refused(name: str) -> None:
    assert errors(Inventory, {"name": name}) == [("string_pattern_mismatch", ("name",))]


# --- the job API ------------------------------------------------------------------------------


def test_a_submission_takes_its_spec_as_an_object_not_text() -> None:
    assert errors(SubmitRequest, {"spec": "name: x"}) == [("dict_type", ("spec",))]
    assert SubmitRequest.model_validate({"spec": {"name": "x"}}).spec == {"name": "x"}


def test_a_submitted_yaml_text_is_at_most_a_million_characters() -> None:
    assert SubmitRequest(yaml="x" * 1_000_000).yaml is not None
    assert errors(SubmitRequest, {"yaml": "x" * 1_000_001}) == [("string_too_long", ("yaml",))]


def test_replies_are_lenient_with_a_newer_server() -> None:
    row = {
        "id": "1",
        "name": "n",
        "team": "t",
        "priority": "50",
        "priority_name": "normal",
        "state": "pending",
        "gpus": 8,
        "replicas": 1,
        "submitted_at": 1,
        "queue_class": "new-field",
    }
    job = JobSummary.model_validate(row)
    assert (job.priority, job.submitted_at) == (50, 1.0)
    reply = ErrorReply.model_validate(
        {"error": "e", "problems": [{"field": "f", "message": "m"}], "trace": "ignored"}
    )
    assert reply.problems[0].value is None and reply.problems[0].message == "m"
