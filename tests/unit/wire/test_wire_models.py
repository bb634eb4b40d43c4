"""The API's and agent protocol's bodies: they survive a trip through JSON, requests refuse
what they must (unknown fields, loose types, out-of-range values, unknown words), replies
tolerate fields a newer server adds, and the defaults clients rely on hold."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from boltforge.wire.agent import (
    AgentReport,
    DesiredState,
    GpuActivity,
    Heartbeat,
    Inventory,
    Lease,
    LogChunk,
    Progress,
    Registration,
    ReplicaEvent,
    ReplicaSpec,
    ReplicaStatus,
    ReportReply,
)
from boltforge.wire.console import FleetMap, HostDetail, MapHost, MapPod, MapRack, Owner, ReportOut
from boltforge.wire.cost import BudgetOut, CostReply, CostRow, SavingsOut
from boltforge.wire.jobs import (
    TERMINAL,
    DeadlineOutlook,
    ErrorReply,
    FleetOut,
    JobDetail,
    JobSummary,
    NodeOut,
    Problem,
    SubmitReply,
    SubmitRequest,
    TokenRequest,
)
from boltforge.wire.reclaim import MAX_NOTICE_S, ReclaimReply, ReclaimRequest


def summary(**fields: Any) -> JobSummary:
    base: dict[str, Any] = {
        "id": "j-1",
        "name": "train",
        "team": "nlp",
        "priority": 2,
        "priority_name": "normal",
        "state": "pending",
        "gpus": 16,
        "replicas": 2,
        "submitted_at": 1000.0,
    }
    return JobSummary.model_validate({**base, **fields})


def node(**fields: Any) -> NodeOut:
    base: dict[str, Any] = {
        "name": "h100-p0-r00-h00",
        "pool": "h100",
        "gpu": "H100-80GB",
        "gpus": 8,
        "gpus_used": 4,
        "pod": "p0",
        "rack": "r0",
        "state": "ready",
    }
    return NodeOut.model_validate({**base, **fields})


def status(**fields: Any) -> ReplicaStatus:
    return ReplicaStatus.model_validate(
        {"replica": "j-1/worker/0", "job": "j-1", "epoch": 3, "state": "running", "pid": 42}
        | fields
    )


def rejects(model: type[BaseModel], data: dict[str, Any]) -> list[str]:
    """The error types a model raises for ``data`` (failing the test when it accepts it)."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    return [e["type"] for e in caught.value.errors()]


# --- round trips ---------------------------------------------------------------------------


ROUND_TRIPS: list[Any] = [
    pytest.param(
        Inventory(name="host-0", pool="h100", gpu="H100-80GB", gpus=8, gpu_memory_gb=80),
        id="inventory",
    ),
    pytest.param(
        Registration(inventory=Inventory(name="host-0"), running=[status()], agent_version="1"),
        id="registration",
    ),
    pytest.param(
        Lease(node="host-0", session="s", lease_s=30, heartbeat_s=5, stop=["r"]), id="lease"
    ),
    pytest.param(
        Heartbeat(
            session="s",
            running=[status(state="exited", pid=None)],
            health={"preflight": "ecc errors"},
            gpus=[GpuActivity(index=0, util_pct=97.5, memory_used_mib=70000)],
            leaving=True,
        ),
        id="heartbeat",
    ),
    pytest.param(
        DesiredState(
            node="host-0",
            version=7,
            replicas=[
                ReplicaSpec(
                    replica="j-1/worker/0",
                    job="j-1",
                    epoch=3,
                    action="run",
                    command=["python", "train.py"],
                    env={"RANK": "0"},
                    gpus=[0, 1],
                )
            ],
        ),
        id="desired state",
    ),
    pytest.param(
        AgentReport(
            session="s",
            events=[
                ReplicaEvent(
                    replica="r", job="j", epoch=1, kind="exited", at=5.0, exit_code=0, signal=None
                )
            ],
            logs=[LogChunk(replica="r", job="j", epoch=1, seq=0, data="step 1\n")],
            progress=[
                Progress(
                    replica="r", job="j", epoch=1, rank=0, step=10, at=6.0, metrics={"loss": 1.5}
                )
            ],
        ),
        id="agent report",
    ),
    pytest.param(ReportReply(refused=["r"]), id="report reply"),
    pytest.param(
        SubmitRequest(yaml="name: j\n", gpus="8xH100", array="0-9", idempotency_key="k"),
        id="submit request",
    ),
    pytest.param(
        SubmitReply(job=summary(), tasks=["j-1.0"], warnings=["soft budget"]), id="submit"
    ),
    pytest.param(
        JobDetail.model_validate(
            summary(state="running").model_dump()
            | {"epoch": 2, "outlook": DeadlineOutlook(at=1.0, verdict="reachable").model_dump()}
        ),
        id="job detail",
    ),
    pytest.param(
        ErrorReply(error="bad spec", problems=[Problem(field="job.gpus", value=0, message="m")]),
        id="error reply",
    ),
    pytest.param(
        FleetMap(
            gpus=8,
            gpus_used=4,
            fragmentation=0.25,
            owners=[Owner(team="nlp", job="j-1")],
            pods=[
                MapPod(
                    name="p0",
                    racks=[
                        MapRack(
                            name="r0",
                            hosts=[
                                MapHost(
                                    name="h", pool="h100", gpu="H100", state="ready", gpus=[0, -1]
                                )
                            ],
                        )
                    ],
                )
            ],
        ),
        id="fleet map",
    ),
    pytest.param(
        ReportOut(
            name="r",
            title="t",
            command="bolt sim",
            columns=[("policy", "Policy")],
            rows=[{"policy": "fifo"}],
            files=[],
        ),
        id="simulation report",
    ),
    pytest.param(
        CostReply(
            by="team",
            since=0,
            until=3600,
            total=CostRow(key="all", team="*", gpu_hours=8),
            budgets=[
                BudgetOut(
                    team="nlp", month="2030-01", monthly=100, soft=0.8, spent=90, state="warn"
                )
            ],
            savings=SavingsOut(
                since=0,
                hours=1,
                static_dollars=10,
                shared_dollars=8,
                saved_dollars=2,
                peaks={"nlp": {"h100": 8}},
            ),
        ),
        id="cost reply",
    ),
    pytest.param(ReclaimRequest(in_s=120), id="reclaim request"),
    pytest.param(
        ReclaimReply(node=node(state="cordoned"), reclaim_at=2000.0, jobs=[]), id="reclaim reply"
    ),
    pytest.param(HostDetail.model_validate(node().model_dump() | {"cordoned": True}), id="host"),
]


