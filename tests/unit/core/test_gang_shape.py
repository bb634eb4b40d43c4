"""A gang's shape: what placement depends on, one object per distinct shape in a process."""

from __future__ import annotations

import pickle

from boltforge.core.model.gang import Gang, Shape
from boltforge.core.model.levels import Level
from boltforge.testing.builders import make_gang, make_role


def test_gangs_alike_in_what_placement_needs_share_one_shape() -> None:
    a = make_gang("a", gpus=16, per_node=8)
    b = make_gang("b", gpus=16, per_node=8)
    b_team = Gang(b.name, b.roles, b.topology, "another-team", 1)
    assert a.shape is b.shape is b_team.shape  # names, teams and classes do not count


def test_sizes_needs_and_topology_rules_tell_shapes_apart() -> None:
    base = make_gang("a", gpus=16, per_node=8)
    others = [
        make_gang("a", gpus=8, per_node=8),
        make_gang("a", gpus=16, per_node=4),
        make_gang("a", gpus=16, per_node=8, required=Level.RACK),
        Gang("a", (make_role(replicas=2, gpus=8, tp=2),)),
    ]
    assert all(o.shape != base.shape for o in others)
    assert len({o.shape for o in others}) == len(others)


def test_a_pickled_gang_finds_its_shape_where_it_lands() -> None:
    gang = make_gang("a", gpus=24, per_node=8)
    again = pickle.loads(pickle.dumps(gang))
    assert again.shape is gang.shape  # made once per process, even from a pickle
    assert again.shape == Shape(gang.shape.key) and hash(again.shape) == hash(gang.shape)
