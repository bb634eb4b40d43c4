"""The limits of what a spec may hold: sizes, counts, numbers and dates that the fleet, the
agents and the store can act on. A value past one is refused at intake with the field and the
fix, so nothing the scheduler or a node cannot use is ever stored.

The limits, and why:

* ``env``: at most ``MAX_ENV_KEYS`` variables, each name a POSIX name (``[A-Za-z_][A-Za-z0-9_]*``,
  at most ``MAX_ENV_KEY`` characters: a name that is anything else can be read as shell code
  where a backend writes it into a script), each value at most ``MAX_ENV_VALUE`` bytes and all
  together at most ``MAX_ENV_BYTES``; no NUL byte (no process can be given one).
* ``command``: at most ``MAX_ARGS`` arguments and ``MAX_COMMAND_BYTES`` bytes in all, no NUL
  byte. With ``env`` it stays well inside Linux's 2 MiB for a new process's arguments and
  environment, and inside the API's 1 MiB request body.
* Counts: GPUs per replica at most 64 (one host), replicas at most ``MAX_REPLICAS``, so a job's
  GPUs at most ``MAX_GPUS``; CPUs, memory and storage finite and at most what one host could
  hold many times over; durations at most ``MAX_DURATION_S`` (ten years).
* Dates (``deadline``): from ``EARLIEST`` to ``LATEST`` (2000-01-01 to 2200-01-01, UTC for a
  date without a zone): inside every platform's time range, so every date can be ordered.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from boltforge.spec import units

MAX_ENV_KEYS = 512
MAX_ENV_KEY = 256
MAX_ENV_VALUE = 32 * 1024
MAX_ENV_BYTES = 256 * 1024
MAX_ARGS = 4096
MAX_COMMAND_BYTES = 256 * 1024
MAX_GPUS_PER_REPLICA = 64
MAX_REPLICAS = 100_000
MAX_GPUS = MAX_GPUS_PER_REPLICA * MAX_REPLICAS
MAX_CPUS = 100_000.0  # per replica
MAX_MEMORY_GB = 10_000_000.0  # per replica (10 PB)
MAX_GPU_MEMORY_GB = 100_000.0
MAX_DURATION_S = 10 * 366 * 86_400.0
MAX_TEXT = 4096  # an image reference, a project name and other free text
MAX_ITEMS = 64  # GPU models, pools
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def check_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` unchanged, or ValueError naming the first name or value past a limit (see the
    module docstring) and the fix."""
    if len(env) > MAX_ENV_KEYS:
        raise ValueError(
            f"has {len(env)} variables, more than {MAX_ENV_KEYS}. To fix: pass fewer, or put "
            "settings in a file the job reads"
        )
    total = 0
    for key, value in env.items():
        if len(key) > MAX_ENV_KEY or not ENV_NAME.match(key):
            shown = key if len(key) <= 60 else key[:57] + "..."
            raise ValueError(
                f"name {shown!r} is not a variable name. To fix: use letters, digits and '_', "
                f"not starting with a digit, at most {MAX_ENV_KEY} characters (e.g. `MY_VAR`)"
            )
        size = _utf8(value)
        if size > MAX_ENV_VALUE:
            raise ValueError(
                f"{key} is {size} bytes, more than {MAX_ENV_VALUE}. To fix: put the value in "
                "a file the job reads"
            )
        if "\x00" in value:
            raise ValueError(f"{key} holds a NUL byte. To fix: remove it")
        total += _utf8(key) + size
    if total > MAX_ENV_BYTES:
        raise ValueError(
            f"is {total} bytes in all, more than {MAX_ENV_BYTES}. To fix: put large values in a "
            "file the job reads"
        )
    return env


def check_command(command: list[str] | str | None) -> list[str] | str | None:
    """``command`` unchanged, or ValueError when it has too many arguments, too many bytes
    or a NUL byte (see the module docstring)."""
    if command is None:
        return None
    args = [command] if isinstance(command, str) else command
    if len(args) > MAX_ARGS:
        raise ValueError(
            f"has {len(args)} arguments, more than {MAX_ARGS}. To fix: pass them in a file "
            "the job reads"
        )
    total = sum(_utf8(a) + 1 for a in args)
    if total > MAX_COMMAND_BYTES:
        raise ValueError(
            f"is {total} bytes, more than {MAX_COMMAND_BYTES}. To fix: put the script in a "
            "file and run that"
        )
    if any("\x00" in a for a in args):
        raise ValueError("holds a NUL byte. To fix: remove it")
    return command


def check_date(value: datetime) -> datetime:
    """``value`` unchanged, or ValueError when it is outside ``EARLIEST`` to ``LATEST`` (a
    date without a zone is read as UTC for this check)."""
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if not EARLIEST <= aware < LATEST:
        raise ValueError(
            f"must be between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}. To fix: give a date "
            "in that range, e.g. `2026-12-01T18:00:00Z`"
        )
    return value


Env = Annotated[dict[str, str], AfterValidator(check_env)]
Command = Annotated[list[str] | str | None, AfterValidator(check_command)]
Date = Annotated[datetime, AfterValidator(check_date)]
Duration = Annotated[float, BeforeValidator(units.seconds), Field(le=MAX_DURATION_S)]
Text = Annotated[str, Field(max_length=MAX_TEXT)]
Item = Annotated[str, Field(min_length=1, max_length=200)]
Cpus = Annotated[float, Field(ge=0, le=MAX_CPUS)]
MemoryGb = Annotated[float, Field(ge=0, le=MAX_MEMORY_GB)]
GpuMemoryGb = Annotated[float, Field(ge=0, le=MAX_GPU_MEMORY_GB)]
