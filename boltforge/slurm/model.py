"""What Slurm says, parsed: nodes from ``sinfo --json``, jobs from ``squeue --json`` (the
22.05 layout: ``job_state`` is a string), switches from ``topology.conf``, and Slurm's host
lists (``n[1-3,7],m2``). Pure functions; nothing here runs a command."""

from __future__ import annotations

import re
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

FINISHED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
    }
)
DEAD_NODE = frozenset({"down", "down*", "fail", "fail*", "future", "unknown*", "no_respond"})
HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})


@dataclass(frozen=True)
class SlurmNode:
    """One node: its GPUs (count and type from its GRES), CPUs, memory, the partitions it
    serves, its features (``rack=r1``), and whether Slurm considers it responding and
    schedulable. ``alloc_*``: what Slurm has given jobs there, of every partition."""

    name: str
    gpus: int
    gpu_type: str
    cpus: int
    memory_gb: float
    partitions: tuple[str, ...]
    features: tuple[str, ...]
    state: str
    flags: tuple[str, ...]
    alloc_gpus: int = 0
    alloc_cpus: int = 0
    alloc_memory_gb: float = 0.0

    @property
    def responding(self) -> bool:
        return self.state.lower() not in DEAD_NODE and "NOT_RESPONDING" not in self.flags

    @property
    def draining(self) -> bool:
        return "DRAIN" in self.flags or self.state.lower().startswith("drain")

    def feature(self, key: str) -> str | None:
        """The value of a ``key=value`` feature, if the node has one."""
        prefix = f"{key}="
        return next((f[len(prefix) :] for f in self.features if f.startswith(prefix)), None)


@dataclass(frozen=True)
class SlurmJob:
    """One job as ``squeue`` shows it. ``gpus_per_node`` from ``--gres=gpu[:type]:N`` or
    ``--gpus-per-node``; ``gpus_total`` from ``--gpus``; ``time_limit_s`` None for no limit.
    ``cpus`` and ``memory_gb``: what the whole job asks of CPUs and memory, as Slurm totals
    them from ``-n``, ``-c``/``--cpus-per-task``, ``--mem``, ``--mem-per-cpu`` and
    ``--mem-per-gpu`` (its defaults included; 0 when it says nothing)."""

    id: str
    name: str
    state: str
    reason: str
    partition: str
    account: str
    qos: str
    user: str
    nodes: tuple[str, ...]
    node_count: int
    gpus_per_node: int
    gpus_total: int
    gpu_type: str | None
    time_limit_s: float | None
    comment: str
    admin_comment: str
    exit_status: int
    submit_time: int
    priority: int
    cpus: int = 0
    memory_gb: float = 0.0
    alloc_cpus: int = 0
    alloc_memory_gb: float = 0.0

    @property
    def held(self) -> bool:
        return self.state == "PENDING" and (self.priority == 0 or self.reason in HELD_REASONS)

    @property
    def requested_qos(self) -> str:
        """The QOS the job asked for: Slurm's own field, else the one the submit plugin kept
        in its tag (Slurm without accounting drops it)."""
        m = re.search(r"\[qos=([A-Za-z0-9_.-]+)\]", self.comment)
        return self.qos or (m.group(1) if m else "")

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def exit_code(self) -> int | None:
        """The script's exit code (None when a signal ended it)."""
        return None if self.exit_status & 0x7F else self.exit_status >> 8

    @property
    def signal(self) -> int | None:
        return (self.exit_status & 0x7F) or None

    def per_node(self) -> tuple[int, float, float]:
        """The GPUs, CPUs and memory (GB) Slurm gave the job on each of its nodes (its
        totals spread evenly)."""
        nodes = max(self.node_count, 1)
        gpus = self.gpus_per_node or self.gpus_total // nodes
        return gpus, self.alloc_cpus / nodes, self.alloc_memory_gb / nodes


_GRES = re.compile(r"gpu(?::(?P<type>[A-Za-z0-9_.-]+))?(?::(?P<n>\d+))?")


def gres_gpus(text: str) -> tuple[int, str | None]:
    """GPUs in a GRES or TRES list (``gpu:h100:8``, ``gres:gpu:4``, ``gres/gpu=2``); the
    count (0 when none) and the type, if named."""
    for part in text.replace("gres:", "").replace("gres/", "").split(","):
        part = part.split("(")[0].strip()
        if part.startswith("gpu") and "=" in part:  # TRES: gpu=2, gpu:h100=2
            name, _, count = part.partition("=")
            kind = name.partition(":")[2] or None
            return int(count), kind
        m = _GRES.fullmatch(part)
        if m and part.startswith("gpu"):
            kind = m.group("type")
            if kind is not None and kind.isdigit() and m.group("n") is None:
                return int(kind), None
            return int(m.group("n") or 1), kind
    return 0, None


