"""Fleet specs (pools laid out into pods, racks and hosts, crossing weights, spot reclaims),
the teams file (guarantees, bursts, lending, budgets), and the shipped examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from boltforge.core.model.levels import DEFAULT_WEIGHTS
from boltforge.core.model.topology import Tier
from boltforge.core.queueing.lending import DAY_S, LendRule
from boltforge.core.queueing.quota import ANY, QuotaTree
from boltforge.spec.errors import SpecError
from boltforge.spec.fleet import MAX_HOSTS, Layout, load_fleet, load_fleet_spec, parse_fleet
from boltforge.spec.job import load_job
from boltforge.spec.state import load_state
from boltforge.spec.teams import load_teams, parse_teams
from boltforge.wire.agent import Inventory

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def pool(name: str = "h100", **fields: Any) -> dict[str, Any]:
    return {"name": name, "gpu": "H100-80GB", "gpu_memory_gb": 80, **fields}


def fleet(*pools: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"name": "f", "pools": list(pools) or [pool()], **fields}


def fleet_error(data: object) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_fleet(data, "fleet.yaml")
    return caught.value


def teams_error(data: object) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_teams(data, "teams.yaml")
    return caught.value


# --- layout ----------------------------------------------------------------------------------


def test_pods_racks_and_hosts_multiply_into_the_host_count() -> None:
    layout = Layout(pods=2, racks_per_pod=3, hosts_per_rack=4)
    assert layout.host_count == 24
    places = layout.places()
    assert places[0] == (0, 0, 0) and places[4] == (0, 1, 0) and places[12] == (1, 0, 0)
    assert len(set(places)) == 24


def test_a_host_total_fills_racks_then_pods_in_order_leaving_the_last_partial() -> None:
    layout = Layout(hosts=5, hosts_per_rack=2, racks_per_pod=2)
    assert layout.places() == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0)]


def test_the_tree_names_hosts_by_pool_pod_rack_and_host() -> None:
    layout = {"pods": 2, "racks_per_pod": 2, "hosts_per_rack": 3}
    tree = parse_fleet(fleet(pool(layout=layout))).to_tree()
    assert tree.name == "f"
    assert len(tree.hosts) == 12 and tree.total_gpus == 96
    assert len(tree.rack_names) == 4 and len(tree.pod_names) == 2
    assert {"h100-p0-r00-h00", "h100-p1-r01-h02"} <= set(tree.host_index)


def test_pool_defaults_fill_the_island_and_rails_from_the_host() -> None:
    (p,) = parse_fleet(fleet(pool(gpus_per_host=4))).to_tree().pools
    assert (p.gpus_per_host, p.island_size, p.rails) == (4, 4, 4)
    assert (p.tier, p.cpus, p.memory_gb, p.price_per_gpu_hour) == (Tier.ON_DEMAND, 128, 1024, 0)


def test_a_cpu_pool_needs_no_gpu_model_and_is_named_cpu() -> None:
    spec = parse_fleet(fleet(pool(), {"name": "cpu", "gpus_per_host": 0, "cpus": 64}))
    tree = spec.to_tree()
    assert [p.gpu_type for p in tree.pools] == ["H100-80GB", "cpu"]
    assert (tree.pools[1].island_size, tree.pools[1].rails) == (1, 1)
    assert tree.total_gpus == 8


def test_weights_default_to_the_cores_and_may_be_overridden_in_order() -> None:
    default = parse_fleet(fleet()).weights.to_weights()
    assert {k: getattr(default, k) for k in DEFAULT_WEIGHTS} == DEFAULT_WEIGHTS
    custom = parse_fleet(fleet(weights={"pod": 50, "spine": 100})).to_tree().weights
    assert (custom.pod, custom.spine, custom.rack) == (50, 100, DEFAULT_WEIGHTS["rack"])


def test_a_spot_pool_replays_reclaims_with_durations_in_seconds() -> None:
    reclaim = {"rate_per_host_day": 0.1, "notice": "2m", "back_after": "1h"}
    (p,) = parse_fleet(fleet(pool(tier="spot", reclaim=reclaim))).pools
    assert p.reclaim is not None
    assert (p.reclaim.rate_per_host_day, p.reclaim.notice, p.reclaim.back_after) == (
        0.1,
        120.0,
        3600.0,
    )
    (default,) = parse_fleet(fleet(pool(tier="spot", reclaim={"rate_per_host_day": 1}))).pools
    assert default.reclaim is not None
    assert (default.reclaim.notice, default.reclaim.back_after) == (120.0, 7200.0)


# --- fleet mistakes --------------------------------------------------------------------------


BAD_FLEETS = [
    pytest.param(
        fleet(pool(name="H100")),
        "fleet.pools[0].name",
        "e.g. `h100`",
        id="a pool name in capitals",
    ),
    pytest.param(
        fleet(pool(gpu_memory_gb=0)),
        "fleet.pools[0]",
        "add e.g. `gpu_memory_gb: 80`",
        id="a GPU pool without GPU memory",
    ),
    pytest.param(
        fleet(pool(gpus_per_host=65)),
        "fleet.pools[0].gpus_per_host",
        "To fix: change the value",
        id="more than 64 GPUs a host",
    ),
    pytest.param(
        fleet(pool(nvlink_island=3)),
        "fleet.pools[0]",
        "use a divisor such as 4",
        id="an island that does not divide the host",
    ),
    pytest.param(
        fleet(pool(reclaim={"rate_per_host_day": 1})),
        "fleet.pools[0]",
        "set `tier: spot` or remove `reclaim`",
        id="reclaims on a pool that is not spot",
    ),
    pytest.param(
        fleet(pool(tier="spot", reclaim={"rate_per_host_day": -1})),
        "fleet.pools[0].reclaim.rate_per_host_day",
        "To fix",
        id="a negative reclaim rate",
    ),
    pytest.param(
        fleet(pool(tier="preemptible")),
        "fleet.pools[0].tier",
        "'spot'",
        id="an unknown tier",
    ),
    pytest.param(
        fleet(pool(layout={"racks": 2})),
        "fleet.pools[0].layout.racks",
        "check its spelling",
        id="a misspelt layout field",
    ),
    pytest.param(
        fleet(pool(layout={"hosts_per_rack": 0})),
        "fleet.pools[0].layout.hosts_per_rack",
        "To fix",
        id="racks with no hosts",
    ),
    pytest.param(
        fleet(pool("a"), pool("b"), pool("a")),
        "fleet",
        "pool names repeat: a. To fix: rename them",
        id="a repeated pool name",
    ),
    pytest.param(
        fleet(pool(layout={"hosts": MAX_HOSTS + 1})),
        "fleet",
        f"{MAX_HOSTS + 1} hosts is more than {MAX_HOSTS}. To fix: split the fleet",
        id="too many hosts",
    ),
    pytest.param(
        fleet(weights={"host": 0.5}),
        "fleet.weights",
        "order them nvlink <= host <= rack <= pod <= spine",
        id="a host hop cheaper than NVLink",
    ),
    pytest.param(
        fleet(weights={"rail": 0}),
        "fleet.weights.rail",
        "To fix",
        id="a zero weight",
    ),
    pytest.param(
        {"pools": [pool()]}, "fleet.name", "is required. To fix: add it", id="a fleet without name"
    ),
]


@pytest.mark.parametrize(("data", "field", "fix"), BAD_FLEETS)
def test_a_bad_fleet_names_the_field_and_the_fix(
    data: dict[str, Any], field: str, fix: str
) -> None:
    error = fleet_error(data)
    assert [p.field for p in error.problems] == [field]
    assert fix in error.problems[0].message
    assert "Traceback" not in error.render()


def test_the_largest_fleet_allowed_is_accepted() -> None:
    spec = parse_fleet(fleet(pool(gpus_per_host=0, gpu="", layout={"hosts": MAX_HOSTS})))
    assert spec.pools[0].layout.host_count == MAX_HOSTS


def test_a_fleet_that_is_not_a_mapping_is_refused() -> None:
    (problem,) = fleet_error(["h100"]).problems
    assert (problem.field, problem.value, problem.message) == ("fleet", "list", "must be a mapping")


# --- the teams file --------------------------------------------------------------------------


@pytest.mark.parametrize("data", [None, {}], ids=["an empty file", "an empty mapping"])
def test_an_empty_teams_file_has_no_quotas_or_budgets_and_the_default_lending(
    data: dict[str, Any] | None,
) -> None:
    spec = parse_teams(data)
    assert (spec.queues(), spec.budgets(), spec.lend_rules()) == ([], {}, {})
    assert spec.lending.rule() == LendRule(0.5, DAY_S)


def test_a_number_means_any_pool_and_a_mapping_gives_pools_their_own() -> None:
    spec = parse_teams(
        {
            "teams": {
                "vision": {"quota": {"guaranteed": {"h100": 8, "a100": 4}, "burst": {"h100": 16}}},
                "nlp": {"quota": {"guaranteed": 64, "burst": 128}},
                "adhoc": {"quota": {"burst": 8}},
                "guests": {},
            }
        }
    )
    queues = {q.path: (q.guaranteed, q.burst) for q in spec.queues()}
    assert queues == {
        "adhoc": ({}, {ANY: 8}),
        "nlp": ({ANY: 64}, {ANY: 128}),
        "vision": ({"h100": 8, "a100": 4}, {"h100": 16}),
    }
    assert [q.path for q in spec.queues()] == ["adhoc", "nlp", "vision"]
    assert QuotaTree.build(spec.queues()) is not None


def test_only_teams_with_a_guarantee_lend_by_their_own_rule_or_the_default() -> None:
    spec = parse_teams(
        {
            "lending": {"below": 0.25, "after": "12h"},
            "teams": {
                "nlp": {"quota": {"guaranteed": 64}, "lending": {"below": 0, "after": "1h"}},
                "vision": {"quota": {"guaranteed": 8}},
                "adhoc": {"quota": {"guaranteed": 0, "burst": 16}},
            },
        }
    )
    assert spec.lend_rules() == {"nlp": LendRule(0.0, 3600.0), "vision": LendRule(0.25, 43200.0)}


def test_budgets_warn_at_their_soft_share() -> None:
    spec = parse_teams(
        {
            "teams": {
                "nlp": {"budget": {"monthly": 10000}},
                "cv": {"budget": {"monthly": 100, "soft": 1}},
            }
        }
    )
    budgets = spec.budgets()
    assert (budgets["nlp"].soft, budgets["nlp"].soft_dollars) == (0.8, 8000.0)
    assert budgets["cv"].soft_dollars == 100.0


BAD_TEAMS = [
    pytest.param(
        {"teams": {"nlp": {"quota": {"guaranteed": 64, "burst": 32}}}},
        "teams.nlp.quota",
        "raise the burst to at least 64 or lower the guarantee",
        id="a burst below the guarantee",
    ),
    pytest.param(
        {"teams": {"nlp": {"quota": {"guaranteed": -1}}}},
        "teams.nlp.quota",
        "use 0 or more GPUs",
        id="a negative guarantee",
    ),
    pytest.param(
        {"teams": {"nlp": {"budget": {"monthly": 0}}}},
        "teams.nlp.budget.monthly",
        "To fix",
        id="a budget of nothing",
    ),
    pytest.param(
        {"teams": {"nlp": {"budget": {"monthly": 10, "soft": 1.5}}}},
        "teams.nlp.budget.soft",
        "To fix",
        id="a soft share above the whole",
    ),
    pytest.param(
        {"teams": {"nlp": {"lending": {"below": 2}}}},
        "teams.nlp.lending.below",
        "To fix",
        id="a lending share above the whole",
    ),
    pytest.param(
        {"teams": {"nlp": {"quota": {"guaranteed": 8, "borrow": 8}}}},
        "teams.nlp.quota.borrow",
        "check its spelling",
        id="a misspelt quota field",
    ),
    pytest.param(
        {"teams": {"NLP": {}}},
        "teams.NLP.[key]",
        "`llama-pretrain`",
        id="a team name in capitals",
    ),
]


@pytest.mark.parametrize(("data", "field", "fix"), BAD_TEAMS)
def test_a_bad_teams_file_names_the_field_and_the_fix(
    data: dict[str, Any], field: str, fix: str
) -> None:
    error = teams_error(data)
    assert [p.field for p in error.problems] == [field]
    assert fix in error.problems[0].message
    assert error.render().startswith("teams.yaml: 1 problem(s)")


def test_a_teams_file_that_is_not_a_mapping_is_reported_at_the_top_level() -> None:
    (problem,) = teams_error(["nlp"]).problems
    assert problem.field == "(top level)"


# --- the shipped examples --------------------------------------------------------------------


FLEET_FILES = sorted((EXAMPLES / "fleets").rglob("*.yaml"))
JOB_FILES = sorted([*(EXAMPLES / "jobs").glob("*.yaml"), *(EXAMPLES / "forge").glob("*.yaml")])
NODE_FILES = sorted((EXAMPLES / "nodes").glob("*.yaml"))


def test_the_examples_are_there_to_check() -> None:
    assert len(FLEET_FILES) >= 5 and len(JOB_FILES) >= 5 and len(NODE_FILES) >= 1


@pytest.mark.parametrize("path", FLEET_FILES, ids=lambda p: p.stem)
def test_every_example_fleet_builds(path: Path) -> None:
    spec = load_fleet_spec(path)
    tree = spec.to_tree()
    assert tree.name == spec.name
    assert len(tree.hosts) == sum(p.layout.host_count for p in spec.pools)
    assert tree.total_gpus == sum(p.layout.host_count * p.gpus_per_host for p in spec.pools)


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.stem)
def test_every_example_job_is_a_valid_spec(path: Path) -> None:
    spec = load_job(path)
    assert spec.name and spec.team
    assert spec.roles or spec.total_gpus()[0] > 0 or spec.cpus > 0 or spec.storage_gb > 0


def test_the_example_teams_file_sets_quotas_and_budgets() -> None:
    spec = load_teams(EXAMPLES / "teams.yaml")
    assert {q.path: (q.guaranteed, q.burst) for q in spec.queues()} == {
        "nlp": ({ANY: 8}, {ANY: 24}),
        "research": ({ANY: 16}, {ANY: 32}),
    }
    assert {name: b.monthly for name, b in spec.budgets().items()} == {
        "research": 20000,
        "nlp": 8000,
    }
    assert spec.lend_rules()["nlp"] == LendRule(0.5, DAY_S)


def test_the_example_state_occupies_the_lab_fleet() -> None:
    lab = load_fleet(EXAMPLES / "fleets" / "lab.yaml")
    state = load_state(EXAMPLES / "states" / "lab-busy.yaml", lab)
    assert 0 < state.free_gpus < lab.total_gpus


@pytest.mark.parametrize("path", NODE_FILES, ids=lambda p: p.stem)
def test_every_example_node_inventory_is_valid(path: Path) -> None:
    inventory = Inventory.model_validate(yaml.safe_load(path.read_text()))
    assert inventory.name == path.stem and inventory.gpus >= 0
