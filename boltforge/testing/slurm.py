"""A throwaway Slurm cluster for tests and benchmarks: munged, one slurmctld and one slurmd
per emulated 8-GPU node, all on 127.0.0.1, configured under a temporary folder and stopped
and removed afterwards.

The nodes sit in racks (``topology.conf`` switches, and a ``rack=`` feature on each node).
Partitions: ``bolt`` (the one Boltforge manages: ``deploy/slurm/job_submit.lua`` holds and
tags its jobs), and ``low``/``high`` (not managed; Slurm's own ``partition_prio``
preemption, with requeue, for comparison). GPUs are character devices that stand in for
``/dev/nvidia*``: Slurm 22.05 drops GPUs without a device file. Needs Debian's
``slurm-wlm`` and ``munge`` and root (slurmd runs jobs as their user).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from boltforge.testing.postgres import free_port

LUA = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "job_submit.lua"
EPILOG = LUA.with_name("wake.sh")  # EpilogSlurmctld: wakes the bridge when a job ends
GPUS_PER_NODE = 8
FAST_SCHEDULER = "sched_interval=2,bf_interval=2"  # Slurm's passes every 2 s, for tests


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: ``env`` points Slurm's commands at it (``SLURM_CONF``)."""

    root: Path
    nodes: tuple[str, ...]
    racks: tuple[tuple[str, ...], ...]

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def wake(self) -> Path:
        """The file this cluster's ``job_submit.lua`` touches for every job it holds."""
        return self.root / "wake"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True) -> str:
        """Run a Slurm command against this cluster; its stdout."""
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def sbatch(self, *options: str, script: str) -> str:
        """Submit ``script`` (a shell script's text) with ``options``; the Slurm job id."""
        path = self.root / "scripts" / f"job-{time.monotonic_ns()}.sh"
        path.parent.mkdir(exist_ok=True)
        path.write_text("#!/bin/bash\n" + script)
        out = self.run(
            "sbatch", "--parsable", f"--chdir={self.root / 'scripts'}", *options, str(path)
        )
        return out.strip().split(";")[0]


def installed() -> bool:
    return all(shutil.which(b) for b in ("slurmctld", "slurmd", "munged", "sbatch"))


def ensure_user(name: str) -> int:
    """The uid of the plain (unprivileged) user ``name``, made with a home of its own if it
    does not exist yet: a Slurm user that a team's jobs run as. Needs root."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True
    )
    return pwd.getpwnam(name).pw_uid


def shared_folder(prefix: str) -> Path:
    """A new folder every user may write in (sticky, as ``/tmp``), outside pytest's
    folders, which only root may enter: for the files of jobs that run as team users."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o1777)
    return path


