"""The Slurm commands the bridge runs, against the cluster ``SLURM_CONF`` names. Each is a
short-lived process (the bridge runs them on its own loop, never inside the server).

They run with a clean environment (``KEPT``), not the bridge's: ``sbatch`` copies its
caller's environment into the job, and the bridge's may hold its token (``BOLT_TOKEN``)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from boltforge.slurm.model import SlurmJob, SlurmNode, parse_jobs, parse_nodes

# What the bridge's own environment passes to Slurm's commands (and through sbatch to the
# jobs it makes): where Slurm and its commands are, and the locale; nothing else.
KEPT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SLURM_CONF")


def clean_env(conf: str | None, base: Mapping[str, str]) -> dict[str, str]:
    """The environment Slurm's commands run with: ``KEPT`` of ``base``, ``SLURM_CONF`` set
    to ``conf`` when given."""
    env = {k: base[k] for k in KEPT if k in base}
    return {**env, **({"SLURM_CONF": conf} if conf else {})}


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is its own."""


class Slurm:
    """Slurm's commands: ``conf`` is the ``slurm.conf`` to use (None: Slurm's default)."""

    def __init__(self, conf: str | None = None, timeout_s: float = 20.0) -> None:
        self.env = clean_env(conf, os.environ)
        self.timeout_s = timeout_s

    async def run(self, *args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            *args,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise SlurmError(f"{args[0]} did not answer in {self.timeout_s:g}s") from None
        if proc.returncode != 0:
            said = (err or out).decode(errors="replace").strip()
            raise SlurmError(f"{' '.join(args[:3])}: {said or f'exit {proc.returncode}'}")
        return out.decode(errors="replace")

    async def _json(self, *args: str) -> dict[str, Any]:
        """The JSON object a ``--json`` command printed; ``SlurmError`` (which the bridge
        retries) when it printed anything else."""
        out = await self.run(*args)
        try:
            data = json.loads(out)
        except json.JSONDecodeError as e:
            raise SlurmError(f"{args[0]} --json printed no JSON ({e}): {out[:200]!r}") from None
        if not isinstance(data, dict):
            raise SlurmError(f"{args[0]} --json gave no object")
        return data

    async def config(self) -> str:
        """What ``scontrol show config`` prints (``identity.parse_config`` reads it)."""
        return await self.run("scontrol", "show", "config")

    async def nodes(self, partitions: Sequence[str]) -> list[SlurmNode]:
        data = await self._json("sinfo", "--json", "-p", ",".join(partitions))
        return [n for n in parse_nodes(data) if set(n.partitions) & set(partitions)]

    async def jobs(self, partitions: Sequence[str]) -> list[SlurmJob]:
        """The jobs of ``partitions``, finished ones included (``jobs_and_others``)."""
        return (await self.jobs_and_others(partitions))[0]

    async def jobs_and_others(
        self, partitions: Sequence[str]
    ) -> tuple[list[SlurmJob], list[SlurmJob]]:
        """The jobs of ``partitions``, finished ones included, and those of other partitions
        the same read listed: one ``REQUEST_JOB_INFO`` to slurmctld (22.05's ``squeue
        --json`` lists every job whatever ``-p`` says; later versions list only those of
        ``partitions``)."""
        data = await self._json("squeue", "--json", "--states=all", "-p", ",".join(partitions))
        listed = parse_jobs(data)
        return [j for j in listed if j.partition in partitions], [
            j for j in listed if j.partition not in partitions
        ]

    async def all_jobs(self) -> list[SlurmJob]:
        """Every job slurmctld still lists, in any partition and state."""
        return parse_jobs(await self._json("squeue", "--json", "--states=all"))

    async def start_on(self, job: str, nodes: Sequence[str]) -> None:
        """Start a held job on exactly ``nodes``: pin its node list, make it eligible now
        (a requeued job would wait otherwise), release it."""
        pinned = ",".join(nodes)
        await self.run("scontrol", "update", f"JobId={job}", f"NodeList={pinned}", "StartTime=now")
        await self.run("scontrol", "release", job)

    async def submit_held(
        self,
        partition: str,
        nodes: int,
        gpus: int,
        name: str,
        script: str,
        cwd: str | None,
        as_user: Sequence[str] = (),
    ) -> str:
        """``sbatch`` a held job of ``nodes`` nodes with ``gpus`` GPUs each running the shell
        ``script``; its Slurm job id. ``as_user`` are the words that run ``sbatch`` as the
        job's user (``identity.submit_prefix``), so the job is that user's."""
        args = [*as_user, "sbatch", "--parsable", "--hold", f"--partition={partition}"]
        args += [f"--nodes={nodes}", "--ntasks-per-node=1", f"--job-name={name}"]
        args += [f"--gres=gpu:{gpus}"] if gpus else []
        args += [f"--chdir={cwd}"] if cwd else []
        out = await self.run(*args, f"--wrap={script}")
        return out.strip().split(";", 1)[0]

    async def signal(self, job: str, signal: str = "TERM", full: bool = True) -> None:
        """Send ``signal`` to every step of a running job, and with ``full`` to its batch
        script too (a job whose script is the workload)."""
        await self.run("scancel", f"--signal={signal}", *(["--full"] if full else []), job)

    async def requeue_held(self, job: str) -> None:
        """End what still runs and put the job back in the queue, held for Boltforge."""
        await self.run("scontrol", "requeuehold", job)

    async def hold(self, job: str) -> None:
        await self.run("scontrol", "hold", job)

    async def cancel(self, job: str) -> None:
        await self.run("scancel", job)

    async def comment(self, job: str, text: str) -> None:
        await self.run("scontrol", "update", f"JobId={job}", f"Comment={text}")

    async def unpin(self, job: str, pending: bool) -> None:
        """Clear what Boltforge wrote on a job: its comment, its admin comment and, when the
        job is ``pending``, its node list (a running job's cannot change) and the start time
        a held requeue put off, so Slurm may start it at once, anywhere it fits."""
        fields = ["NodeList=", "StartTime=now"] if pending else []
        await self.run("scontrol", "update", f"JobId={job}", *fields, "Comment=", "AdminComment=")

    async def release(self, job: str) -> None:
        await self.run("scontrol", "release", job)

    async def admin_comment(self, job: str, text: str) -> None:
        await self.run("scontrol", "update", f"JobId={job}", f"AdminComment={text}")
