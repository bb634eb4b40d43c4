"""Compact lists of numbers and host names as Slurm writes them (``0-3,6``, ``host-[0-3,6]``):
sorted, without duplicates, zero padding kept, and always readable back to the same set."""

from __future__ import annotations

import re
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.ranges import hostlist, ranges


def numbers_of(text: str) -> list[int]:
    """Read ``0-3,6`` back into ``[0, 1, 2, 3, 6]`` (a reader written for the test)."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


def hosts_of(text: str) -> list[str]:
    """Read ``a-[0-1,3],b`` back into its names, keeping zero padding."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[]*)\[([^\]]*)\]|([^,]+)", text):
        prefix, spans, plain = m.group(1), m.group(2), m.group(3)
        if plain is not None:
            out.append(plain)
            continue
        for span in spans.split(","):
            low, _, high = span.partition("-")
            width = len(low) if low.startswith("0") and len(low) > 1 else 0
            out += [f"{prefix}{str(n).zfill(width)}" for n in range(int(low), int(high or low) + 1)]
    return out


# --- numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "text"),
    [
        pytest.param([], "", id="nothing"),
        pytest.param([5], "5", id="one"),
        pytest.param([0, 1, 2, 3, 6], "0-3,6", id="a run and a single"),
        pytest.param([6, 3, 1, 2, 0], "0-3,6", id="unsorted"),
        pytest.param([2, 2, 3, 3, 3], "2-3", id="duplicates"),
        pytest.param([1, 3, 5], "1,3,5", id="no runs"),
        pytest.param([7, 8], "7-8", id="a pair is a run"),
        pytest.param([0, 1, 4, 5, 9], "0-1,4-5,9", id="several runs"),
    ],
)
def test_numbers_fold_into_sorted_runs(values: list[int], text: str) -> None:
    assert ranges(values) == text


def test_any_iterable_of_numbers_is_taken_once() -> None:
    assert ranges(iter([4, 3, 2])) == "2-4"
    assert ranges({10, 11, 13}) == "10-11,13"
    assert ranges(range(0, 1000)) == "0-999"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=500), max_size=60))
def test_the_text_reads_back_to_the_same_numbers(values: list[int]) -> None:
    text = ranges(values)
    assert numbers_of(text) == sorted(set(values))
    # each run is as long as it can be: no two parts could be joined
    parts = [numbers_of(p) for p in filter(None, text.split(","))]
    for before, after in pairwise(parts):
        assert after[0] > before[-1] + 1


# --- host names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "text"),
    [
        pytest.param([], "", id="nothing"),
        pytest.param(["host-0"], "host-0", id="one host is not bracketed"),
        pytest.param(["host-0", "host-1", "host-3"], "host-[0-1,3]", id="a shared prefix"),
        pytest.param(["host-3", "host-0", "host-1"], "host-[0-1,3]", id="in any order"),
        pytest.param(["n01", "n02", "n03", "n09"], "n[01-03,09]", id="zero padding kept"),
        pytest.param(["n007"], "n007", id="one padded host"),
        pytest.param(["login", "head"], "login,head", id="names without a number as given"),
        pytest.param(["a-1", "b-1", "a-2"], "a-[1-2],b-1", id="two prefixes"),
        pytest.param(["host-0", "host-0", "host-1"], "host-[0-1]", id="duplicates"),
        pytest.param(["login", "gpu-1", "gpu-2"], "login,gpu-[1-2]", id="plain names come first"),
    ],
)
def test_host_names_fold_by_prefix(names: list[str], text: str) -> None:
    assert hostlist(names) == text


def test_padded_and_unpadded_numbers_of_one_prefix_stay_apart() -> None:
    # ``n01`` and ``n1`` are different hosts: folding them together would lose one
    text = hostlist(["n01", "n02", "n1", "n2"])
    assert text == "n[01-02],n[1-2]"
    assert sorted(hosts_of(text)) == ["n01", "n02", "n1", "n2"]


def test_only_the_trailing_number_is_folded() -> None:
    assert hostlist(["r1-h1", "r1-h2", "r2-h1"]) == "r1-h[1-2],r2-h1"


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["gpu-", "cpu", "rack1-h"]), st.integers(0, 40)),
        min_size=1,
        max_size=30,
    )
)
def test_the_host_list_reads_back_to_the_same_hosts(picks: list[tuple[str, int]]) -> None:
    names = [f"{prefix}{n}" for prefix, n in picks]
    assert sorted(hosts_of(hostlist(names))) == sorted(set(names))
