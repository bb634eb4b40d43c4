"""Specs that share GPUs: a job asks for a MIG profile or a fraction, a pool declares MIG and
its layout; every mistake is refused naming the field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from boltforge.core.sharing.share import ShareAsk
from boltforge.spec.errors import SpecError
from boltforge.spec.fleet import load_fleet, parse_fleet
from boltforge.spec.job import parse_job
from boltforge.spec.resolve import to_gang

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "sharing"
BASE: dict[str, Any] = {"name": "nb", "team": "research", "command": "jupyter lab"}
POOL: dict[str, Any] = {"name": "a100", "gpu": "A100-80GB", "gpu_memory_gb": 80, "mig": True}


@pytest.mark.parametrize(
    ("gpu", "ask"),
    [
        ("1g.10gb", ShareAsk("1g.10gb")),
        ({"mig": "3g.40gb", "types": ["A100"]}, ShareAsk("3g.40gb")),
        ({"fraction": 0.25, "memory_gb": 16}, ShareAsk(fraction=0.25, memory_gb=16)),
        ({"fraction": 0.5}, ShareAsk(fraction=0.5)),
    ],
)
def test_a_job_asks_for_part_of_a_gpu(gpu: object, ask: ShareAsk) -> None:
    tree = load_fleet(EXAMPLES / "fleet.yaml")
    gang = to_gang(parse_job({**BASE, "gpu": gpu}), tree)
    [role] = gang.roles
    assert role.share == ask and role.gpus == 0 and role.replicas == 1


def test_several_shares_are_a_role_of_replicas() -> None:
    tree = load_fleet(EXAMPLES / "fleet.yaml")
    spec = {**BASE, "roles": [{"name": "infer", "replicas": 3, "gpu": "2g.20gb"}]}
    [role] = to_gang(parse_job(spec), tree).roles
    assert (role.replicas, role.gpus, role.share) == (3, 0, ShareAsk("2g.20gb"))


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"gpu": {"mig": "3g.40gb", "fraction": 0.5}}, "job.gpu", "keep `mig` or `fraction`"),
        ({"gpu": {"memory_gb": 10}}, "job.gpu", "add `fraction: 0.5`"),
        ({"gpu": {"fraction": 1.5}}, "job.gpu.fraction", "less than 1"),
        ({"gpu": {"mig": "big"}}, "job.gpu.mig", "e.g. `1g.10gb`"),
        ({"gpu": "1g.10gb", "gpus": 4}, "job", "use `roles` with `replicas`"),
        (
            {"roles": [{"name": "r", "replicas": 2, "gpus": 2, "gpu": "1g.10gb"}]},
            "job.roles[0]",
            "set `replicas` to the number of shares",
        ),
        ({"kind": "service"}, "job.kind", "bolt serve"),
    ],
)
def test_a_bad_share_names_the_field_and_the_fix(
    change: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job({**BASE, **change})
    [problem] = caught.value.problems
    assert problem.field == field and words in problem.message


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"gpu": "V100-32GB", "gpu_memory_gb": 32}, "has no MIG profiles here"),
        ({"mig_layout": ["4g.40gb", "4g.40gb"]}, "does not fit on one A100-80GB"),
        ({"mig_layout": ["5g.50gb"]}, "has no MIG profile '5g.50gb'"),
        ({"mig": False, "mig_layout": ["1g.10gb"]}, "not `mig: true`"),
    ],
)
def test_a_pool_with_bad_mig_settings_is_refused(change: dict[str, Any], words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_fleet({"name": "lab", "pools": [{**POOL, **change}]})
    [problem] = caught.value.problems
    assert words in problem.message and "To fix" in problem.message


def test_a_pool_declares_its_mig_layout() -> None:
    [pool] = load_fleet(EXAMPLES / "fleet.yaml").pools[:1]
    assert pool.mig and pool.mig_layout == ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
