"""Write the example request-rate trace for the serving study (examples/serving/requests.csv).

The shape is synthetic and says so; it is meant to look like a week of two inference services,
not to reproduce a measured one:

- **Week.** 7 days from Monday 00:00 at 60 s steps (10,080 steps per service).
- **Diurnal curve.** A bump around each service's peak hour over a night floor: ``chat``
  (an assistant people talk to) peaks at 15:00, ``embed`` (embeddings for indexing jobs
  started in office hours) at 10:30; rate = ``peak x (floor + (1 - floor) x bump)``, the bump
  a Gaussian of the hour (wrapped round midnight) of width ``width_h``.
- **Weekends.** Saturday and Sunday run at ``weekend`` times the weekday curve (chat 0.55,
  embed 0.35); the level moves from one day's to the next over the first six hours of the
  day, so midnight is not a step.
- **Noise.** A slow multiplicative wander (AR(1) in log, coefficient 0.98, about 6% standard
  deviation) and 3% white noise per step.
- **Bursts.** ``bursts`` short surges per service, in daytime on random days: the rate rises
  to ``1.35x-1.5x`` in two minutes, holds 4-12 minutes and decays over five.

Deterministic: the same ``--seed`` writes the same file. Run from the repository root:

    .venv/bin/python bench/make_requests.py            # examples/serving/requests.csv
    .venv/bin/python bench/make_requests.py --out /tmp/r.csv --seed 3 --days 2
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

STEP_S = 60
DAY_S = 86_400
SHIFT_H = 6.0


@dataclass(frozen=True)
class Shape:
    """One service's curve: weekday peak (requests/s), peak hour, bump width (hours), night
    floor (share of the peak), weekend factor, and bursts in the week."""

    name: str
    peak_rps: float
    peak_hour: float
    width_h: float
    floor: float
    weekend: float
    bursts: int


SHAPES = (
    Shape("chat", peak_rps=30.0, peak_hour=15.0, width_h=3.5, floor=0.12, weekend=0.55, bursts=4),
    Shape("embed", peak_rps=240.0, peak_hour=10.5, width_h=2.5, floor=0.2, weekend=0.35, bursts=3),
)


def diurnal(shape: Shape, t: np.ndarray) -> np.ndarray:
    """The noiseless curve at times ``t`` (seconds from Monday 00:00)."""
    hour = (t % DAY_S) / 3600.0
    away = np.abs(hour - shape.peak_hour)
    away = np.minimum(away, 24.0 - away)  # wrap round midnight
    bump = np.exp(-0.5 * (away / shape.width_h) ** 2)
    day = t // DAY_S
    today = np.where(day % 7 < 5, 1.0, shape.weekend)
    yesterday = np.where((day - 1) % 7 < 5, 1.0, shape.weekend)
    into = np.clip(hour / SHIFT_H, 0.0, 1.0)  # the day's level takes over by SHIFT_H o'clock
    level = yesterday + (today - yesterday) * into
    return shape.peak_rps * level * (shape.floor + (1.0 - shape.floor) * bump)


def noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """Multiplicative noise: a slow AR(1) wander in log times 3% white noise."""
    shocks = rng.normal(0.0, 0.012, n)
    wander = np.empty(n)
    x = 0.0
    for i in range(n):
        x = 0.98 * x + shocks[i]
        wander[i] = x
    return np.exp(wander) * (1.0 + rng.normal(0.0, 0.03, n))


def bursts(rng: np.random.Generator, shape: Shape, days: int, n: int) -> np.ndarray:
    """A factor per step, 1 outside ``shape.bursts`` surges placed in daytime (9-19 h)."""
    factor = np.ones(n)
    for _ in range(shape.bursts):
        day = int(rng.integers(days))
        start = (day * DAY_S + int(rng.uniform(9, 19) * 3600)) // STEP_S
        height = float(rng.uniform(0.35, 0.5))
        hold = int(rng.integers(4, 13))
        ramp = np.concatenate(
            [np.linspace(0.5, 1.0, 2), np.ones(hold), np.linspace(0.8, 0.0, 5, endpoint=False)]
        )
        end = min(start + len(ramp), n)
        factor[start:end] = np.maximum(factor[start:end], 1.0 + height * ramp[: end - start])
    return factor


def rates(shape: Shape, days: int, rng: np.random.Generator) -> np.ndarray:
    """One service's rate at each step of ``days`` days."""
    t = np.arange(days * DAY_S // STEP_S, dtype=np.float64) * STEP_S
    curve = diurnal(shape, t) * noise(rng, len(t)) * bursts(rng, shape, days, len(t))
    out: np.ndarray = np.maximum(curve, 0.0)
    return out


def write(path: Path, days: int, seed: int) -> None:
    """Write the trace: one row per service per step, sorted by time."""
    rng = np.random.default_rng(seed)
    series = {s.name: rates(s, days, rng) for s in SHAPES}
    lines = ["time_s,service,requests_per_s"]
    for k in range(days * DAY_S // STEP_S):
        lines += [f"{k * STEP_S},{name},{values[k]:.3f}" for name, values in series.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for name, values in series.items():
        print(f"{name}: mean {values.mean():.1f} req/s, peak {values.max():.1f} req/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("examples/serving/requests.csv"))
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--seed", type=int, default=20240)
    args = parser.parse_args()
    write(args.out, args.days, args.seed)


if __name__ == "__main__":
    main()
