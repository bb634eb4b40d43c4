"""MIG geometry: NVIDIA's placement table per model, and carves that stay valid."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.sharing import mig

MODELS = sorted(mig.MODELS)


@pytest.mark.parametrize("model", MODELS)
def test_every_profile_fits_eight_slices_at_each_allowed_start(model: str) -> None:
    for prof in mig.MODELS[model].values():
        assert all(s >= 0 and s + prof.size <= mig.SLICES for s in prof.starts)
        assert mig.valid(model, (mig.Instance(prof.starts[-1], prof.name),))


def test_the_a100_80gb_table_is_nvidias() -> None:
    table = {p.name: (p.compute, p.size, p.starts) for p in mig.MODELS["A100-80GB"].values()}
    assert table == {
        "1g.10gb": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
        "1g.20gb": (1, 2, (0, 2, 4, 6)),
        "2g.20gb": (2, 2, (0, 2, 4)),
        "3g.40gb": (3, 4, (0, 4)),
        "4g.40gb": (4, 4, (0,)),
        "7g.80gb": (7, 8, (0,)),
    }
    assert "1g.5gb" in mig.MODELS["A100-40GB"] and "7g.40gb" in mig.MODELS["A100-40GB"]


@pytest.mark.parametrize(
    ("gpu", "memory", "model"),
    [
        ("A100-80GB", 80, "A100-80GB"),
        ("A100", 40, "A100-40GB"),
        ("H100-80GB", 80, "H100-80GB"),
        ("V100-32GB", 32, None),
        ("H100", 94, None),
    ],
)
def test_model_of_names_the_mig_table_by_gpu_and_memory(
    gpu: str, memory: float, model: str | None
) -> None:
    assert mig.model_of(gpu, memory) == model


@pytest.mark.parametrize(
    ("carve", "problem"),
    [
        ((mig.Instance(1, "3g.40gb"),), "may start at slice (0, 4), not 1"),
        ((mig.Instance(0, "4g.40gb"), mig.Instance(2, "2g.20gb")), "overlaps"),
        ((mig.Instance(0, "5g.50gb"),), "has no MIG profile"),
    ],
)
def test_invalid_carves_say_why(carve: mig.Carve, problem: str) -> None:
    assert problem in " ".join(mig.problems("A100-80GB", carve))


def test_seven_small_instances_or_one_whole_gpu_fill_it() -> None:
    assert len(mig.layout("H100-80GB", ["1g.10gb"] * 7)) == 7
    assert mig.add("H100-80GB", mig.layout("H100-80GB", ["1g.10gb"] * 7), "1g.10gb") is None
    assert mig.add("H100-80GB", mig.layout("H100-80GB", ["7g.80gb"]), "1g.10gb") is None
    with pytest.raises(ValueError, match="does not fit"):
        mig.layout("A100-80GB", ["4g.40gb", "4g.40gb"])


def test_a_small_instance_goes_where_it_leaves_room_for_large_ones() -> None:
    first = mig.add("A100-80GB", (), "1g.10gb")
    assert first is not None and first.start == 6  # 3g.40gb at 0 and 4g.40gb stay possible
    assert mig.add("A100-80GB", (first,), "4g.40gb") == mig.Instance(0, "4g.40gb")


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(MODELS),
    st.lists(st.sampled_from(["1", "1+", "2", "3", "4", "7"]), max_size=12),
)
def test_adding_instances_one_by_one_never_makes_an_invalid_carve(
    model: str, sizes: list[str]
) -> None:
    names = {p.size * 10 + p.compute: p.name for p in mig.MODELS[model].values()}
    by_key = {"1": 11, "1+": 21, "2": 22, "3": 43, "4": 44, "7": 87}
    carve: mig.Carve = ()
    for key in sizes:
        inst = mig.add(model, carve, names[by_key[key]])
        if inst is not None:
            carve = tuple(sorted((*carve, inst)))
        assert mig.valid(model, carve)
    compute = sum(mig.profile(model, i.profile).compute for i in carve)
    assert compute <= 7
