"""What a training script imports: where to checkpoint, which rank it is, preemption, progress.

Everything reads the environment the Boltforge agent sets for each replica and falls back to
sensible defaults outside Boltforge (one process, rank 0, ``./checkpoints``), so the same
script runs on a laptop. Importing this module is cheap and changes nothing; the SIGTERM
handler is installed only when ``on_preempt`` or ``preempted`` is first called.

    from boltforge import sdk

    state = load(sdk.checkpoint_dir())
    for step in range(state.step, steps):
        if sdk.preempted():
            save(sdk.checkpoint_dir(), state)
            raise SystemExit(0)
        loss = train_step()
        sdk.report(step + 1, loss=loss)
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

__all__ = [
    "array_index",
    "checkpoint_dir",
    "job_id",
    "local_rank",
    "on_preempt",
    "preempted",
    "rank",
    "report",
    "report_load",
    "world_size",
]

_preempted = threading.Event()
_callbacks: list[Callable[[], None]] = []
_installed = False
_last_report: float | None = None


def checkpoint_dir() -> Path:
    """The directory this job's checkpoints go in, created if missing: ``BOLT_CHECKPOINT_DIR``
    (shared by every replica and epoch of the job, so a restarted job finds its last
    checkpoint), else ``./checkpoints``."""
    path = Path(os.environ.get("BOLT_CHECKPOINT_DIR") or "checkpoints")
    path.mkdir(parents=True, exist_ok=True)
    return path


def job_id() -> str:
    """The job's id (``BOLT_JOB_ID``), ``local`` outside Boltforge."""
    return os.environ.get("BOLT_JOB_ID") or "local"


def rank() -> int:
    """This process's global rank (``RANK``), 0 when unset."""
    return _int_env("RANK", 0)


def world_size() -> int:
    """How many ranks the job has (``WORLD_SIZE``), 1 when unset."""
    return _int_env("WORLD_SIZE", 1)


def local_rank() -> int:
    """This process's rank on its node (``LOCAL_RANK``), 0 when unset."""
    return _int_env("LOCAL_RANK", 0)


def array_index() -> int | None:
    """This task's index in a job array (``BOLT_ARRAY_INDEX``), None when not in an array."""
    value = os.environ.get("BOLT_ARRAY_INDEX", "")
    return int(value) if value.strip() else None


def on_preempt(callback: Callable[[], None]) -> None:
    """Call ``callback()`` (in the main thread, from the signal handler) when the replica is
    asked to stop: Boltforge sends SIGTERM, then kills the replica after the job's grace
    period. Keep callbacks short (set a flag, start a checkpoint); the script should still
    check ``preempted()``, checkpoint and exit. Installs the SIGTERM handler on first use
    (from the main thread); it replaces the default, which would end the process at once."""
    _install()
    _callbacks.append(callback)


def preempted() -> bool:
    """True once SIGTERM has arrived: checkpoint now and exit 0. The first call installs the
    SIGTERM handler, so call it once before the training loop starts."""
    _install()
    return _preempted.is_set()


def report(step: int, *, checkpoint: bool = False, **metrics: float) -> None:
    """Record that training step ``step`` finished (with ``checkpoint=True`` when a
    checkpoint was written at it) and any metrics, e.g. ``report(100, loss=0.3)``.

    Appends one JSON line to ``BOLT_PROGRESS_FILE`` with ``replica``, ``job``, ``epoch``,
    ``rank``, ``step``, ``at`` (Unix time), ``step_time_s`` (seconds since this process's
    previous report; null for the first), ``checkpoint`` and ``metrics``; the agent forwards
    it to the control plane. Does nothing outside Boltforge (no progress file)."""
    _append(int(step), bool(checkpoint), {k: float(v) for k, v in metrics.items()})


def _append(step: int, checkpoint: bool, metrics: dict[str, float]) -> None:
    """One progress line (see ``report``)."""
    global _last_report
    now = time.monotonic()
    step_time = None if _last_report is None else round(now - _last_report, 6)
    _last_report = now
    path = os.environ.get("BOLT_PROGRESS_FILE")
    if not path:
        return
    line = {
        "replica": os.environ.get("BOLT_REPLICA", ""),
        "job": job_id(),
        "epoch": _int_env("BOLT_EPOCH", 0),
        "rank": rank(),
        "step": step,
        "at": time.time(),
        "step_time_s": step_time,
        "checkpoint": checkpoint,
        "metrics": metrics,
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


_load_reports = 0


def report_load(
    *,
    requests_per_s: float,
    queued: float = 0.0,
    p99_ms: float | None = None,
    kv_cache: float | None = None,
) -> None:
    """Tell a service's autoscaler this replica's load now: requests per second it serves,
    requests waiting for it, its p99 latency in milliseconds, and the share of its KV cache
    in use (0-1). Call it every few seconds; a replica counts as ready from its first
    report, and a report older than 30 s no longer counts. Goes the way ``report`` goes
    (each call is one progress line); does nothing outside Boltforge."""
    global _load_reports
    _load_reports += 1
    metrics = {"requests_per_s": float(requests_per_s), "queued": float(queued)}
    if p99_ms is not None:
        metrics["p99_ms"] = float(p99_ms)
    if kv_cache is not None:
        metrics["kv_cache"] = float(kv_cache)
    _append(_load_reports, False, metrics)


def _install() -> None:
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    first = not _preempted.is_set()
    _preempted.set()
    if first:
        for callback in list(_callbacks):
            callback()


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value)
    except ValueError:
        return default
