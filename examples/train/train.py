"""Example training job: linear regression by SGD on synthetic data, standing in for a model.

It behaves the way Boltforge expects a training job to behave:

- resumes from the last checkpoint in ``BOLT_CHECKPOINT_DIR`` (``resumed from step N``);
- checkpoints every ``--checkpoint-every`` steps and when preempted (SIGTERM), atomically
  (written to a temporary file, then renamed), then exits 0 after a preemption checkpoint;
- reports every step through ``boltforge.sdk.report`` and prints the loss every
  ``--print-every`` steps.

Rank 0 writes checkpoints; every rank reads them (the directory may be shared). The data is
drawn from a generator seeded by the job id and the step, so a resumed run sees the same
batches it would have seen had it never stopped. ``--step-time`` sleeps per step, standing in
for the GPU work. Two faults can be injected, for the health checks to find:
``--slow-host NAME --slow-factor F`` makes the rank on host ``NAME`` (``BOLT_NODE``) take F
times as long per step (a throttled GPU), and ``--hang-after N`` stops reporting and hangs
after step N (a deadlocked collective; it ignores the checkpoint signal). Run it from the
repository root: ``python examples/train/train.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib
from pathlib import Path

import numpy as np

try:
    from boltforge import sdk
except ImportError:  # a checkout without boltforge installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from boltforge import sdk

CHECKPOINT = "model.npz"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600, help="train until this many steps")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds of sleep per step")
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    p.add_argument("--print-every", type=int, default=50, help="steps between loss lines")
    p.add_argument("--dim", type=int, default=32, help="number of features")
    p.add_argument("--batch", type=int, default=64, help="examples per step")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate")
    p.add_argument("--slow-host", default="", help="the host (BOLT_NODE) whose rank runs slow")
    p.add_argument("--slow-factor", type=float, default=3.0, help="how much slower it runs")
    p.add_argument("--hang-after", type=int, default=0, help="hang after this step (0: never)")
    return p.parse_args(argv)


def true_weights(seed: int, dim: int) -> np.ndarray:
    return np.random.default_rng([seed, 0]).normal(size=dim)


def batch(seed: int, step: int, w_true: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The examples of ``step``: the same for a given job and step, however often it runs."""
    rng = np.random.default_rng([seed, 1, step])
    x = rng.normal(size=(size, w_true.size))
    return x, x @ w_true + 0.1 * rng.normal(size=size)


def load_checkpoint(directory: Path, dim: int) -> tuple[int, np.ndarray]:
    """``(steps done, weights)`` from the last checkpoint, or ``(0, zeros)`` without one."""
    path = directory / CHECKPOINT
    if not path.exists():
        return 0, np.zeros(dim)
    with np.load(path) as data:
        return int(data["step"]), np.array(data["w"])


def save_checkpoint(directory: Path, step: int, w: np.ndarray) -> None:
    """Write the checkpoint under a temporary name, then rename it over the last one, so a
    reader (or a kill mid-write) never sees half a checkpoint. Only rank 0 writes."""
    if sdk.rank() != 0:
        return
    tmp = directory / f".{CHECKPOINT}.{os.getpid()}.tmp"
    with tmp.open("wb") as f:
        np.savez(f, step=step, w=w)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / CHECKPOINT)


def hang(step: int) -> None:
    """Stop making progress for good, as a rank stuck in a collective does."""
    print(f"hanging after step {step}", flush=True)
    while True:
        time.sleep(3600)


def train(args: argparse.Namespace) -> int:
    seed = zlib.crc32(sdk.job_id().encode())
    w_true = true_weights(seed, args.dim)
    directory = sdk.checkpoint_dir()
    start, w = load_checkpoint(directory, args.dim)
    if start:
        print(f"resumed from step {start}", flush=True)
    sdk.preempted()  # installs the SIGTERM handler before the first step
    slow = args.slow_host and os.environ.get("BOLT_NODE") == args.slow_host
    step_time = args.step_time * (args.slow_factor if slow else 1.0)
    for step in range(start, args.steps):
        if sdk.preempted():
            save_checkpoint(directory, step, w)
            wrote = ", checkpoint written" if sdk.rank() == 0 else ""
            print(f"preempted at step {step}{wrote}", flush=True)
            return 0
        x, y = batch(seed, step, w_true, args.batch)
        err = x @ w - y
        w = w - args.lr * (x.T @ err) / args.batch
        loss = float(np.mean(err**2))
        time.sleep(step_time)
        done = step + 1
        saved = done % args.checkpoint_every == 0
        if saved:
            save_checkpoint(directory, done, w)
        sdk.report(done, checkpoint=saved, loss=loss)
        if done % args.print_every == 0:
            print(f"step {done} loss {loss:.5f}", flush=True)
        if done == args.hang_after:
            hang(done)
    save_checkpoint(directory, args.steps, w)
    print(f"finished {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(train(parse_args()))
