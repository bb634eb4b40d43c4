"""One actuation path: every start and stop of a replica, and every change of what a node
should run, goes through ``control/scheduling/intent.py``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_kit import Fleet, make_spec
from sqlalchemy import select

from boltforge.control.scheduling import intent
from boltforge.control.store.models import NodeRow, ReplicaRow

CONTROL = Path(__file__).resolve().parents[4] / "boltforge" / "control"
ACTED = ("starting", "stopping")  # the replica states that tell a node to act


def assignments(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, what)`` for each write of a node's ``desired_version`` or of a replica state
    that tells a node to act, in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign | ast.AugAssign):
            continue
        targets: list[ast.expr] = []
        values: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Tuple) and _tuples(t, node.value):
                    assert isinstance(node.value, ast.Tuple)
                    targets += t.elts
                    values += node.value.elts
                else:
                    targets.append(t)
                    values.append(node.value)
        else:
            targets, values = [node.target], [node.value]
        for target, value in zip(targets, values, strict=True):
            if isinstance(target, ast.Attribute) and target.attr == "desired_version":
                yield node.lineno, "desired_version"
            if (
                isinstance(target, ast.Attribute)
                and target.attr == "state"
                and isinstance(value, ast.Constant)
                and value.value in ACTED
            ):
                yield node.lineno, f"state = {value.value!r}"


def _tuples(target: ast.expr, value: ast.expr) -> bool:
    return (
        isinstance(target, ast.Tuple)
        and isinstance(value, ast.Tuple)
        and len(target.elts) == len(value.elts)
    )


@pytest.mark.parametrize(
    "path", sorted(CONTROL.rglob("*.py")), ids=lambda p: str(p.relative_to(CONTROL))
)
def test_only_intent_tells_nodes_to_start_or_stop(path: Path) -> None:
    if path.name == "intent.py":
        assert list(assignments(path)), "the check must find intent's own writes"
        return
    found = list(assignments(path))
    assert not found, (
        f"{path.name} changes intent itself at {found}: use control/scheduling/intent.py"
    )


def test_a_stop_ends_unstarted_replicas_and_signals_the_rest_once_per_node(
    tmp_path: Path,
) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        fleet.submit(make_spec("train", 16))
        with fleet.rt.db.session() as s:
            reps = list(s.scalars(select(ReplicaRow).order_by(ReplicaRow.rank)))
            assert [r.state for r in reps] == ["starting", "starting"]
            reps[0].state = "running"  # as its node reported
            versions = {n.name: n.desired_version for n in s.scalars(select(NodeRow))}
            nodes = intent.stop(s, reps, 5.0)
            assert nodes == {r.node for r in reps}
            assert [r.state for r in reps] == ["stopping", "stopping"]
            assert {n.name: n.desired_version for n in s.scalars(select(NodeRow))} == {
                name: v + 1 for name, v in versions.items()
            }
            assert intent.stop(s, reps, 6.0) == set()  # already stopping: nothing to tell
            assert all(r.stop_requested_at == 5.0 for r in reps)
            waiting = ReplicaRow(id="x", job_id=reps[0].job_id, state="waiting", node="n")
            assert intent.stop(s, [waiting], 7.0) == set()
            assert (waiting.state, waiting.exited_at) == ("exited", 7.0)
            s.rollback()
