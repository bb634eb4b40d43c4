"""Topology levels and the crossing weights that price communication across them."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import IntEnum


class Level(IntEnum):
    """Failure-and-bandwidth domains, from the tightest (a GPU) to the whole fleet (spine)."""

    GPU = 0
    ISLAND = 1
    HOST = 2
    RACK = 3
    POD = 4
    SPINE = 5

    @property
    def label(self) -> str:
        return _LABELS[self]

    @classmethod
    def parse(cls, name: str) -> Level:
        """Parse a user-facing level name (``island``, ``host``, ``rack``, ``pod``, ``spine``)."""
        key = name.strip().lower().replace("nvlink", "island").replace("node", "host")
        for level in cls:
            if level.name.lower() == key:
                return level
        raise ValueError(name)


_LABELS = {
    Level.GPU: "GPU",
    Level.ISLAND: "NVLink island",
    Level.HOST: "host",
    Level.RACK: "rack",
    Level.POD: "pod",
    Level.SPINE: "fleet",
}

# Where the default weights come from: each is the bandwidth of an NVLink hop (~450 GB/s per
# direction on H100 HGX) divided by the bandwidth of a hop at that level, so a weight reads as
# "how many times slower than NVLink":
#   nvlink 1    inside an NVLink island (NVSwitch), ~450 GB/s
#   host   7    across islands or PCIe inside one host, PCIe Gen5 x16 ~64 GB/s
#   rack   9    host to host through the rack's leaf switch, one 400 Gb/s IB link ~50 GB/s
#   pod    36   rack to rack (leaf-spine-leaf), ~4x slower than intra-rack under oversubscription
#   spine  72   pod to pod through the super-spine, another 2x oversubscription
#   rail   9    a replica off its rail pays one extra IB hop (or a PXN NVLink forward)
DEFAULT_WEIGHTS: dict[str, float] = {
    "nvlink": 1.0,
    "host": 7.0,
    "rack": 9.0,
    "pod": 36.0,
    "spine": 72.0,
    "rail": 9.0,
}


@dataclass(frozen=True, slots=True)
class CrossingWeights:
    """Cost of one ring hop at each level; must not decrease as the level widens."""

    nvlink: float = DEFAULT_WEIGHTS["nvlink"]
    host: float = DEFAULT_WEIGHTS["host"]
    rack: float = DEFAULT_WEIGHTS["rack"]
    pod: float = DEFAULT_WEIGHTS["pod"]
    spine: float = DEFAULT_WEIGHTS["spine"]
    rail: float = DEFAULT_WEIGHTS["rail"]

    def at(self, level: Level) -> float:
        """Weight of a hop that crosses into ``level`` (ISLAND hops are NVLink hops)."""
        return {
            Level.GPU: 0.0,
            Level.ISLAND: self.nvlink,
            Level.HOST: self.host,
            Level.RACK: self.rack,
            Level.POD: self.pod,
            Level.SPINE: self.spine,
        }[level]

    def problem(self) -> str | None:
        """Return why these weights are unusable, or None when they are fine."""
        chain = [self.nvlink, self.host, self.rack, self.pod, self.spine]
        if any(w <= 0 for w in [*chain, self.rail]):
            return "every weight must be positive"
        if any(a > b for a, b in itertools.pairwise(chain)):
            return "weights must not decrease from nvlink to host, rack, pod and spine"
        return None
