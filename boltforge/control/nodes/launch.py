"""How a bound gang's replicas find each other and their devices: the backend's choice.

When the scheduler binds a job (or resizes one in place) it knows which node runs each rank
and which GPUs it counted for it; it does not know how the job's processes rendezvous, nor
whether the backend lets the scheduler pick GPU indices. Those two choices belong to the
backend, through its ``Launcher``:

- ``rendezvous(slots, ports)`` returns each rank's environment (in rank order): the
  variables the job's launcher reads to form its process group. The native backend speaks
  torchrun's (``MASTER_ADDR``/``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ...),
  with one free port per gang from ``FIRST_PORT`` up on its master's address (rank 0's
  node): a port need only be unique where it is opened, so the range bounds the gangs whose
  rank 0 shares one node, never the gangs of the fleet. A Slurm backend would hand the gang to
  ``srun`` and let it set ``SLURM_PROCID`` and friends; a Kubernetes backend would use a
  headless service's DNS name.
- ``picks_devices``: False when the node runs each replica on exactly the GPU indices the
  scheduler counted (the native agents set ``CUDA_VISIBLE_DEVICES`` from them); True when the
  backend's own allocator picks them (Slurm's GRES, Kubernetes' device plugins), so only the
  number of GPUs binds it. Either way the scheduler's accounting of which GPUs are taken
  stays its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

FIRST_PORT = 29500
PORT_RANGE = 10_000

# The rendezvous ports in use, by master address (``MASTER_ADDR``).
Ports = dict[str, set[int]]


@dataclass(frozen=True, slots=True)
class Slot:
    """One rank of a gang about to start: its role, node, the node's address, its GPUs."""

    rank: int
    role: str
    node: str
    address: str
    gpus: tuple[int, ...]


class Launcher(Protocol):
    """A backend's way of starting a gang (see the module docstring)."""

    picks_devices: bool

    def rendezvous(self, slots: Sequence[Slot], ports: Ports) -> list[dict[str, str]]:
        """Each rank's environment, in the order of ``slots``. ``ports`` are the rendezvous
        ports in use by address; one this gang takes is added to its master's."""
        ...


class TorchrunLauncher:
    """torchrun's static rendezvous: rank 0's node is the master, one port per gang."""

    picks_devices = False

    def rendezvous(self, slots: Sequence[Slot], ports: Ports) -> list[dict[str, str]]:
        """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
        ``MASTER_ADDR`` and ``MASTER_PORT`` for each slot: the master is rank 0's node, the
        port the lowest free one there."""
        master = slots[0].address if slots else "127.0.0.1"
        port = free_port(ports.setdefault(master, set()))
        seen: dict[str, int] = {}
        local_ranks = []
        for s in slots:  # each node's ranks, in the order of ``slots``: 0, 1, ...
            local_ranks.append(seen.get(s.node, 0))
            seen[s.node] = local_ranks[-1] + 1
        out = []
        for s, local_rank in zip(slots, local_ranks, strict=True):
            out.append(
                {
                    "RANK": str(s.rank),
                    "WORLD_SIZE": str(len(slots)),
                    "LOCAL_RANK": str(local_rank),
                    "LOCAL_WORLD_SIZE": str(seen[s.node]),
                    "GROUP_RANK": str(s.rank),
                    "MASTER_ADDR": master,
                    "MASTER_PORT": str(port),
                }
            )
        return out


def free_port(ports: set[int]) -> int:
    """The lowest rendezvous port from ``FIRST_PORT`` not in ``ports`` (those in use on one
    address), now added to it."""
    port = next((p for p in range(FIRST_PORT, FIRST_PORT + PORT_RANGE) if p not in ports), None)
    if port is None:
        raise PortsExhausted(
            f"all {PORT_RANGE} rendezvous ports from {FIRST_PORT} on one node are in use by "
            "running gangs whose rank 0 runs there"
        )
    ports.add(port)
    return port


class PortsExhausted(RuntimeError):
    """Every rendezvous port of one address is taken: more gangs with their rank 0 on one
    node run at once than the port range allows."""
