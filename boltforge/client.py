"""A small typed client for the Boltforge HTTP API, used by the ``bolt`` command, benchmarks
and tests. Errors come back as ``ApiFailure`` carrying the server's message and problems."""

from __future__ import annotations

import json
import os
import random
import ssl
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from platformdirs import user_config_dir
from pydantic import BaseModel

from boltforge.addresses import CONNECT_S, Addresses
from boltforge.wire.cost import CostReply
from boltforge.wire.jobs import (
    ArtifactList,
    EventPage,
    FleetOut,
    JobDetail,
    JobList,
    JobSummary,
    LogPage,
    NodeList,
    NodeOut,
    Problem,
    SubmitReply,
    SubmitRequest,
    TeamLoad,
    TokenList,
    TokenOut,
    TokenReply,
    TokenRequest,
    WhoAmI,
)
from boltforge.wire.reclaim import ReclaimReply
from boltforge.wire.services import GatewayLoad, ServiceList, ServiceRequest, ServiceSummary

T = TypeVar("T", bound=BaseModel)
DEFAULT_SERVER = "http://127.0.0.1:8600"
RETRIES = 3  # times a call the server shed for overload (429/503 + Retry-After) is sent again
LISTED_IDS = 100  # job ids named per listing (``jobs(ids=...)``), a short request line
MAX_RETRY_AFTER_S = 30.0  # the longest Retry-After honoured; a longer one is not waited out
RETRY_FOR_S = 60.0  # how long a submission refused with Retry-After is sent again by default


def config_path() -> Path:
    """Where ``bolt up`` leaves the server address and token for later commands."""
    return Path(user_config_dir("boltforge")) / "client.json"


def resolve(server: str | None, token: str | None) -> tuple[str, str | None]:
    """Server and token from the arguments, else ``BOLT_SERVER`` / ``BOLT_TOKEN``, else the
    file ``bolt up`` wrote, else the default local server."""
    saved = _saved()
    url = server or os.environ.get("BOLT_SERVER") or saved.get("server") or DEFAULT_SERVER
    tok = token or os.environ.get("BOLT_TOKEN") or saved.get("token")
    return str(url).rstrip("/"), tok


def resolve_ca(server: str, ca: str | None) -> str | None:
    """The CA bundle to verify ``server`` (a resolved URL) with: the argument, else
    ``BOLT_CA``, else the CA ``bolt up --tls`` saved when ``server`` is the server it saved;
    None (the system's trusted CAs) when none applies."""
    saved = _saved()
    same = str(saved.get("server") or "").rstrip("/") == server
    found = ca or os.environ.get("BOLT_CA") or (saved.get("ca") if same else None)
    return str(found) if found else None


def _saved() -> dict[str, Any]:
    """What ``bolt up`` saved in ``config_path()``; empty when there is none or it is not a
    JSON object."""
    path = config_path()
    if not path.exists():
        return {}
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