@pytest.mark.parametrize("message", ROUND_TRIPS)
def test_a_message_survives_a_trip_through_json(message: BaseModel) -> None:
    again = type(message).model_validate_json(message.model_dump_json())
    assert again == message
    assert again.model_dump() == message.model_dump()


# --- requests refuse what they must -------------------------------------------------------


REFUSED = [
    pytest.param(Inventory, {"name": "h", "gpus": 65}, "less_than_equal", id="over 64 GPUs"),
    pytest.param(Inventory, {"name": "h", "gpus": -1}, "greater_than_equal", id="negative GPUs"),
    pytest.param(Inventory, {"name": "h", "memory_gb": 0}, "greater_than", id="no memory"),
    pytest.param(Inventory, {"name": "h", "cpus": 0}, "greater_than_equal", id="no CPUs"),
    pytest.param(Inventory, {"name": "h", "gpus": "8"}, "int_type", id="a count as text"),
    pytest.param(Inventory, {"name": "h", "tier": "preemptible"}, "literal_error", id="tier"),
    pytest.param(Inventory, {"name": "h", "source": "guess"}, "literal_error", id="source"),
    pytest.param(Inventory, {"name": "-h"}, "string_pattern_mismatch", id="a name with a dash"),
    pytest.param(Inventory, {"name": "h", "rack": "r 1"}, "string_pattern_mismatch", id="rack"),
    pytest.param(Inventory, {"name": "h", "gpu_count": 8}, "extra_forbidden", id="unknown field"),
    pytest.param(
        GpuActivity,
        {"index": 0, "util_pct": 100.5, "memory_used_mib": 0},
        "less_than_equal",
        id="utilization over 100 percent",
    ),
    pytest.param(
        GpuActivity,
        {"index": -1, "util_pct": 0, "memory_used_mib": 0},
        "greater_than_equal",
        id="a negative GPU index",
    ),
    pytest.param(
        ReplicaStatus,
        {"replica": "r", "job": "j", "epoch": 1, "state": "paused"},
        "literal_error",
        id="an unknown replica state",
    ),
    pytest.param(
        ReplicaSpec,
        {"replica": "r", "job": "j", "epoch": 1, "action": "restart"},
        "literal_error",
        id="an unknown action",
    ),
    pytest.param(
        ReplicaEvent,
        {"replica": "r", "job": "j", "epoch": 1, "kind": "crashed", "at": 0.0},
        "literal_error",
        id="an unknown event",
    ),
    pytest.param(
        LogChunk,
        {"replica": "r", "job": "j", "epoch": 1, "seq": -1, "data": ""},
        "greater_than_equal",
        id="a negative log sequence",
    ),
    pytest.param(
        Progress,
        {
            "replica": "r",
            "job": "j",
            "epoch": 1,
            "rank": 0,
            "step": 1,
            "at": 0.0,
            "step_time_s": -1,
        },
        "greater_than_equal",
        id="a negative step time",
    ),
    pytest.param(
        Progress,
        {"replica": "r", "job": "j", "epoch": 1, "rank": -1, "step": 1, "at": 0.0},
        "greater_than_equal",
        id="a negative rank",
    ),
    pytest.param(Heartbeat, {"session": "s", "leaving": "yes"}, "bool_type", id="leaving as text"),
    pytest.param(SubmitRequest, {"gpus": 8}, "string_type", id="gpus as a number"),
    pytest.param(SubmitRequest, {"gpus": "8" * 41}, "string_too_long", id="gpus too long"),
    pytest.param(SubmitRequest, {"team": "t" * 64}, "string_too_long", id="team too long"),
    pytest.param(SubmitRequest, {"array": "0" * 201}, "string_too_long", id="array too long"),
    pytest.param(SubmitRequest, {"workdir": "/" * 4097}, "string_too_long", id="workdir too long"),
    pytest.param(SubmitRequest, {"spec": {}, "user": "x"}, "extra_forbidden", id="unknown field"),
    pytest.param(TokenRequest, {"name": "ci", "role": "root"}, "literal_error", id="unknown role"),
    pytest.param(
        TokenRequest,
        {"name": "ci", "role": "member", "team": "NLP"},
        "string_pattern_mismatch",
        id="a team in capitals",
    ),
    pytest.param(
        TokenRequest, {"name": "@ci", "role": "agent"}, "string_pattern_mismatch", id="token name"
    ),
    pytest.param(ReclaimRequest, {"in_s": 0}, "greater_than", id="a notice of no time"),
    pytest.param(ReclaimRequest, {"in_s": MAX_NOTICE_S + 1}, "less_than_equal", id="over a day"),
    pytest.param(ReclaimRequest, {"in_s": "60"}, "float_type", id="a notice as text"),
    pytest.param(ReclaimRequest, {}, "missing", id="no notice"),
]


