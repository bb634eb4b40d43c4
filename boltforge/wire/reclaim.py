"""``POST /v1/nodes/{name}/reclaim``: a spot reclaim notice, and what the server did about it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from boltforge.wire.jobs import NodeOut

MAX_NOTICE_S = 86400.0


class ReclaimRequest(BaseModel):
    """The node is taken back by its cloud in ``in_s`` seconds (more than 0, at most a day)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    in_s: float = Field(gt=0, le=MAX_NOTICE_S)


class ReclaimedJob(BaseModel):
    """A job asked to checkpoint now and move off, with the grace it was given."""

    model_config = ConfigDict(extra="ignore")

    job: str
    grace_s: float


class ReclaimReply(BaseModel):
    """The node after the notice (cordoned), when it goes (``reclaim_at``, seconds since the
    epoch), and every job asked to checkpoint now and move off."""

    model_config = ConfigDict(extra="ignore")

    node: NodeOut
    reclaim_at: float
    jobs: list[ReclaimedJob] = []