class ApiFailure(Exception):
    """The server refused a request (4xx/5xx) or could not be reached (``status`` 0)."""

    def __init__(self, status: int, message: str, problems: list[Problem] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.problems = problems or []


class Client:
    """Calls to one server (or to one of its replicas: ``server`` may list several
    addresses, comma-separated, see ``addresses.py``) with one token (``Authorization:
    Bearer``). An https server's
    certificate is verified against the CA bundle ``ca`` (a PEM file) when given, else
    against the system's trusted CAs; a ``ca`` that cannot be loaded raises
    ``boltforge.tls.BadCA``."""

    def __init__(
        self, server: str, token: str | None, timeout: float = 30.0, ca: str | Path | None = None
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.addresses = Addresses(server)
        self.token = token
        self.http = httpx.Client(
            base_url=self.addresses.current,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(CONNECT_S, timeout)),
            verify=_verify(ca),
        )

    @property
    def server(self) -> str:
        """The server address in use (of those given)."""
        return self.addresses.current

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(
        self, method: str, path: str, model: type[T], timeout: float | None = None, **kw: Any
    ) -> T:
        """Send the request; a reply the server shed for overload is waited out and sent
        again up to ``RETRIES`` times (a shed request was not acted on). Raises ``ApiFailure``
        for any other 4xx/5xx, for the last shed reply, or when the server is unreachable."""
        r = self._send(method, path, timeout, **kw)
        for _ in range(RETRIES):
            delay = retry_after(r)
            if delay is None:
                break
            time.sleep(delay * random.uniform(1.0, 1.25))  # spread the retries of many clients
            r = self._send(method, path, timeout, **kw)
        if r.status_code >= 400:
            raise _failure(r)
        return model.model_validate(r.json())

    def _send(self, method: str, path: str, timeout: float | None, **kw: Any) -> httpx.Response:
        """One call. One that could not be delivered goes to each other address in turn, as
        does one cut off mid-way that is safe to send again (a read, or a write carrying an
        idempotency key); a 503 (a replica with no leader behind it) sends the next call to
        the next address."""
        wait = httpx.Timeout(timeout, connect=min(CONNECT_S, timeout)) if timeout else None
        again = method == "GET" or "Idempotency-Key" in (kw.get("headers") or {})
        tries = len(self.addresses)
        while True:
            try:
                r = self.http.request(method, path, timeout=wait or self.http.timeout, **kw)
            except httpx.HTTPError as e:
                delivered = not isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                failed, tries = self.server, tries - 1
                if not tries or (delivered and not again):
                    raise _unreachable(failed, e) from None
                self.addresses.move_on(self.http)
                continue
            if r.status_code == 503:
                self.addresses.move_on(self.http)
            return r

    def submit(
        self,
        req: SubmitRequest,
        idempotency_key: str | None = None,
        retry_for: float = RETRY_FOR_S,
        waiting: Callable[[str, float], None] | None = None,
    ) -> SubmitReply:
        """Submit ``req``. Without ``idempotency_key`` a fresh one is made, so a submission
        cut off mid-way is sent again (to the next replica) without making the job twice.
        A refusal with ``Retry-After`` (503: the server's store is away, or it sheds load;
        429) is waited out and sent again with the same key until ``retry_for`` seconds
        have passed; ``waiting(why, seconds_left)`` is told before each wait. Raises
        ``ApiFailure`` for any other refusal, or the last one when time is up."""
        headers = {"Idempotency-Key": idempotency_key or f"bolt-{uuid.uuid4().hex}"}
        body = req.model_dump(exclude_none=True)
        deadline = time.monotonic() + retry_for
        r = self._send("POST", "/v1/jobs", None, json=body, headers=headers)
        while (delay := retry_after(r)) is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if waiting is not None:
                waiting(_failure(r).message, left)
            time.sleep(min(max(delay, 0.1) * random.uniform(1.0, 1.25), left))
            r = self._send("POST", "/v1/jobs", None, json=body, headers=headers)
        if r.status_code >= 400:
            raise _failure(r)
        return SubmitReply.model_validate(r.json())

    def apply_service(self, req: ServiceRequest) -> ServiceSummary:
        """Create the service ``req`` describes, or update the one of that name."""
        body = req.model_dump(exclude_none=True)
        return self._call("POST", "/v1/services", ServiceSummary, json=body)

    def services(self) -> ServiceList:
        return self._call("GET", "/v1/services", ServiceList)

    def service(self, name: str) -> ServiceSummary:
        return self._call("GET", f"/v1/services/{quote(name, safe='')}", ServiceSummary)

    def delete_service(self, name: str) -> ServiceSummary:
        return self._call("DELETE", f"/v1/services/{quote(name, safe='')}", ServiceSummary)

    def service_load(self, name: str, load: GatewayLoad) -> ServiceSummary:
        """Report what a gateway in front of service ``name`` sees (requests waiting)."""
        path = f"/v1/services/{quote(name, safe='')}/load"
        return self._call("POST", path, ServiceSummary, json=load.model_dump(exclude_none=True))

    def jobs(
        self, state: str | None = None, team: str | None = None, ids: Sequence[str] = ()
    ) -> JobList:
        """Jobs in queue order (``GET /v1/jobs``): the first thousand live ones, or those in
        ``state``; with ``ids``, only those jobs, asked for ``LISTED_IDS`` at a time and
        joined in the order asked."""
        params = {k: v for k, v in (("state", state), ("team", team)) if v}
        if not ids:
            return self._call("GET", "/v1/jobs", JobList, params=params)
        jobs: list[JobSummary] = []
        others: dict[str, TeamLoad] = {}  # each team's load, summed over the batches
        for start in range(0, len(ids), LISTED_IDS):
            batch = {**params, "ids": ",".join(ids[start : start + LISTED_IDS])}
            page = self._call("GET", "/v1/jobs", JobList, params=batch)
            jobs += page.jobs
            for load in page.others:
                was = others.get(load.team)
                others[load.team] = load if was is None else _plus(was, load)
        return JobList(jobs=jobs, others=[others[t] for t in sorted(others)])

    def job(self, job_id: str) -> JobDetail:
        return self._call("GET", f"/v1/jobs/{job_id}", JobDetail)

    def cancel(self, job_id: str) -> JobList:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel", JobList)

    def events(self, job_id: str, after: int = 0, wait: float = 0.0) -> EventPage:
        params = {"after": after, "wait": wait}
        return self._call("GET", f"/v1/jobs/{job_id}/events", EventPage, wait + 10, params=params)

    def artifacts(self, job_id: str) -> ArtifactList:
        return self._call("GET", f"/v1/jobs/{job_id}/artifacts", ArtifactList)

    def download_artifact(self, job_id: str, name: str) -> Iterator[bytes]:
        """The bytes of artifact ``name`` of ``job_id``, in chunks as they arrive. Raises
        ``ApiFailure`` when the server refuses or cannot be reached."""
        path = f"/v1/jobs/{job_id}/artifacts/{quote(name)}"
        try:
            with self.http.stream("GET", path, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    raise _failure(r)
                yield from r.iter_bytes()
        except httpx.HTTPError as e:
            raise _unreachable(self.server, e) from None

    def logs(self, job_id: str, after: int = 0, wait: float = 0.0) -> LogPage:
        params = {"after": after, "wait": wait}
        return self._call("GET", f"/v1/jobs/{job_id}/logs", LogPage, wait + 10, params=params)

    def nodes(self) -> NodeList:
        return self._call("GET", "/v1/nodes", NodeList)

    def cordon(self, node: str) -> NodeOut:
        """Give ``node`` no new work (admin)."""
        return self._call("POST", f"/v1/nodes/{quote(node, safe='')}/cordon", NodeOut)

    def drain(self, node: str) -> NodeOut:
        """Cordon ``node`` and move its jobs off at their next checkpoint (admin)."""
        return self._call("POST", f"/v1/nodes/{quote(node, safe='')}/drain", NodeOut)

    def uncordon(self, node: str) -> NodeOut:
        """Return ``node`` to service (admin)."""
        return self._call("POST", f"/v1/nodes/{quote(node, safe='')}/uncordon", NodeOut)

    def reclaim(self, node: str, in_s: float) -> ReclaimReply:
        """A spot reclaim notice: ``node`` goes in ``in_s`` seconds; its jobs checkpoint now
        and move off (admin)."""
        path = f"/v1/nodes/{quote(node, safe='')}/reclaim"
        return self._call("POST", path, ReclaimReply, json={"in_s": in_s})

    def cost(self, by: str = "team", since: str = "30d") -> CostReply:
        """GPU-hours and dollars by team, project or job over the last ``since``."""
        return self._call("GET", "/v1/cost", CostReply, params={"by": by, "since": since})

    def fleet(self) -> FleetOut:
        return self._call("GET", "/v1/fleet", FleetOut)

    def whoami(self) -> WhoAmI:
        return self._call("GET", "/v1/whoami", WhoAmI)

    def create_token(self, req: TokenRequest) -> TokenReply:
        return self._call("POST", "/v1/tokens", TokenReply, json=req.model_dump(exclude_none=True))

    def tokens(self) -> TokenList:
        """Every token, oldest first, without its secret (admin)."""
        return self._call("GET", "/v1/tokens", TokenList)

    def revoke_token(self, ref: str) -> TokenOut:
        """Revoke the token ``ref`` names: its id, or the name of one working token (admin)."""
        return self._call("POST", f"/v1/tokens/{quote(ref, safe='')}/revoke", TokenOut)

    def healthy(self) -> bool:
        try:
            return self.http.get("/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False


def _verify(ca: str | Path | None) -> ssl.SSLContext | bool:
    """What https is verified with (see ``boltforge.tls.verify_with``)."""
    if not ca:
        return True
    from boltforge.tls import verify_with  # loads cryptography: only for those who use TLS

    return verify_with(ca)


def _unreachable(server: str, error: httpx.HTTPError) -> ApiFailure:
    """The failure for a request that got no answer, with its fix: a server certificate
    that did not verify, a server that hung up on plain HTTP (it may serve HTTPS), or a
    server that is not there."""
    from boltforge.tls import certificate_problem

    problem = certificate_problem(error)
    if problem:
        return ApiFailure(
            0,
            f"cannot verify the TLS certificate of {server}: {problem}. To fix: pass --ca "
            "with the CA certificate that signed it (or set BOLT_CA)",
        )
    if server.startswith("http://") and isinstance(error, httpx.RemoteProtocolError):
        return ApiFailure(
            0,
            f"cannot reach {server}: {str(error).rstrip('.')}. To fix: if it serves HTTPS, "
            "use an https:// URL in --server or BOLT_SERVER; else check that it is running",
        )
    return ApiFailure(
        0,
        f"cannot reach {server}: {error}. To fix: start it with "
        "`bolt up` or `bolt server`, or set BOLT_SERVER",
    )


def retry_after(r: httpx.Response) -> float | None:
    """Seconds to wait before sending again when ``r`` is a 429 or 503 with a ``Retry-After``
    in seconds of at most ``MAX_RETRY_AFTER_S``; None for any other reply."""
    if r.status_code not in (429, 503):
        return None
    try:
        seconds = float(r.headers.get("retry-after", ""))
    except ValueError:
        return None
    return max(seconds, 0.0) if seconds <= MAX_RETRY_AFTER_S else None


def _failure(r: httpx.Response) -> ApiFailure:
    try:
        body = r.json()
    except ValueError:
        return ApiFailure(r.status_code, r.text[:500] or f"HTTP {r.status_code}")
    problems = [Problem.model_validate(p) for p in body.get("problems", [])]
    return ApiFailure(r.status_code, str(body.get("error", body)), problems)


def _plus(a: TeamLoad, b: TeamLoad) -> TeamLoad:
    """One team's load from two listings of different jobs."""
    return TeamLoad(
        team=a.team,
        pending=a.pending + b.pending,
        running=a.running + b.running,
        gpus=a.gpus + b.gpus,
    )
