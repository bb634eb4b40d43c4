"""Where long-running commands (``bolt server``, ``bolt agent``, the Slurm bridge, the
Kubernetes scheduler) take their tokens from: a file (``--token-file``) or an environment
variable, read once at start; never from a command line, which every user of the host can
read (``/proc/PID/cmdline``). The variables are then removed from the process's environment,
so no child (a replica, a hook, a helper) inherits them. A token still given on the command
line works for one more release, with a warning."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import typer
from rich.markup import escape

from boltforge.cli.common import EXIT_BAD_INPUT, errors

# Every variable that carries a token or names a token file (removed by ``forget_env``).
TOKEN_VARS = (
    "BOLT_TOKEN",
    "BOLT_ADMIN_TOKEN",
    "BOLT_AGENT_TOKEN",
    "BOLT_TOKEN_FILE",
    "BOLT_ADMIN_TOKEN_FILE",
    "BOLT_AGENT_TOKEN_FILE",
)


@dataclass(frozen=True, slots=True)
class TokenSource:
    """Where one token may come from: ``option`` (the deprecated command-line option),
    ``file_option`` (its file), and ``env`` (the variable holding the token itself)."""

    option: str
    file_option: str
    env: str


# The admin token of the Slurm bridge and the Kubernetes scheduler.
BRIDGE_TOKEN = TokenSource("--token", "--token-file", "BOLT_TOKEN")


def read_token(source: TokenSource, given: str | None, file: Path | None) -> str | None:
    """The token ``source`` names: from ``file``, else the deprecated command-line value
    ``given`` (with a warning), else the environment variable; None when none is given.
    Exits 2 naming the option when the file cannot be read or is empty, or both the file
    and the command-line value are given."""
    if file is not None and given:
        _fail(
            f"{source.file_option} and {source.option} both give a token. To fix: pass "
            f"{source.file_option} only"
        )
    if file is not None:
        return _from_file(source.file_option, file)
    if given:
        errors.print(
            f"[yellow]warning[/] {source.option} puts the token on the command line, where "
            f"every user of this host can read it. It is deprecated and goes in a later "
            f"release. To fix: pass {source.file_option} PATH (a file only you can read) or "
            f"set {source.env}",
            highlight=False,
            soft_wrap=True,
        )
        return given.strip()
    from_env = os.environ.get(source.env, "").strip()
    return from_env or None


def forget_env() -> None:
    """Remove every token variable (``TOKEN_VARS``) from this process's environment, once
    its tokens were read, so that no child process inherits them."""
    for name in TOKEN_VARS:
        os.environ.pop(name, None)


def _from_file(option: str, path: Path) -> str:
    try:
        text = path.read_text().strip()
        mode = path.stat().st_mode
    except OSError as e:
        why = e.strerror or str(e)
        _fail(f"{option} {path}: {why}. To fix: pass a readable file that holds the token")
    if not text:
        _fail(f"{option} {path} is empty. To fix: write the token into it")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        errors.print(
            f"[yellow]warning[/] {option} {escape(str(path))}: others may read it (mode "
            f"{stat.S_IMODE(mode):o}). To fix: chmod 600 {escape(str(path))}",
            highlight=False,
            soft_wrap=True,
        )
    return text.splitlines()[0].strip()


def _fail(message: str) -> NoReturn:
    errors.print(f"[bold red]error[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)
