"""Whose Slurm user runs a job the bridge makes (a ``bolt submit`` job placed on Slurm nodes).

A job sent with ``sbatch`` already belongs to the Slurm user who sent it, and the bridge
leaves it so: it only pins, releases, signals and requeues it. A job sent with ``bolt
submit`` has no Slurm user of its own: the bridge submits its Slurm job as the user its
team maps to (``bolt slurm-bridge --team-user TEAM=USER``, else ``--team-user-pattern``,
e.g. ``bolt-{team}``), through ``runuser -u USER -- sbatch ...``, so the bridge must run as
root to run such jobs. A team with no mapping, a user that does not exist, is root, is the
bridge's own (a job could read the bridge's token from its process) or is another team's is
never run: its job fails with the reason and the option that fixes it.

``sbatch --uid`` is not used: Slurm 22.05 allows it for root only and documents it as an
attempt, and later releases drop it; with ``runuser`` the job is the user's from its first
moment (its credential is the user's own), so partition and account limits apply to it.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

Lookup = Callable[[str], pwd.struct_passwd]

TEAM_USER_FLAG = "--team-user"
PATTERN_FLAG = "--team-user-pattern"
USER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$")


class NoIdentity(ValueError):
    """A job the bridge will not run: no Slurm user of its own team may run it. The message
    is the reason and the fix, written on the job."""


@dataclass(frozen=True)
class RunAs:
    """The Slurm user a team's job runs as: its name, uid and home (where its Slurm output
    goes when the job names no working directory)."""

    user: str
    uid: int
    home: str


@dataclass
class TeamUsers:
    """Team -> Slurm user: ``users`` names them one by one; ``pattern`` (``{team}`` replaced
    by the team's name) covers the rest; None: only ``users``. ``lookup`` reads the user
    database (``pwd.getpwnam``), ``euid`` is the bridge's own user id."""

    users: Mapping[str, str] = field(default_factory=dict)
    pattern: str | None = None
    lookup: Lookup = pwd.getpwnam
    euid: int = field(default_factory=lambda: os.geteuid())

    def run_as(self, team: str) -> RunAs:
        """The user ``team``'s jobs run as; ``NoIdentity`` naming the fix when there is none
        this bridge may use (never root, never another team's by default)."""
        user = self.users.get(team)
        if user is None and self.pattern is not None:
            user = self.pattern.replace("{team}", team)
        if user is None:
            raise NoIdentity(
                f"team {team} has no Slurm user to run as (the bridge runs no team's work as "
                f"another's or as root). To fix: start the bridge with "
                f"{TEAM_USER_FLAG} {team}=USER (or {PATTERN_FLAG} 'bolt-{{team}}')"
            )
        return self._checked(team, user)

    def _checked(self, team: str, user: str) -> RunAs:
        how = f"{TEAM_USER_FLAG} {team}={user}" if team in self.users else f"{PATTERN_FLAG}"
        if not USER_NAME.match(user):
            raise NoIdentity(f"team {team} maps to {user!r} ({how}), not a user name")
        try:
            entry = self.lookup(user)
        except KeyError:
            raise NoIdentity(
                f"team {team} maps to Slurm user {user} ({how}), who does not exist on the "
                f"bridge's host. To fix: create {user} on the bridge's host and every node "
                f"(useradd {user}), or map the team with {TEAM_USER_FLAG} {team}=USER"
            ) from None
        if entry.pw_uid == 0:
            raise NoIdentity(
                f"team {team} maps to {user} ({how}), who is root: the bridge never runs a "
                f"team's work as root. To fix: map it to an unprivileged user"
            )
        if entry.pw_uid == self.euid:
            raise NoIdentity(
                f"team {team} maps to {user} ({how}), the bridge's own user, whose jobs could "
                "read the bridge's token. To fix: map it to a user of its own"
            )
        if self.euid != 0:
            raise NoIdentity(
                f"team {team} runs as {user}, but the bridge runs as uid {self.euid}, not "
                f"root, so it cannot submit as {user}. To fix: run the bridge as root"
            )
        others = sorted(t for t, u in self.users.items() if u == user and t != team)
        if others:
            raise NoIdentity(
                f"team {team} maps to {user} ({how}), who is team {others[0]}'s too: two "
                f"teams' jobs would share one identity. To fix: give each team its own user"
            )
        return RunAs(user, entry.pw_uid, entry.pw_dir)

    def problems(self) -> list[str]:
        """What is wrong with the explicit mappings now (for the command line to refuse
        at start): each ``TEAM=USER`` whose user is missing, root or unusable."""
        out = []
        for team in sorted(self.users):
            try:
                self.run_as(team)
            except NoIdentity as e:
                out.append(str(e))
        return out


def submit_prefix(who: RunAs) -> list[str]:
    """The words before ``sbatch`` (run by root) that make ``who`` its submitter."""
    return ["runuser", "-u", who.user, "--"]


def parse_team_users(pairs: list[str]) -> dict[str, str]:
    """``TEAM=USER`` words as a map; ``ValueError`` naming the first bad one (not a pair,
    or a team given twice)."""
    out: dict[str, str] = {}
    for pair in pairs:
        team, sep, user = (w.strip() for w in pair.partition("="))
        if not sep or not team or not user:
            raise ValueError(
                f"{pair!r} is not TEAM=USER. To fix: e.g. {TEAM_USER_FLAG} nlp=nlp_svc"
            )
        if team in out:
            raise ValueError(f"team {team} is mapped twice. To fix: give each team one user")
        out[team] = user
    return out


# What makes Slurm check that a job's account (-A: its Boltforge team) is one its user has.
ENFORCING = frozenset({"associations", "limits", "qos", "wckeys", "safe", "all"})


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` as key -> value (``Key = Value`` lines; others skipped)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def unchecked_accounts(config: dict[str, str]) -> str | None:
    """Why an ``sbatch`` job's team cannot be trusted on this cluster, or None when Slurm
    checks it: its team is its account, which Slurm checks only with slurmdbd and an
    ``AccountingStorageEnforce`` of associations (or anything that implies it)."""
    storage = config.get("AccountingStorageType", "")
    enforce = {w.strip().lower() for w in config.get("AccountingStorageEnforce", "").split(",")}
    if storage.endswith("slurmdbd") and enforce & ENFORCING:
        return None
    return (
        f"Slurm does not check accounts here (AccountingStorageType={storage or '?'}, "
        f"AccountingStorageEnforce={config.get('AccountingStorageEnforce', '?')}): any Slurm "
        "user may send a job with -A naming any team, and Boltforge counts it against that "
        "team's quota, budget and fair share. To fix: run slurmdbd with "
        "AccountingStorageEnforce=associations"
    )
