"""Taking Boltforge out of a Slurm cluster: every job it held is released to Slurm's own
scheduling, unpinned, and no job keeps a word Boltforge wrote (``bolt slurm-release``).

Run it once the bridge is stopped and ``job_submit.lua`` is out of ``slurm.conf``: a bridge
still running would hold the released jobs again."""

from __future__ import annotations

from dataclasses import dataclass, field

from boltforge.slurm.commands import Slurm
from boltforge.slurm.gang import TAG, parse_admin_comment
from boltforge.slurm.model import SlurmJob


@dataclass
class Released:
    """What ``release_all`` did: the jobs it released, and those (running or pending) whose
    Boltforge comments it cleared without releasing them."""

    released: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)


def boltforge_marked(job: SlurmJob) -> bool:
    """Whether Boltforge wrote on ``job``: a comment of its own, or its id in the admin
    comment."""
    return job.comment.startswith(TAG) or parse_admin_comment(job.admin_comment)[0] is not None


async def release_all(slurm: Slurm) -> Released:
    """Leave Slurm as it was before Boltforge, for every job not finished yet: a job it
    held loses its node pin (``NodeList``), comment and admin comment, is made eligible now
    (a held requeue puts its start off) and is released; any
    other job it wrote on (running, or released and not yet started) loses its comment and
    admin comment, and a pending one its pin too. Jobs Boltforge never touched are left
    alone; running it twice does nothing more."""
    done = Released()
    for job in await slurm.all_jobs():
        if job.finished or not boltforge_marked(job):
            continue
        pending = job.state == "PENDING"
        await slurm.unpin(job.id, pending)
        if job.held:
            await slurm.release(job.id)
            done.released.append(job.id)
        else:
            done.cleared.append(job.id)
    return done
