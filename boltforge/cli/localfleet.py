"""A development fleet on this machine, as processes: one ``bolt server`` on SQLite and N
``bolt agent``s with declared 8 x H100 inventories, their pid file, readiness and shutdown.
``bolt up``, ``bolt down`` and ``bolt demo`` drive it.

The tokens are written to files only their owner may read (``tokens/``), which the server
and the agents are pointed at; no token is on a command line. Started by root, the agents
run each team's replicas as a user of its own (``agent/identity.py``): the fleet's folder
is then one those users may pass through but not list, its store, logs, tokens and
certificates readable by root alone. Started by another user, the agents cannot switch
users, so they run with ``--allow-shared-identity`` (every team as that user) and
``shared`` says so; so do they, started by root, when this Python or Boltforge itself lies in
a folder other users cannot reach (``blocked_for_others``: a per-team user could not run the
jobs' ``python``), and ``shared_why`` says why."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from boltforge.cli.credentials import TOKEN_VARS
from boltforge.client import ApiFailure, Client
from boltforge.tls import Certificates, make_certificates

PID_FILE = "up.json"
TOKENS_DIR = "tokens"
SHARED_FLAG = "--allow-shared-identity"
TLS_DIR = "tls"  # the local CA and the server's certificate, with ``bolt up --tls``
AGENT_STOP_S = 45.0  # replicas get their checkpoint grace (30 s in the examples), then a kill
SERVER_STOP_S = 15.0
# A 4-host fleet is too small for the production churn budget (5% of GPUs per 10 minutes)
# and a job would otherwise be safe from preemption for its first 10 minutes.
DEMO_PREEMPTION = ("--min-runtime", "5", "--churn", "1")


class FleetError(Exception):
    """The fleet did not come up; the message says why and how to fix it."""


@dataclass
class LocalFleet:
    """What is running: the server's URL and tokens, and every process id (``up.json``)."""

    data_dir: str
    url: str
    admin_token: str
    agent_token: str
    hosts: int
    server: int = 0
    agents: list[int] = field(default_factory=list)
    ca: str = ""  # the CA certificate that signed the server's (TLS only)
    names: list[str] = field(default_factory=list)  # the agents' node names, as ``agents``
    shared: bool = False  # every team's replicas run as the user who started the fleet
    shared_why: str = ""

    def node_names(self) -> list[str]:
        """The agents' node names, in the order of ``agents``."""
        return self.names or [f"host-{i}" for i in range(self.hosts)]

    @property
    def root(self) -> Path:
        return Path(self.data_dir)

    def save(self) -> None:
        write_private(self.root / PID_FILE, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, data_dir: Path) -> LocalFleet | None:
        try:
            return cls(**json.loads((data_dir / PID_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def alive(self) -> bool:
        return ours(self.server)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (it holds tokens)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def inventory(i: int) -> str:
    """Host ``i``'s declared inventory: 8 x H100-80GB in one NVLink island, two per rack."""
    return (
        f"name: host-{i}\npool: h100\ngpu: H100-80GB\ngpu_memory_gb: 80\ngpus: 8\n"
        f"nvlink_island: 8\nrails: 8\ncpus: 224\nmemory_gb: 2048\npod: p0\nrack: r{i // 2}\n"
        "tier: reserved\nprice_per_gpu_hour: 2.20\naddress: 127.0.0.1\n"
    )


def start(
    data_dir: Path,
    hosts: int,
    port: int,
    tls: bool = False,
    nodes: list[Node] | None = None,
    server_args: tuple[str, ...] = (),
    shared: bool | None = None,
) -> LocalFleet:
    """Start the server and ``hosts`` agents in the background (own sessions, so Ctrl-C in
    the terminal reaches only ``bolt up``, which stops them in order). Output goes to
    ``data_dir/logs``. With ``tls`` the server serves HTTPS with a certificate for 127.0.0.1
    and localhost signed by a local CA in ``data_dir/tls`` (made there once, then reused),
    and the agents verify it with that CA. ``nodes`` replaces the ``hosts`` H100 hosts with
    these agents (inventory and extra ``bolt agent`` arguments); ``server_args`` are added to
    ``bolt server``'s. ``shared``: whether the agents run every team as the user who started
    the fleet (None: unless root can give each team a user of its own; see the module
    docstring). Raises ``FleetError`` when the port is taken."""
    if port_taken(port):
        raise FleetError(f"port {port} is in use. To fix: pick another with --port")
    data_dir = data_dir.resolve()
    why = shared_reason() if shared is None else ("asked to" if shared else "")
    _lay_out(data_dir, isolated=not why)
    certs = make_certificates(data_dir / TLS_DIR) if tls else None
    scheme = "https" if certs else "http"
    nodes = nodes or [Node(f"host-{i}", inventory(i)) for i in range(hosts)]
    fleet = LocalFleet(
        str(data_dir), f"{scheme}://127.0.0.1:{port}", _token(), _token(), len(nodes), server=0
    )
    fleet.ca = str(certs.ca) if certs else ""
    fleet.names = [n.name for n in nodes]
    fleet.shared, fleet.shared_why = bool(why), why
    write_private(fleet.root / TOKENS_DIR / "admin", fleet.admin_token + "\n")
    write_private(fleet.root / TOKENS_DIR / "agent", fleet.agent_token + "\n")
    args = [*_server_args(fleet, port, certs), *server_args]
    fleet.server = _spawn(data_dir / "logs" / "server.log", args)
    fleet.save()
    for node in nodes:
        log = data_dir / "logs" / f"{node.name}.log"
        fleet.agents.append(_spawn(log, _agent_args(fleet, node)))
        fleet.save()
    return fleet


def shared_reason() -> str:
    """Why this machine's fleet runs every team as one user (empty: it need not): the user
    is not root, or a per-team user could not run this Python (``blocked_for_others``)."""
    if os.geteuid() != 0:
        return "only root can run each team as a user of its own"
    import boltforge

    for needed in (Path(sys.executable), Path(os.__file__), Path(boltforge.__file__)):
        blocked = blocked_for_others(needed)
        if blocked is not None:
            return (
                f"{blocked} is closed to other users, so a team's user could not run "
                f"{needed}; install Boltforge where every user can read it (e.g. /opt)"
            )
    return ""


def blocked_for_others(path: Path) -> Path | None:
    """The first folder on the way to ``path`` (links resolved), or the file itself, that
    a user other than its owner may not pass or read; None when there is none."""
    real = path.resolve()
    for folder in reversed(real.parents):
        if not folder.stat().st_mode & 0o001:
            return folder
    return None if real.stat().st_mode & 0o004 else real


def _lay_out(root: Path, isolated: bool) -> None:
    """Create the fleet's folders. ``isolated`` (root runs it; replicas run as their teams'
    users): those users must reach their checkpoint and work folders under ``root`` and
    nothing else of it, so ``root`` and each folder above it must let others pass; the
    store is made before the server starts so that it (and its journal) is root's alone.
    Raises ``FleetError`` naming the folder and the fix."""
    root.mkdir(parents=True, exist_ok=True)
    for private in ("logs", TOKENS_DIR):
        (root / private).mkdir(mode=0o700, exist_ok=True)
        (root / private).chmod(0o700)
    if not isolated:
        return
    root.chmod(0o711)
    for above in root.parents:
        if not above.stat().st_mode & 0o001:
            raise FleetError(
                f"{above} does not let other users pass (mode {above.stat().st_mode & 0o777:o}), "
                f"so replicas, which run as their teams' users, cannot reach {root}. To fix: "
                "pick a --data-dir outside it, e.g. /var/lib/boltforge/up"
            )
    store = root / "server.db"
    os.close(os.open(store, os.O_WRONLY | os.O_CREAT, 0o600))
    store.chmod(0o600)


@dataclass(frozen=True)
class Node:
    """One local agent: its name, declared inventory (YAML) and extra ``bolt agent`` args."""

    name: str
    inventory: str
    args: tuple[str, ...] = ()


def _agent_args(fleet: LocalFleet, node: Node) -> list[str]:
    """``node``'s ``bolt agent`` arguments, its inventory written under ``nodes/``."""
    path = fleet.root / "nodes" / f"{node.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(node.inventory)
    args = ["agent", "--server", fleet.url, "--token-file", str(fleet.root / TOKENS_DIR / "agent")]
    args += ["--inventory", str(path), "--work-dir", str(fleet.root / "agents" / node.name)]
    args += [SHARED_FLAG] if fleet.shared else []
    return args + (["--ca", fleet.ca] if fleet.ca else []) + list(node.args)


def _token() -> str:
    return "bf_" + secrets.token_urlsafe(24)


def _server_args(fleet: LocalFleet, port: int, certs: Certificates | None) -> list[str]:
    root = fleet.root
    tls = ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)] if certs else []
    return [
        "server",
        *("--db", f"sqlite:///{root / 'server.db'}", "--port", str(port)),
        *("--admin-token-file", str(root / TOKENS_DIR / "admin")),
        *("--agent-token-file", str(root / TOKENS_DIR / "agent")),
        *("--checkpoint-root", str(root / "checkpoints")),
        *DEMO_PREEMPTION,
        *tls,
    ]


def _spawn(log: Path, args: list[str]) -> int:
    """``python -m boltforge.cli.main ARGS`` with this interpreter's bin dir first on PATH
    (so ``python`` in a job's command is this environment's)."""
    env = {k: v for k, v in os.environ.items() if k not in TOKEN_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "boltforge.cli.main", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return proc.pid


def wait_ready(fleet: LocalFleet, timeout_s: float = 120.0) -> None:
    """Return once every host is registered and ready; raise ``FleetError`` (with the tail of
    the failing process's log) when a process exits or ``timeout_s`` passes."""
    want = set(fleet.node_names())
    deadline = time.monotonic() + timeout_s
    with Client(fleet.url, fleet.admin_token, timeout=5.0, ca=fleet.ca or None) as client:
        while time.monotonic() < deadline:
            _check_processes(fleet)
            try:
                ready = {n.name for n in client.nodes().nodes if n.state == "ready"}
            except ApiFailure:
                ready = set()
            if want <= ready:
                return
            time.sleep(0.3)
    raise FleetError(
        f"the fleet was not ready after {timeout_s:.0f} s. To fix: read the logs in "
        f"{fleet.root / 'logs'}"
    )


def _check_processes(fleet: LocalFleet) -> None:
    logs = fleet.root / "logs"
    named = [("server", fleet.server), *zip(fleet.node_names(), fleet.agents, strict=False)]
    for name, pid in named:
        if not ours(pid):
            tail = _tail(logs / f"{name}.log")
            raise FleetError(
                f"the {name} process exited: {tail}. To fix: see {logs / (name + '.log')}"
            )


def _tail(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "no output"


def ours(pid: int) -> bool:
    """Whether ``pid`` is alive and is one of our ``boltforge.cli.main`` processes (a pid
    reused by something else after a crash is never signalled)."""
    if pid <= 0:
        return False
    _reap(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        cmdline = b"boltforge.cli.main"
    return b"boltforge.cli.main" in cmdline and not _zombie(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "Z"


def stop(fleet: LocalFleet) -> None:
    """Stop the agents (each stops its replicas gracefully), then the server; what ignores
    SIGTERM past its allowance is killed."""
    _terminate([p for p in fleet.agents if ours(p)], AGENT_STOP_S)
    _terminate([fleet.server] if ours(fleet.server) else [], SERVER_STOP_S)
    (fleet.root / PID_FILE).unlink(missing_ok=True)


def _terminate(pids: list[int], allowance_s: float) -> None:
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + allowance_s
    while time.monotonic() < deadline and any(ours(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if ours(pid):
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: signal.Signals) -> None:
    """Signal ``pid``'s process group (it leads its own session) so stray children go too."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)
