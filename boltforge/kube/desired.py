"""The server's desired states of the scheduler's nodes, indexed for the pass.

The server's long-poll sends the desired states of the nodes whose intent changed. A pass
wants them by action and run (job and epoch): the replicas to run, to bind their pods, and
those to stop, to evict theirs. The index is kept current node by node as changes arrive, so
a gang's arrival costs the pass the gang's replicas, not every replica of the fleet."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from boltforge.wire.agent import ReplicaSpec

Run = tuple[str, int]  # (job, epoch)
Wanted = dict[Run, dict[str, tuple[str, ReplicaSpec]]]  # run -> replica -> (node, spec)


class DesiredStates:
    """What the server wants of each node (``put``, ``clear``), and the replicas by action
    (``wanted``). ``seq`` grows with every change; ``touched`` holds the runs whose replicas
    changed since ``take_touched`` (None: every run, after a ``clear``)."""

    def __init__(self) -> None:
        self.nodes: dict[str, list[ReplicaSpec]] = {}
        self.seq = 0
        self._by_action: dict[str, Wanted] = defaultdict(dict)
        # (action, replica) -> the nodes that list it, the one indexed last (the server
        # lists a replica on one node; while a move's changes arrive, on two)
        self._nodes_of: dict[tuple[str, str], list[str]] = {}
        self._touched: set[Run] | None = None

    def put(self, node: str, specs: list[ReplicaSpec]) -> None:
        """``node``'s desired state is now ``specs`` (all it should run or stop)."""
        self._drop(node, self.nodes.get(node, ()))
        self.nodes[node] = specs
        for spec in specs:
            run = (spec.job, spec.epoch)
            self._by_action[spec.action].setdefault(run, {})[spec.replica] = (node, spec)
            self._nodes_of.setdefault((spec.action, spec.replica), []).append(node)
            self._touch(run)
        self.seq += 1

    def clear(self) -> None:
        """Forget every node's desired state (a full answer follows)."""
        self.nodes, self._nodes_of = {}, {}
        self._by_action = defaultdict(dict)
        self._touched = None
        self.seq += 1

    def wanted(self, action: str) -> Wanted:
        """The replicas with ``action`` by run, and where each is wanted. Read only."""
        return self._by_action[action]

    def lists(self, replica: str) -> bool:
        """Whether some node's desired state lists ``replica``."""
        return any((action, replica) in self._nodes_of for action in self._by_action)

    def take_touched(self) -> set[Run] | None:
        """The runs whose replicas changed since the last call (None: every run)."""
        touched, self._touched = self._touched, set()
        return touched

    def _drop(self, node: str, specs: Iterable[ReplicaSpec]) -> None:
        for spec in specs:
            key, run = (spec.action, spec.replica), (spec.job, spec.epoch)
            nodes = self._nodes_of[key]
            nodes.remove(node)
            wanted = self._by_action[spec.action]
            if nodes:  # still listed by another node: indexed as that node lists it
                other = nodes[-1]
                kept = next(s for s in self.nodes[other] if (s.action, s.replica) == key)
                wanted[run][spec.replica] = (other, kept)
            else:
                del self._nodes_of[key]
                del wanted[run][spec.replica]
                if not wanted[run]:
                    del wanted[run]
            self._touch(run)

    def _touch(self, run: Run) -> None:
        if self._touched is not None:
            self._touched.add(run)