def _munge() -> None:
    """Start munged once per machine (it is shared by every cluster)."""
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
        return
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    if not Path("/etc/munge/munge.key").exists():
        subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
        shutil.chown("/etc/munge/munge.key", "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)


def _ports(count: int) -> list[int]:
    """``count`` distinct ports free now (slurmctld's, then one per slurmd)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _config(
    root: Path,
    nodes: Sequence[str],
    racks: Sequence[Sequence[str]],
    ports: Sequence[int],
    scheduler: str | None,
    cpus: int = 32,
) -> str:
    rack_of = {n: i for i, rack in enumerate(racks) for n in rack}
    lines = [
        "ClusterName=boltforge-test",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ports[0]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "SchedulerType=sched/backfill",
        "DefMemPerCPU=1000",
        "ReturnToService=2",
        "MinJobAge=600",
        "KillWait=5",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "JobRequeue=1",
        "SlurmdParameters=config_overrides",
        "TopologyPlugin=topology/tree",
        "JobSubmitPlugins=lua",
        "MpiDefault=none",
        f"EpilogSlurmctld={root}/wake.sh",
    ]
    if scheduler:
        lines.append(f"SchedulerParameters={scheduler}")
    for i, n in enumerate(nodes):
        lines.append(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={ports[1 + i]} "
            f"CPUs={cpus} RealMemory=256000 Gres=gpu:h100:{GPUS_PER_NODE} "
            f"Feature=rack=r{rack_of[n]} State=UNKNOWN"
        )
    every = ",".join(nodes)
    lines += [
        f"PartitionName=bolt Nodes={every} Default=YES MaxTime=INFINITE State=UP PriorityTier=1",
        f"PartitionName=low Nodes={every} MaxTime=INFINITE State=UP PriorityTier=1",
        f"PartitionName=high Nodes={every} MaxTime=INFINITE State=UP PriorityTier=2",
    ]
    return "\n".join(lines) + "\n"


def _topology(racks: Sequence[Sequence[str]]) -> str:
    lines = [f"SwitchName=r{i} Nodes={','.join(rack)}" for i, rack in enumerate(racks)]
    lines.append(f"SwitchName=spine Switches={','.join(f'r{i}' for i in range(len(racks)))}")
    return "\n".join(lines) + "\n"


def _gres(root: Path, nodes: Sequence[str]) -> str:
    dev = root / "dev"
    dev.mkdir()
    for i in range(GPUS_PER_NODE):
        subprocess.run(["mknod", "-m", "666", str(dev / f"gpu{i}"), "c", "1", "3"], check=True)
    files = f"{dev}/gpu[0-{GPUS_PER_NODE - 1}]"
    return f"AutoDetect=off\nNodeName={','.join(nodes)} Name=gpu Type=h100 File={files}\n"


@contextmanager
def slurm_cluster(
    nodes: int = 8, racks: int = 2, scheduler: str | None = FAST_SCHEDULER, cpus: int = 32
) -> Iterator[SlurmCluster]:
    """Start a cluster of ``nodes`` 8-GPU nodes (``n1``..) of ``cpus`` CPUs each, spread over
    ``racks`` switches. ``scheduler`` is slurm.conf's ``SchedulerParameters`` (None: Slurm's
    defaults, a main scheduling pass every 60 s and a backfill pass every 30 s besides those
    events start)."""
    if not installed():
        raise RuntimeError("Slurm is not installed. To fix: apt-get install -y slurm-wlm munge")
    root = Path(tempfile.mkdtemp(prefix="boltforge-slurm-"))
    root.chmod(0o755)  # users' Slurm commands (sbatch, a job's srun) read slurm.conf here
    names = tuple(f"n{i + 1}" for i in range(nodes))
    per = -(-nodes // racks)
    grouped = tuple(names[i : i + per] for i in range(0, nodes, per))
    for sub in ("state", "spool", "scripts"):
        (root / sub).mkdir()
    ports = _ports(1 + len(names))
    (root / "slurm.conf").write_text(_config(root, names, grouped, ports, scheduler, cpus))
    (root / "topology.conf").write_text(_topology(grouped))
    (root / "gres.conf").write_text(_gres(root, names))
    cluster = SlurmCluster(root, names, grouped)
    lua = LUA.read_text().replace('"/run/boltforge/slurm-wake"', f'"{cluster.wake}"')
    (root / "job_submit.lua").write_text(lua)
    epilog = EPILOG.read_text().replace('"/run/boltforge/slurm-wake"', f'"{cluster.wake}"')
    (root / "wake.sh").write_text(epilog)
    (root / "wake.sh").chmod(0o755)
    _munge()
    ctld = _start(cluster, ["slurmctld", "-D", "-i", "-f", str(cluster.conf)])
    slurmds: dict[str, subprocess.Popen[bytes]] = {}
    try:
        slurmds.update((n, _start_slurmd(cluster, n)) for n in names)
        _wait_idle(cluster, slurmds)
        yield cluster
    finally:
        daemons = [*slurmds.values(), ctld]
        for d in daemons:
            d.terminate()
        for d in daemons:
            try:
                d.wait(10)
            except subprocess.TimeoutExpired:
                d.kill()
        subprocess.run(["pkill", "-f", str(root)], capture_output=True)
        _kill_steps(cluster.conf)
        shutil.rmtree(root, ignore_errors=True)


def _kill_steps(conf: Path) -> None:
    """Kill the job step daemons (``slurmstepd``) this cluster's slurmd left: they detach
    from it, and outlive it when a job still ran."""
    mark = f"SLURM_CONF={conf}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def _start(cluster: SlurmCluster, cmd: list[str]) -> subprocess.Popen[bytes]:
    log = open(cluster.root / f"{cmd[0]}-{len(os.listdir(cluster.root))}.out", "wb")  # noqa: SIM115
    return subprocess.Popen(cmd, env=cluster.env, stdout=log, stderr=subprocess.STDOUT)


def _start_slurmd(cluster: SlurmCluster, node: str) -> subprocess.Popen[bytes]:
    return _start(cluster, ["slurmd", "-D", "-f", str(cluster.conf), "-N", node])


def _wait_idle(
    cluster: SlurmCluster, slurmds: dict[str, subprocess.Popen[bytes]], timeout_s: float = 30.0
) -> None:
    """Wait until every node is idle; a slurmd that exited (its port taken a moment after
    it was found free, say) is started again."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        for node, proc in list(slurmds.items()):
            if proc.poll() is not None:
                slurmds[node] = _start_slurmd(cluster, node)
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-p", "bolt", "-o", "%N %t"],
            env=cluster.env,
            capture_output=True,
            text=True,
        )
        last = done.stdout.strip() or done.stderr.strip()
        states = [line.split()[1] for line in done.stdout.splitlines() if line.strip()]
        if len(states) == len(cluster.nodes) and all(s == "idle" for s in states):
            return
        time.sleep(0.2)
    log = (
        (cluster.root / "slurmctld.log").read_text()[-2000:]
        if (cluster.root / "slurmctld.log").exists()
        else ""
    )
    raise RuntimeError(f"Slurm nodes did not come up idle in {timeout_s:.0f}s: {last}\n{log}")