@pytest.mark.parametrize(("model", "data", "kind"), REFUSED)
def test_a_request_out_of_bounds_is_refused(
    model: type[BaseModel], data: dict[str, Any], kind: str
) -> None:
    assert kind in rejects(model, data)


@pytest.mark.parametrize(
    ("model", "data"),
    [
        pytest.param(Inventory, {"name": "h", "gpus": 64, "gpus_per": None}, id="inventory"),
        pytest.param(Heartbeat, {"session": "s", "load": 1.0}, id="heartbeat"),
        pytest.param(ReclaimRequest, {"in_s": 60, "reason": "x"}, id="reclaim"),
        pytest.param(TokenRequest, {"name": "a", "role": "admin", "expires": 1}, id="token"),
    ],
)
def test_requests_refuse_fields_they_do_not_know(
    model: type[BaseModel], data: dict[str, Any]
) -> None:
    assert "extra_forbidden" in rejects(model, data)


@pytest.mark.parametrize(
    ("in_s", "accepted"),
    [(0.001, True), (MAX_NOTICE_S, True), (0.0, False), (-5.0, False), (MAX_NOTICE_S + 0.5, False)],
)
def test_a_reclaim_notice_is_more_than_nothing_and_at_most_a_day(
    in_s: float, accepted: bool
) -> None:
    try:
        ReclaimRequest(in_s=in_s)
    except ValidationError:
        assert not accepted
    else:
        assert accepted


@given(util=st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6))
def test_gpu_utilization_is_a_percentage(util: float) -> None:
    data = {"index": 0, "util_pct": util, "memory_used_mib": 0.0}
    if 0 <= util <= 100:
        activity = GpuActivity.model_validate(data)
        assert GpuActivity.model_validate_json(activity.model_dump_json()).util_pct == util
    else:
        with pytest.raises(ValidationError):
            GpuActivity.model_validate(data)


@given(gpus=st.integers(min_value=-100, max_value=200))
def test_an_inventory_holds_zero_to_64_gpus(gpus: int) -> None:
    if 0 <= gpus <= 64:
        assert Inventory(name="h", gpus=gpus).gpus == gpus
    else:
        with pytest.raises(ValidationError):
            Inventory(name="h", gpus=gpus)


# --- replies: tolerant of newer servers, strict about states --------------------------------