def hostnames(text: str) -> tuple[str, ...]:
    """Expand a Slurm host list: ``n[1-3,7],m2`` -> n1 n2 n3 n7 m2 (zero padding kept)."""
    out: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", text):
        if plain:
            out.append(plain.strip())
            continue
        for span in ranges.split(","):
            lo, _, hi = span.partition("-")
            width = len(lo) if lo.startswith("0") else 0
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{i:0{width}d}")
    return tuple(n for n in out if n)


def parse_nodes(data: Mapping[str, Any]) -> list[SlurmNode]:
    """The nodes of ``sinfo --json`` (one entry per node)."""
    nodes = []
    for n in data.get("nodes", []):
        gpus, kind = gres_gpus(str(n.get("gres") or ""))
        state = str(n.get("state") or "unknown")
        flags = tuple(str(f) for f in n.get("state_flags") or ())
        nodes.append(
            SlurmNode(
                name=str(n["name"]),
                gpus=gpus,
                gpu_type=kind or "gpu",
                cpus=int(n.get("cpus") or 1),
                memory_gb=max(float(n.get("real_memory") or 1024) / 1024, 1.0),
                partitions=tuple(n.get("partitions") or ()),
                features=tuple(f for f in str(n.get("features") or "").split(",") if f),
                state=state,
                flags=flags,
                alloc_gpus=gres_gpus(str(n.get("gres_used") or ""))[0],
                alloc_cpus=int(n.get("alloc_cpus") or 0),
                alloc_memory_gb=float(n.get("alloc_memory") or 0) / 1024,
            )
        )
    return nodes


def parse_jobs(data: Mapping[str, Any]) -> list[SlurmJob]:
    """The jobs of ``squeue --json``."""
    return [_job(j) for j in data.get("jobs", [])]


def _job(j: Mapping[str, Any]) -> SlurmJob:
    per_node, kind = gres_gpus(str(j.get("tres_per_node") or ""))
    total, total_kind = gres_gpus(str(j.get("tres_per_job") or ""))
    limit = j.get("time_limit")
    minutes = limit if isinstance(limit, int) and 0 < limit < 0xFFFFFFFE else None
    return SlurmJob(
        id=str(j["job_id"]),
        name=str(j.get("name") or ""),
        state=str(j.get("job_state") or "UNKNOWN"),
        reason=str(j.get("state_reason") or ""),
        partition=str(j.get("partition") or ""),
        account=str(j.get("account") or ""),
        qos=str(j.get("qos") or ""),
        user=str(j.get("user_name") or ""),
        nodes=hostnames(str(j.get("nodes") or "")),
        node_count=int(j.get("node_count") or 1),
        gpus_per_node=per_node,
        gpus_total=total,
        gpu_type=kind or total_kind,
        time_limit_s=None if minutes is None else minutes * 60.0,
        comment=str(j.get("comment") or ""),
        admin_comment=str(j.get("admin_comment") or ""),
        exit_status=int(j.get("exit_code") or 0),
        submit_time=int(j.get("submit_time") or 0),
        priority=int(j.get("priority") or 0),
        **tres_request(str(j.get("tres_req_str") or "")),
        **{f"alloc_{k}": v for k, v in tres_request(str(j.get("tres_alloc_str") or "")).items()},
    )


_MEMORY_UNITS = {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}


def tres_request(text: str) -> dict[str, Any]:
    """``cpus`` and ``memory_gb`` of a job's TRES request (``cpu=4,mem=1.50G,node=1``;
    memory in K, M, G or T, megabytes when unmarked); a resource it does not name is left
    out."""
    out: dict[str, Any] = {}
    for part in text.split(","):
        key, _, value = part.strip().partition("=")
        if key == "cpu" and value.isdigit():
            out["cpus"] = int(value)
        elif key == "mem" and value:
            unit = value[-1].upper() if value[-1].isalpha() else "M"
            number = value[:-1] if value[-1].isalpha() else value
            with suppress(ValueError, KeyError):
                out["memory_gb"] = float(number) * _MEMORY_UNITS[unit]
    return out


def parse_topology(text: str) -> dict[str, str]:
    """Each node's leaf switch in a ``topology.conf`` (``SwitchName=r1 Nodes=n[1-4]``; keys
    in any case, as Slurm reads them)."""
    switch_of: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        pairs = (f.split("=", 1) for f in line.split() if "=" in f)
        fields = {key.lower(): value for key, value in pairs}
        if "switchname" in fields and "nodes" in fields:
            for node in hostnames(fields["nodes"]):
                switch_of[node] = fields["switchname"]
    return switch_of
