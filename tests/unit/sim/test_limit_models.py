"""Time limits as users give them: the Boltforge CSV's ``time_limit_s`` column, used as given
and checked like the other columns; the ``user`` limit model (seeded, popular values or the
maximum, never below the runtime, about ``MAX_SHARE`` at the maximum); and ``bolt simulate
--limit-model`` reaching the replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import boltforge.cli.simulate as simulate_module
from boltforge.cli.main import app
from boltforge.cli.simulate import SimulationRun
from boltforge.core.policy import named
from boltforge.sim.engine import SimConfig, Simulation
from boltforge.sim.jobs import time_limit
from boltforge.sim.limits import (
    MAX_LIMIT_S,
    MAX_SHARE,
    POPULAR_HOURS,
    chosen_limits,
    user_limits,
)
from boltforge.sim.records import SimResult, TraceJob
from boltforge.sim.traces import TraceError, read_csv
from boltforge.spec.fleet import load_fleet
from boltforge.testing.builders import make_fleet

LAB = Path(__file__).resolve().parents[3] / "examples" / "fleets" / "lab.yaml"
HEADER = "job_id,submit_s,duration_s,gpus,team,time_limit_s\n"
ALLOWED = {h * 3600.0 for h in POPULAR_HOURS} | {MAX_LIMIT_S}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text, encoding="utf-8")
    return path


def jobs(count: int, seed: int = 0) -> list[TraceJob]:
    """``count`` jobs of 1 minute to 24 hours (log-uniform), so that no overestimate passes
    the largest popular value below the maximum (4 x 24 h < 336 h)."""
    runtimes = np.exp(np.random.default_rng(seed).uniform(np.log(60), np.log(86400), count))
    return [TraceJob(f"j{i}", float(i), float(r), 1, "t") for i, r in enumerate(runtimes)]


# --- the CSV column --------------------------------------------------------------------------


def test_the_csv_limit_is_read_as_given_and_a_blank_or_missing_one_is_none(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, HEADER + "a,0,100,1,x,7200\nb,5,100,1,x,\nc,9,100,1,x, 90.5 \n")
    limits = {j.id: j.time_limit_s for j in read_csv(path)}
    assert limits == {"a": 7200.0, "b": None, "c": 90.5}
    plain = write(tmp_path, "job_id,submit_s,duration_s,gpus\na,0,100,1\n")
    assert read_csv(plain)[0].time_limit_s is None


def test_a_csv_limit_survives_sorting_and_replaces_the_derived_one(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "late,50,100,1,x,1234\nearly,0,100,1,x,\n")
    trace = read_csv(path)
    assert [(j.id, j.time_limit_s) for j in trace] == [("early", None), ("late", 1234.0)]
    for model in ("derived", "user"):
        assert chosen_limits(trace, model, 0)["late"] == 1234.0
    assert "early" not in chosen_limits(trace, "derived", 0)


@pytest.mark.parametrize(
    ("cell", "problem"),
    [
        ("-5", "must be more than 0 seconds"),
        ("0", "must be more than 0 seconds"),
        ("soon", "must be a number of seconds"),
        ("inf", "must be a number of seconds"),
        ("nan", "must be a number of seconds"),
    ],
)
def test_a_bad_csv_limit_names_the_row_the_column_and_the_fix(
    tmp_path: Path, cell: str, problem: str
) -> None:
    path = write(tmp_path, HEADER + f"a,0,100,1,x,3600\nb,1,100,1,x,{cell}\n")
    with pytest.raises(TraceError) as caught:
        read_csv(path)
    error = caught.value
    assert (error.row, error.line, error.column, error.value) == (2, 3, "time_limit_s", cell)
    assert problem in str(error)
    assert "row 2 (line 3), column 'time_limit_s'" in str(error)
    assert "To fix: write the limit in seconds, e.g. 86400, or leave the cell empty" in str(error)


# --- the user model --------------------------------------------------------------------------


def test_the_user_model_is_the_same_for_the_same_seed_and_changes_with_it() -> None:
    trace = jobs(500)
    assert user_limits(trace, 7) == user_limits(list(trace), 7)
    assert user_limits(trace, 7) != user_limits(trace, 8)


def test_user_limits_are_popular_values_or_the_maximum_and_never_below_the_runtime() -> None:
    trace = jobs(5000)
    limits = user_limits(trace, 3)
    assert set(limits) <= ALLOWED
    assert all(limit >= t.duration_s for t, limit in zip(trace, limits, strict=True))
    assert len(set(limits)) > 10  # spread over the popular values, not one or two


def test_about_the_documented_share_of_jobs_ask_for_the_maximum() -> None:
    limits = user_limits(jobs(20000), 11)
    share = sum(limit == MAX_LIMIT_S for limit in limits) / len(limits)
    assert share == pytest.approx(MAX_SHARE, abs=0.01)


def test_users_overestimate_more_than_the_derived_rule() -> None:
    trace = jobs(5000)
    user = np.array(user_limits(trace, 0))
    derived = np.array([time_limit(t.duration_s) for t in trace])
    runtimes = np.array([t.duration_s for t in trace])
    assert np.median(user / runtimes) > np.median(derived / runtimes)


def test_a_job_longer_than_the_maximum_gets_its_runtime() -> None:
    long = TraceJob("long", 0.0, MAX_LIMIT_S * 2, 1, "t")
    assert user_limits([long], 0) == [MAX_LIMIT_S * 2]


def test_an_unknown_model_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown limit model 'oracle'"):
        chosen_limits(jobs(3), "oracle", 0)


# --- the replay and the command --------------------------------------------------------------


def replay_limits(trace: list[TraceJob], **config: object) -> dict[str, float | None]:
    sim = Simulation(make_fleet(racks=1, hosts=1), trace, SimConfig(named("fifo"), **config))  # type: ignore[arg-type]
    sim.run()
    return {key: job.time_limit for key, job in sim.jobs.items()}


def test_the_replay_uses_the_model_the_config_names_and_no_limits_wins() -> None:
    trace = [*jobs(20), TraceJob("own", 30.0, 100.0, 1, "t", time_limit_s=50.0)]
    derived = replay_limits(trace, failures_per_1000_gpu_day=0.0)
    assert derived == {t.id: t.time_limit_s or time_limit(t.duration_s) for t in trace}
    user = replay_limits(trace, failures_per_1000_gpu_day=0.0, limit_model="user", seed=4)
    assert user == chosen_limits(trace, "user", 4)
    assert user["own"] == 50.0
    none = replay_limits(
        trace, failures_per_1000_gpu_day=0.0, limit_model="user", time_limits=False
    )
    assert set(none.values()) == {None}


def recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, float | None]]:
    """Replays in this process, recording each run's job limits."""
    seen: list[dict[str, float | None]] = []

    def run_all(runs: list[SimulationRun], workers: int) -> dict[str, SimResult]:
        out = {}
        for run in runs:
            sim = Simulation(load_fleet(run.fleet), run.trace, run.config)
            out[run.label] = sim.run()
            seen.append({key: job.time_limit for key, job in sim.jobs.items()})
        return out

    monkeypatch.setattr(simulate_module, "_run_all", run_all)
    return seen


def test_the_command_passes_the_limit_model_and_the_seed_to_the_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = "".join(f"j{i},{60 * i},{1800 + 300 * i},1,x,\n" for i in range(8))
    path = write(tmp_path, HEADER + rows + "own,600,900,1,x,4000\n")
    seen = recorded(monkeypatch)
    args = ["simulate", "--fleet", str(LAB), "--trace", str(path), "--policy", "fifo", "--json"]
    for extra in (
        ["--limit-model", "user", "--seed", "5"],
        [],
        ["--limit-model", "user", "--no-time-limits"],
    ):
        result = CliRunner().invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
    user, derived, none = seen
    trace = read_csv(path)
    assert user == chosen_limits(trace, "user", 5)
    assert derived == {t.id: t.time_limit_s or time_limit(t.duration_s) for t in trace}
    assert set(none.values()) == {None}


def test_an_unknown_limit_model_exits_2_naming_the_known_ones(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "a,0,100,1,x,\n")
    result = CliRunner().invoke(
        app, ["simulate", "--fleet", str(LAB), "--trace", str(path), "--limit-model", "oracle"]
    )
    assert result.exit_code == 2
    assert "--limit-model" in result.output and "derived, user" in result.output
