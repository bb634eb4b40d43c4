"""An inference service on a real control plane (``bolt server``, ``bolt agent``s, replicas
that report load through the SDK): it scales up as its load rises, takes GPUs from a training
job by the class rules (which checkpoints and waits), scales down and to zero when the load
goes, gives the GPUs back so training resumes from its checkpoint, and wakes again when a
gateway reports requests waiting."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from test_faults import checkpointed, fleet, resumed_from, submit, trainer

from boltforge.client import Client
from boltforge.testing.processes import wait_until
from boltforge.wire.services import GatewayLoad, ServiceRequest, ServiceSummary

REPLICA = Path(__file__).resolve().parents[2] / "examples" / "serving" / "replica.py"
# Preempt at once, twice the fleet's GPUs per 10 minutes; autoscale twice a second.
FAST = ["--min-runtime", "0", "--churn", "2", "--cooldown", "0", "--scale-every", "0.5"]


def chat(load_file: Path) -> dict[str, Any]:
    """A service of 4-GPU replicas, 10 requests/s each at full use, zero when idle 8 s."""
    return {
        "kind": "service",
        "name": "chat",
        "team": "nlp",
        "gpus": 4,
        "command": [sys.executable, str(REPLICA), str(load_file)],
        "checkpoint": {"grace": "10s"},
        "replicas": {"min": 0, "max": 2},
        "autoscale": {
            "rps_per_replica": 10,
            "target_utilization": 1.0,
            "latency_slo_ms": 500,
            "scale_down_window": "4s",
            "idle_to_zero": "8s",
            "cold_start": "2s",
            "predictive": False,
        },
    }


def serving(api: Client, live: int, ready: int | None = None) -> ServiceSummary | None:
    s = api.service("chat")
    ok = s.live == live and s.desired == live and (ready is None or s.ready == ready)
    return s if ok else None


def test_a_service_scales_with_its_load_and_training_gives_way_then_resumes(
    tmp_path: Path,
) -> None:
    load = tmp_path / "load"
    load.write_text("5")
    with fleet(tmp_path, 1, FAST) as (_, api):
        train = submit(api, trainer("train", 4000, priority="low"))
        wait_until(lambda: checkpointed(api, train, 20), 60, "training to checkpoint")

        api.apply_service(ServiceRequest(spec=chat(load)))
        wait_until(lambda: serving(api, 1, ready=1), 60, "one ready replica")
        bumped = api.job(train)
        assert bumped.state in ("pending", "requeued") and bumped.preemptions == 1

        load.write_text("15")  # 15 requests/s on one replica: two are needed
        up = wait_until(lambda: serving(api, 2, ready=2), 60, "a second replica")
        assert "request rate" in up.reason and up.load is not None and up.slo_met

        load.write_text("0")
        down = wait_until(lambda: serving(api, 0), 60, "the service to scale to zero")
        assert "scale to zero" in down.reason and down.scale_events >= 3
        resumed = wait_until(lambda: checkpointed(api, train, (bumped.last_step or 0) + 10), 90)
        assert resumed.epoch == 2 and resumed_from(api, train)[0] >= 20

        api.service_load("chat", GatewayLoad(queued=3))  # a request waits at the gateway
        woke = wait_until(lambda: serving(api, 1, ready=1), 60, "the service to wake")
        assert "cold start" in woke.reason or "queue" in woke.reason
        assert api.job(train).preemptions == 2

        api.delete_service("chat")
        wait_until(lambda: api.job(train).state == "running", 90, "training to run again")
