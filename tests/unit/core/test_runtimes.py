"""Runtime estimates learned from jobs that finished: the most specific history that has
seen enough runs speaks, as a high quantile of its recent runtimes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from boltforge.core.queueing.runtimes import KEEP, MIN_RUNS, SPREAD, Finished, RuntimeHistory


def history(*runs: tuple[str, str, int, float]) -> RuntimeHistory:
    h = RuntimeHistory()
    h.learn_all(Finished(team, name, gpus, runtime) for team, name, gpus, runtime in runs)
    return h


def test_no_estimate_until_enough_jobs_like_it_finished() -> None:
    h = history(*[("vision", "resnet", 8, 600.0)] * (MIN_RUNS - 1))
    assert h.estimate("vision", "resnet", 8) is None
    h.learn(Finished("vision", "resnet", 8, 600.0))
    assert h.estimate("vision", "resnet", 8) == 600.0


def test_the_estimate_is_a_high_quantile_so_most_runs_end_before_it() -> None:
    h = history(*[("vision", "resnet", 8, float(s)) for s in range(10, 20)])
    assert h.estimate("vision", "resnet", 8) == 18.0  # nearest rank 90%: 9 of 10 end by it


def test_runs_that_do_not_agree_predict_nothing() -> None:
    """Minutes one time and days the next: no estimate, rather than a misleading one."""
    h = history(*[("nlp", "sweep", 8, s) for s in (60.0, 600.0, 6_000.0, 60_000.0)])
    assert h.estimate("nlp", "sweep", 8) is None


def test_a_key_whose_runs_disagree_gives_way_to_a_wider_one_that_agrees() -> None:
    h = history(
        *[("nlp", "eval", 8, 100.0)] * MIN_RUNS,
        *[("nlp", "sweep", 8, s) for s in (10.0, 100.0, 1_000.0)],
    )
    assert h.estimate("nlp", "sweep", 8) is None  # the team's 8-GPU jobs disagree too
    h.learn_all(Finished("nlp", "eval", 8, 100.0) for _ in range(KEEP))
    assert h.estimate("nlp", "sweep", 8) == 100.0


def test_the_most_specific_key_with_enough_runs_speaks() -> None:
    h = history(
        *[("vision", "resnet", 8, 600.0)] * MIN_RUNS,
        *[("vision", "bert", 8, 500.0)] * MIN_RUNS,
        ("vision", "vit", 8, 5.0),
    )
    assert h.estimate("vision", "resnet", 8) == 600.0
    assert h.estimate("vision", "bert", 8) == 500.0
    # vit has one run: its team's 8-GPU jobs speak for it.
    assert h.estimate("vision", "vit", 8) == 600.0
    # another size falls back to the team as a whole; another team knows nothing.
    assert h.estimate("vision", "resnet", 16) == 600.0
    assert h.estimate("speech", "resnet", 8) is None


def test_only_recent_runs_count() -> None:
    h = history(*[("nlp", "gpt", 64, 86_400.0)] * KEEP, *[("nlp", "gpt", 64, 3_600.0)] * KEEP)
    assert h.estimate("nlp", "gpt", 64) == 3_600.0


def test_a_job_that_never_ran_teaches_nothing() -> None:
    h = history(*[("nlp", "gpt", 8, 0.0)] * MIN_RUNS)
    assert h.estimate("nlp", "gpt", 8) is None


@given(st.lists(st.floats(1.0, 1e6), min_size=MIN_RUNS, max_size=3 * KEEP))
def test_an_estimate_is_a_recent_runtime_that_covers_most_of_them_and_they_agree(
    runtimes: list[float],
) -> None:
    h = history(*[("t", "j", 1, r) for r in runtimes])
    found = h.estimate("t", "j", 1)
    recent = sorted(runtimes[-KEEP:])
    middle = recent[(len(recent) - 1) // 2]
    if found is None:
        assert sum(r <= SPREAD * middle for r in recent) < 0.9 * len(recent)
    else:
        assert found in recent
        assert found <= SPREAD * middle
        assert sum(r <= found for r in recent) >= 0.9 * len(recent)


# --- what jobs making the same claim typically took --------------------------------------------

DAY = 86400.0


def test_jobs_asking_for_the_same_limit_are_judged_by_what_such_jobs_took() -> None:
    """Users who ask for a day and run an hour teach the history that a day means an hour."""
    h = RuntimeHistory()
    for runtime in (3000.0, 3600.0, 4000.0):
        h.learn(Finished("nlp", "", 8, runtime, limit_s=DAY))
    assert h.typical("nlp", "", 8, DAY) == 3600.0
    assert h.typical("vision", "", 1, DAY) == 3600.0  # any team's jobs asking for a day
    assert h.typical("nlp", "", 8, 2 * DAY) is None  # nobody asked for two days yet


def test_a_typical_runtime_is_never_above_the_limit_asked_for() -> None:
    h = RuntimeHistory()
    for runtime in (5000.0, 6000.0, 7000.0):
        h.learn(Finished("nlp", "x", 8, runtime, limit_s=DAY))
    h.learn_all(Finished("nlp", "x", 8, r, limit_s=3600.0) for r in (5000.0, 6000.0, 7000.0))
    assert h.typical("nlp", "x", 8, 3600.0) == 3600.0


def test_jobs_with_no_limit_are_judged_by_jobs_of_their_size_whether_or_not_they_agree() -> None:
    h = history(*[("nlp", "sweep", 8, s) for s in (60.0, 600.0, 6_000.0, 60_000.0)])
    assert h.estimate("nlp", "sweep", 8) is None  # nothing backfill could rely on
    assert h.typical("nlp", "sweep", 8, None) == 600.0  # the lower median, to rank by
    assert h.typical("other", "job", 8, None) == 600.0  # any team's jobs of 8 GPUs
    assert h.typical("other", "job", 1, None) is None
