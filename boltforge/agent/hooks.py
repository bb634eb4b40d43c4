"""Prolog and epilog scripts: executables the agent runs before a replica starts and after it
ended, with a timeout (like Slurm's prolog and epilog).

They run as the agent's user (root on a real node), so they never get the job's own
environment, which a job could fill with ``BASH_ENV``, ``LD_PRELOAD`` or ``PYTHONPATH``
pointing at files it wrote: they get ``clean_env``, a fixed ``PATH`` and ``LANG`` plus the
values that describe the replica (``processes.hook_env``). Every other helper the agent runs
as root (``useradd``) gets the same fixed base."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

TAIL_CHARS = 2000
DEFAULT_TIMEOUT_S = 60.0
CLEAN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
CLEAN_BASE = {"PATH": CLEAN_PATH, "LANG": "C.UTF-8"}


def clean_env(values: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a script or helper the agent runs as itself: ``PATH`` (system
    directories only) and ``LANG``, then ``values`` (which the caller vouches for: values
    the agent computed, never a job's variables)."""
    return {**CLEAN_BASE, **(values or {})}


@dataclass(frozen=True, slots=True)
class ScriptResult:
    """One script's outcome: ``ok`` when it exited 0 inside its timeout; ``evidence`` says
    what went wrong (exit code or timeout, and the tail of its output)."""

    path: Path
    ok: bool
    seconds: float
    evidence: str = ""


class BadHook(ValueError):
    """A ``--prolog``/``--epilog`` path that does not exist or cannot be run."""


def check_paths(option: str, paths: Iterable[Path]) -> tuple[Path, ...]:
    """Validate the paths given to ``option``: each is an executable file or a directory.
    Raises ``BadHook`` naming the option, the path and the fix."""
    out = []
    for path in paths:
        if path.is_dir():
            out.append(path)
        elif not path.exists():
            raise BadHook(f"{option}: {path} does not exist. To fix: pass an existing file")
        elif not path.is_file() or not os.access(path, os.X_OK):
            raise BadHook(f"{option}: {path} is not an executable file. To fix: chmod +x {path}")
        else:
            out.append(path)
    return tuple(out)


def expand(paths: Iterable[Path]) -> list[Path]:
    """The scripts to run, in order: each file as given; each directory's executable files
    sorted by name (read at every call, so scripts can be added while the agent runs)."""
    scripts: list[Path] = []
    for path in paths:
        if path.is_dir():
            scripts += sorted(p for p in path.iterdir() if p.is_file() and os.access(p, os.X_OK))
        else:
            scripts.append(path)
    return scripts


async def run_scripts(
    paths: Iterable[Path], env: Mapping[str, str], timeout_s: float
) -> list[ScriptResult]:
    """Run the scripts ``paths`` expands to, one after another, stopping at the first that
    fails. Returns every result so far (empty when there was nothing to run)."""
    results = []
    for script in expand(paths):
        result = await run_script(script, env, timeout_s)
        results.append(result)
        if not result.ok:
            break
    return results


async def run_script(path: Path, env: Mapping[str, str], timeout_s: float) -> ScriptResult:
    """Run ``path`` in its own process group with ``env``; past ``timeout_s`` the group is
    killed and the script counts as failed. Never raises for the script's own failures."""
    began = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            str(path),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as e:
        return ScriptResult(path, False, 0.0, f"{path} could not start: {e}")
    assert proc.stdout is not None
    tail = bytearray()
    reader = asyncio.create_task(_read_tail(proc.stdout, tail))
    try:
        code: int | None = await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        _kill_group(proc.pid)
        await proc.wait()
        code = None
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(reader, 1.0)  # a process that left the group may hold the pipe
    reader.cancel()
    took = time.monotonic() - began
    if code == 0:
        return ScriptResult(path, True, took)
    what = f"timed out after {timeout_s:g} s" if code is None else _code_words(code)
    return ScriptResult(path, False, took, _words(path, what, bytes(tail)))


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _read_tail(stream: asyncio.StreamReader, tail: bytearray) -> None:
    """Read ``stream`` to its end, keeping only its last few kilobytes in ``tail``."""
    while chunk := await stream.read(1 << 16):
        tail += chunk
        del tail[: max(len(tail) - 4 * TAIL_CHARS, 0)]


def _code_words(code: int | None) -> str:
    if code is not None and code < 0:
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _words(path: Path, what: str, out: bytes | None) -> str:
    tail = (out or b"").decode(errors="replace").strip()[-TAIL_CHARS:]
    return f"{path} {what}" + (f"; output: {tail}" if tail else "")