def test_replies_ignore_fields_a_newer_server_adds() -> None:
    job = summary(queue_class="gold")
    assert "queue_class" not in job.model_dump()
    assert node(temperature_c=60).name == "h100-p0-r00-h00"
    assert (
        FleetOut.model_validate(
            {
                "nodes": 1,
                "nodes_ready": 1,
                "gpus": 8,
                "gpus_used": 0,
                "jobs_running": 0,
                "jobs_pending": 0,
                "fragmentation": 0.0,
                "power_kw": 3.2,
            }
        ).loop.full_passes
        == 0
    )


@pytest.mark.parametrize(
    "state",
    [
        "pending",
        "scheduled",
        "running",
        "preempting",
        "requeued",
        "succeeded",
        "failed",
        "cancelled",
    ],
)
def test_every_job_state_is_understood(state: str) -> None:
    assert summary(state=state).state == state


def test_an_unknown_job_or_node_state_is_refused() -> None:
    with pytest.raises(ValidationError):
        summary(state="zombie")
    with pytest.raises(ValidationError):
        node(state="rebooting")


def test_terminal_states_are_the_finished_ones() -> None:
    assert frozenset({"succeeded", "failed", "cancelled"}) == TERMINAL


def test_cost_grouping_and_budget_state_are_closed_words() -> None:
    total = {"key": "all", "team": "*"}
    assert CostReply.model_validate({"by": "project", "since": 0, "until": 1, "total": total}).by
    with pytest.raises(ValidationError):
        CostReply.model_validate({"by": "user", "since": 0, "until": 1, "total": total})
    budget = {"team": "t", "month": "2030-01", "monthly": 1, "soft": 0.8, "spent": 2}
    with pytest.raises(ValidationError):
        BudgetOut.model_validate(budget | {"state": "broke"})


# --- defaults clients rely on ---------------------------------------------------------------


def test_a_bare_inventory_is_a_declared_reserved_host_on_localhost() -> None:
    inv = Inventory(name="laptop")
    assert (inv.pool, inv.gpu, inv.gpus, inv.cpus, inv.memory_gb) == ("default", "none", 0, 1, 1)
    assert (inv.pod, inv.rack, inv.tier, inv.source) == ("pod0", "rack0", "reserved", "declared")
    assert (inv.address, inv.nvlink_island, inv.rails) == ("127.0.0.1", None, None)


def test_agent_protocol_defaults() -> None:
    spec = ReplicaSpec(replica="r", job="j", epoch=1, action="stop")
    assert (spec.grace_s, spec.command, spec.env, spec.gpus) == (30.0, [], {}, [])
    lease = Lease(node="n", session="s", lease_s=30, heartbeat_s=5)
    assert (lease.stop, lease.desired_version) == ([], 0)
    beat = Heartbeat(session="s")
    assert (beat.running, beat.health, beat.gpus, beat.leaving) == ([], {}, [], False)
    event = ReplicaEvent(replica="r", job="j", epoch=1, kind="exited", at=0.0)
    assert (event.by_node, event.preflight, event.detail, event.cleanup) == (False, False, "", "")


def test_job_reply_defaults() -> None:
    job = summary()
    assert (job.user, job.reason, job.nodes, job.preemptions, job.restarts) == ("", "", "", 0, 0)
    assert (job.position, job.estimated_start, job.array, job.exit_code) == (None, None, None, None)
    detail = JobDetail.model_validate(job.model_dump())
    assert (detail.epoch, detail.spec, detail.placement, detail.outlook) == (0, {}, [], None)
    assert (detail.gpu_hours, detail.dollars) == (0.0, 0.0)
    reply = SubmitReply(job=job)
    assert (reply.created, reply.tasks, reply.warnings) == (True, [], [])
    outlook = DeadlineOutlook(at=0.0)
    assert (outlook.verdict, outlook.slack_s, outlook.note) == (None, None, "")


def test_a_bare_submit_request_names_its_source_job() -> None:
    req = SubmitRequest()
    assert req.source == "job"
    assert (req.spec, req.yaml, req.gpus, req.priority, req.team, req.array) == (None,) * 6


def test_node_and_host_defaults() -> None:
    n = node()
    assert (n.jobs, n.source, n.address, n.reclaim_at, n.degraded) == (
        [],
        "declared",
        "",
        None,
        False,
    )
    host = HostDetail.model_validate(n.model_dump())
    assert (host.cordoned, host.health, host.slots, host.job_list) == (False, [], [], [])


def test_defaults_are_not_shared_between_messages() -> None:
    first, second = Heartbeat(session="a"), Heartbeat(session="b")
    first.running.append(status())
    first.health["ecc"] = "bad"
    assert (second.running, second.health) == ([], {})
    one, two = (
        HostDetail.model_validate(node().model_dump()),
        HostDetail.model_validate(node().model_dump()),
    )
    one.health.append("ecc")
    assert two.health == []
