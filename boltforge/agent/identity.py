"""Which Unix user a bare-process replica runs as: one per team, never the agent's own.

An agent running as root runs every replica without an image as its team's user: the one
``--team-user TEAM=USER`` names, else ``<prefix><team>`` (``bolt-nlp``), which the agent
creates on first use (``useradd --system --no-create-home --shell /usr/sbin/nologin
--user-group``, its comment ``boltforge team <team>``); a user of that name made by hand
(or for the Slurm bridge's ``--team-user-pattern bolt-{team}``) is used as it is. A team name
that is not a portable user name (dots, or too long) gets a shortened name with a hash of the
team in it. A user whose comment says it was made for another team is never used, nor is one
with uid or gid 0: the replica fails to start, naming the fix. So two teams never share a
uid, as long as the admin maps no two teams to one user by hand.

An agent that is not root cannot switch users: it refuses bare-process work unless its admin
opted in with ``--allow-shared-identity`` (a single-user fleet, ``bolt up`` as a normal user),
and then runs every team's replicas as itself. The same flag on a root agent runs them all as
root: only for a machine that runs no one else's work (a test box). Containers are not
affected: they run as ``nobody`` inside their own sandbox (``containers``)."""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import re
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from boltforge.agent.hooks import clean_env

log = logging.getLogger("boltforge.agent")

DEFAULT_PREFIX = "bolt-"
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
MAX_USER = 32
COMMENT = "boltforge team "
USERADD_TIMEOUT_S = 30.0
SHARED_FLAG = "--allow-shared-identity"


class IdentityRefused(ValueError):
    """A replica cannot run as a user of its team's own here; the message names the fix."""


@dataclass(frozen=True, slots=True)
class Identity:
    """The Unix user a replica runs as: ``user`` (name), ``uid`` and primary ``gid``."""

    user: str
    uid: int
    gid: int


def user_for(team: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The user name team ``team`` maps to by default: ``<prefix><team>`` when that is a
    portable user name, else the prefix, the team's name cut short (dots as underscores)
    and 8 hex digits of its sha256, so distinct teams get distinct names."""
    name = prefix + team
    if USER_NAME.match(name):
        return name
    digest = hashlib.sha256(team.encode()).hexdigest()[:8]
    stem = re.sub(r"[^a-z0-9_-]", "_", team.lower())[: MAX_USER - len(prefix) - 9]
    return f"{prefix}{stem}-{digest}"


def parse_team_users(pairs: list[str]) -> dict[str, str]:
    """``TEAM=USER`` pairs (``--team-user``) as a mapping. Raises ``IdentityRefused``
    naming the option and the fix for a pair without ``=`` or one team given twice."""
    out: dict[str, str] = {}
    for pair in pairs:
        team, sep, user = pair.partition("=")
        if not sep or not team or not user:
            raise IdentityRefused(
                f"--team-user {pair!r}: expected TEAM=USER. To fix: e.g. --team-user nlp=nlp-jobs"
            )
        if team in out:
            raise IdentityRefused(
                f"--team-user: team {team} is mapped twice. To fix: give each team one user"
            )
        out[team] = user
    return out


@dataclass
class Identities:
    """How this agent maps teams to users (module docstring). ``can_switch``: the agent
    runs as root; ``allow_shared``: its admin opted in to running every team's replicas as
    the agent's own user (whether or not it could switch); ``create``: make missing users with
    ``useradd``. ``users``: explicit ``team -> user`` names, used as they are."""

    prefix: str = DEFAULT_PREFIX
    users: Mapping[str, str] = field(default_factory=dict)
    allow_shared: bool = False
    can_switch: bool = field(default_factory=lambda: os.geteuid() == 0)
    create: bool = True
    _known: dict[str, Identity] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def agents_own(cls) -> Identities:
        """Every replica runs as the agent's own user (an embedding that isolates its
        replicas otherwise; ``bolt agent`` never uses it without ``--allow-shared-identity``)."""
        return cls(allow_shared=True, can_switch=False)

    @property
    def isolates(self) -> bool:
        """Whether replicas of different teams run as different users."""
        return self.can_switch and not self.allow_shared

    def describe(self) -> str:
        """How replicas are mapped, in words, for the agent's log."""
        if self.allow_shared:
            return f"as the agent's own user, every team alike ({SHARED_FLAG})"
        if self.can_switch:
            return f"as a user per team ({self.prefix}<team>, made on first use)"
        return f"nowhere: the agent is not root and {SHARED_FLAG} was not given"

    def for_team(self, team: str) -> Identity | None:
        """The identity team ``team``'s bare-process replicas run as; None: the agent's
        own (only where the admin opted in). Raises ``IdentityRefused`` naming the fix when
        they may not run here. Blocking (it may run ``useradd``): call from a thread."""
        if self.allow_shared:
            return None
        if not self.can_switch:
            raise IdentityRefused(
                f"this agent runs as {_me()}, not root, so it cannot run team "
                f"{team or '(none)'}'s replica as a user of the team's own, and jobs of "
                "different teams would share one Unix identity (each could read the others' "
                "files and environment). To fix: run the agent as root, or give it an image "
                f"to run in a container; on a single-user fleet, start the agent with "
                f"{SHARED_FLAG}"
            )
        if not team:
            raise IdentityRefused(
                "the server did not say which team the replica belongs to, so it has no "
                "user to run as. To fix: run a server of this agent's version or later"
            )
        with self._lock:
            if team not in self._known:
                self._known[team] = self._resolve(team)
            return self._known[team]

    def _resolve(self, team: str) -> Identity:
        explicit = self.users.get(team)
        name = explicit or user_for(team, self.prefix)
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            if explicit or not self.create:
                raise IdentityRefused(
                    f"user {name} (team {team}'s) does not exist on this node. To fix: "
                    f"create it (useradd --system {name}) or map the team to another user "
                    "with --team-user"
                ) from None
            entry = _create(name, team)
        gecos = entry.pw_gecos
        owner = gecos.removeprefix(COMMENT) if gecos.startswith(COMMENT) else None
        if not explicit and owner not in (None, team):
            raise IdentityRefused(
                f"user {name} was made for team {owner}, not {team}. To fix: map team {team} "
                f"to a user of its own with --team-user {team}=USER"
            )
        if entry.pw_uid == 0 or entry.pw_gid == 0:
            raise IdentityRefused(
                f"user {name} (team {team}'s) is root or in group root. To fix: map the "
                "team to an unprivileged user with --team-user"
            )
        return Identity(name, entry.pw_uid, entry.pw_gid)


def _create(name: str, team: str) -> pwd.struct_passwd:
    """Make the system user ``name`` for ``team`` (module docstring); its passwd entry.
    Raises ``IdentityRefused`` when ``useradd`` fails."""
    argv = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
    argv += ["--user-group", "--comment", COMMENT + team, name]
    try:
        done = subprocess.run(
            argv,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=USERADD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise IdentityRefused(f"could not create user {name} for team {team}: {e}") from None
    # 9: the name is taken (made meanwhile by another agent on this host)
    if done.returncode not in (0, 9):
        raise IdentityRefused(
            f"could not create user {name} for team {team}: useradd exited "
            f"{done.returncode}: {done.stderr.strip()}. To fix: create it by hand or map the "
            "team with --team-user"
        )
    log.info("created user %s for team %s", name, team)
    return pwd.getpwnam(name)


def _me() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"
