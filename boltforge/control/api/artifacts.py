"""Job artifacts over the API (``control/jobs/artifacts.py``): agents upload the outputs of the
replicas they ran; people list and download their team's.

``PUT /v1/agents/{node}/artifacts/{replica}/{path}``: the body is the file, ``X-Sha256`` its
sha256; the replica must be one that ran on ``node``. 201 with the artifact; 422 (nothing
kept) when the hash does not match or the path leaves its root; 404 for a replica the node
never ran. ``GET /v1/jobs/{id}/artifacts`` lists them; ``GET /v1/jobs/{id}/artifacts/{name}``
sends one, with its sha256 in ``X-Sha256``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from boltforge.control.api.deps import People, Rt, for_nodes, role
from boltforge.control.api.errors import ERRORS, ApiError
from boltforge.control.api.jobs import visible_job
from boltforge.control.jobs.artifacts import BadArtifact, artifact_name
from boltforge.control.runtime import Runtime
from boltforge.control.store.models import ReplicaRow
from boltforge.wire.jobs import Artifact, ArtifactList

router = APIRouter(tags=["artifacts"], responses=ERRORS)
agent = role("admin", "agent")


@router.put("/v1/agents/{node}/artifacts/{replica}/{path:path}", status_code=201)
async def upload(
    node: str,
    replica: str,
    path: str,
    request: Request,
    x_sha256: Annotated[str, Header()] = "",
) -> Artifact:
    """Keep one output file of ``replica`` (see the module docstring); an agent token only
    for its own nodes."""
    await for_nodes(request, await agent(request), [node])
    rt: Runtime = request.app.state.runtime
    job, rank, epoch = await run_in_threadpool(_ran_on, rt, node, replica)
    try:
        name = artifact_name(rank, path)
        return await rt.artifacts.put(job, replica, epoch, name, x_sha256, request.stream())
    except BadArtifact as e:
        raise ApiError(422, str(e)) from None


def _ran_on(rt: Runtime, node: str, replica: str) -> tuple[str, int, int]:
    """``replica``'s job, rank and epoch; 404 unless it ran on ``node``."""
    with rt.db.session() as s:
        rep = s.get(ReplicaRow, replica)
        if rep is None or rep.node != node:
            raise ApiError(
                404,
                f"node {node} ran no replica {replica}. To fix: upload from the node that ran "
                "it, naming a replica of its desired state",
            )
        return rep.job_id, rep.rank, rep.epoch


@router.get("/v1/jobs/{job_id}/artifacts")
def list_artifacts(job_id: str, who: People, rt: Rt) -> ArtifactList:
    """The job's artifacts: name (``<rank>/<path>``), size, sha256, replica, epoch."""
    with rt.db.session() as s:
        visible_job(s, job_id, who)
    return ArtifactList(job=job_id, artifacts=rt.artifacts.list(job_id))


@router.get("/v1/jobs/{job_id}/artifacts/{name:path}", response_model=None)
def download(job_id: str, name: str, who: People, rt: Rt) -> StreamingResponse:
    """One artifact's bytes, its sha256 in ``X-Sha256``."""
    with rt.db.session() as s:
        visible_job(s, job_id, who)
    found = rt.artifacts.open(job_id, name)
    if found is None:
        raise ApiError(
            404,
            f"job {job_id} has no artifact {name}. To fix: list them with "
            f"`bolt artifacts {job_id}`",
        )
    artifact, chunks = found
    headers = {"X-Sha256": artifact.sha256, "Content-Length": str(artifact.size)}
    return StreamingResponse(chunks, media_type="application/octet-stream", headers=headers)
