"""A job's GPUs in words, whole or parts of one, as every view prints them, and the part a
stored spec asks for."""

from __future__ import annotations

from pathlib import Path

import pytest

from boltforge.spec.job import load_job
from boltforge.wire.gpuamount import gpu_amount, gpu_part

EXAMPLES = Path(__file__).parents[3] / "examples"


@pytest.mark.parametrize(
    ("gpus", "part", "replicas", "words", "column"),
    [
        (8, "", 2, "8 GPU(s)", "8"),
        (0, "", 1, "0 GPU(s)", "0"),
        (0, "0.25", 1, "0.25 GPU", "0.25"),
        (0, "0.25", 4, "4 x 0.25 GPU", "4x0.25"),
        (0, "1g.10gb", 1, "MIG 1g.10gb", "1g.10gb"),
        (0, "3g.40gb", 2, "2 x MIG 3g.40gb", "2x3g.40gb"),
    ],
)
def test_whole_gpus_and_parts_of_one_in_words(
    gpus: int, part: str, replicas: int, words: str, column: str
) -> None:
    assert gpu_amount(gpus, part, replicas) == words
    assert gpu_amount(gpus, part, replicas, unit=False) == column


@pytest.mark.parametrize(
    ("example", "part"),
    [
        ("sharing/small-inference.yaml", "0.25"),
        ("sharing/notebook.yaml", "1g.10gb"),
        ("jobs/train-low.yaml", ""),
    ],
)
def test_the_part_is_read_from_the_spec_as_the_server_stores_it(example: str, part: str) -> None:
    stored = load_job(EXAMPLES / example).model_dump(mode="json", exclude_defaults=True)
    assert gpu_part(stored) == part


def test_a_gang_of_roles_takes_the_first_roles_part() -> None:
    spec = {"roles": [{"name": "cpu"}, {"name": "infer", "gpu": {"fraction": 0.5}}]}
    assert gpu_part(spec) == "0.5"
