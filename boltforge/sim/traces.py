"""Job traces for the simulator: the ITP and Philly production logs, a Boltforge CSV for users'
own logs, and a seeded synthetic generator shaped like the real traces.

Every loader returns ``TraceJob``s sorted by ``(submit_s, id)``. Bad input raises
``TraceError`` naming the file, the row (1-based data row, with its line in the file), the
column, the value and the fix; no raw ``KeyError``/``ValueError`` escapes. Formats, the team
rule and the conversions are described in ``docs/traces.md``.
"""

from __future__ import annotations

import bisect
import csv
import functools
import hashlib
import itertools
import math
import operator
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import numpy as np

from boltforge.sim.records import TraceJob

__all__ = [
    "FORMATS",
    "TraceError",
    "load_trace",
    "offered_load",
    "read_csv",
    "read_itp",
    "read_philly",
    "scale_load",
    "synthetic",
    "team_for",
]

PathLike = str | os.PathLike[str]

ITP_COLUMNS = ("job_id", "submission_time", "duration", "num_gpu")
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
CSV_COLUMNS = ("job_id", "submit_s", "duration_s", "gpus")
FORMATS: dict[str, tuple[str, ...]] = {
    "csv": CSV_COLUMNS,
    "itp": ITP_COLUMNS,
    "philly": PHILLY_COLUMNS,
}
FORMAT_NAMES = {"csv": "Boltforge CSV", "itp": "ITP", "philly": "Philly"}
DEFAULT_TEAM = "default"
MIN_DURATION_S = 1.0  # a recorded duration of 0 s is raised to this

# Synthetic shape (see docs/traces.md): sizes are powers of two, mostly 1 GPU; runtimes are
# log-normal with a 1 h median and a p99 near 58 h, clipped to [60 s, 30 days].
SYNTHETIC_SIZES = (1, 2, 4, 8, 16, 32, 64)
SYNTHETIC_SIZE_SHARES = (0.80, 0.05, 0.04, 0.08, 0.015, 0.01, 0.005)
SYNTHETIC_MEDIAN_S = 3600.0
SYNTHETIC_SIGMA = 1.75
SYNTHETIC_MIN_S = 60.0
SYNTHETIC_MAX_S = 30 * 86400.0

_NO_VALUE = object()
_ORDER = operator.attrgetter("submit_s", "id")

_Raw = tuple[str, float, float, int, str]  # id, submit_s, duration_s, gpus, team


class TraceError(ValueError):
    """A trace could not be used. ``path``, ``row`` (1-based data row; 0 is the header),
    ``line`` (line in the file), ``column`` and ``value`` say where; the message says how to
    fix it. Any of them is None when it does not apply."""

    def __init__(
        self,
        path: str,
        problem: str,
        fix: str,
        *,
        row: int | None = None,
        line: int | None = None,
        column: str | None = None,
        value: object = _NO_VALUE,
    ) -> None:
        self.path = path
        self.problem = problem
        self.fix = fix
        self.row = row
        self.line = line
        self.column = column
        self.value = None if value is _NO_VALUE else value
        where = path
        if row is not None:
            where += ", header" if row == 0 else f", row {row}"
            where += f" (line {line})" if line is not None else ""
        if column is not None:
            where += f", column '{column}'"
        got = "" if value is _NO_VALUE else f" (got {value!r})"
        super().__init__(f"{where}: {problem}{got}. To fix: {fix}")
        self._value = value

    def __reduce__(self) -> tuple[object, tuple[()]]:
        """Pickle by the constructor's arguments (e.g. for errors raised in worker processes)."""
        rebuild = functools.partial(
            TraceError,
            self.path,
            self.problem,
            self.fix,
            row=self.row,
            line=self.line,
            column=self.column,
        )
        if self._value is not _NO_VALUE:
            rebuild = functools.partial(rebuild, value=self._value)
        return (rebuild, ())


# --- teams -------------------------------------------------------------------------------


class _TeamPicker:
    """Deterministic, skewed team assignment from a job id and a seed.

    ``u`` = the first 8 bytes (big-endian) of ``blake2b(f"{seed}:{job_id}", digest_size=8)``.
    Team ``k`` (of ``teams``) has integer weight ``L // (k + 1)``, ``L = lcm(1..teams)`` (Zipf,
    exponent 1). ``r = u * sum(weights) >> 64``; the job goes to the first ``k`` whose
    cumulative weight exceeds ``r``. Names are ``team-00``, ``team-01``, ... Exact integer
    arithmetic: the same on every machine and Python process.
    """

    def __init__(self, teams: int, source: str) -> None:
        if isinstance(teams, bool) or not isinstance(teams, int) or teams < 1:
            raise TraceError(
                source, "teams must be a whole number >= 1", "pass e.g. teams=8", value=teams
            )
        scale = math.lcm(*range(1, teams + 1))
        self.cumulative = list(itertools.accumulate(scale // (k + 1) for k in range(teams)))
        self.total = self.cumulative[-1]
        width = max(2, len(str(teams - 1)))
        self.names = [f"team-{k:0{width}d}" for k in range(teams)]

    def team(self, seed: int, job_id: str) -> str:
        digest = hashlib.blake2b(f"{seed}:{job_id}".encode(), digest_size=8).digest()
        r = (int.from_bytes(digest, "big") * self.total) >> 64
        return self.names[bisect.bisect_right(self.cumulative, r)]


def team_for(job_id: str, teams: int = 8, seed: int = 0) -> str:
    """The team ``read_itp`` and ``synthetic`` charge ``job_id`` to (see ``_TeamPicker``)."""
    return _TeamPicker(teams, "team_for").team(seed, job_id)


# --- reading CSV files ---------------------------------------------------------------------


@dataclass(slots=True)
class _Cursor:
    """The current data row of a file, with typed, validated access to its cells."""

    path: str
    columns: dict[str, int]
    fields: list[str]
    row: int = 0
    line: int = 0

    def fail(self, column: str, value: object, problem: str, fix: str) -> TraceError:
        """An error at this row and ``column`` (the caller raises it)."""
        return TraceError(
            self.path, problem, fix, row=self.row, line=self.line, column=column, value=value
        )

    def text(self, column: str) -> str:
        """The stripped cell ('' when the column is absent or the row is short)."""
        try:
            return self.fields[self.columns[column]].strip()
        except (KeyError, IndexError):
            return ""

    def required(self, column: str) -> str:
        """The stripped, non-empty cell."""
        raw = self.text(column)
        if not raw:
            raise self.fail(column, raw, "is empty", "fill in the value or remove the row")
        return raw

    def number(self, column: str) -> float:
        """A finite number (the fast path skips ``required``; errors re-read the cell)."""
        try:
            value = float(self.fields[self.columns[column]])
        except (KeyError, IndexError, ValueError):
            value = math.nan
        if not math.isfinite(value):
            raw = self.required(column)
            raise self.fail(column, raw, "must be a number", "write a plain number like 3600")
        return value

    def duration(self, column: str) -> float:
        """Seconds >= 0; 0 is raised to ``MIN_DURATION_S``."""
        value = self.number(column)
        if value < 0:
            raise self.fail(
                column, self.text(column), "must not be negative", "correct or remove the row"
            )
        return value if value > 0 else MIN_DURATION_S

    def limit(self, column: str) -> float | None:
        """Seconds > 0, or None when the column is absent or the cell blank."""
        raw = self.text(column)
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        fix = "write the limit in seconds, e.g. 86400, or leave the cell empty for none"
        if not math.isfinite(value):
            raise self.fail(column, raw, "must be a number of seconds", fix)
        if value <= 0:
            raise self.fail(column, raw, "must be more than 0 seconds", fix)
        return value

    def gpus(self, column: str) -> int:
        """A whole number >= 1 (``8.0`` is read as 8)."""
        try:
            value = int(self.fields[self.columns[column]])
        except (KeyError, IndexError, ValueError):
            raw = self.required(column)
            try:
                as_float = float(raw)
            except ValueError:
                as_float = math.nan
            if not as_float.is_integer():
                raise self.fail(
                    column, raw, "must be a whole number of GPUs", "write e.g. 8"
                ) from None
            value = int(as_float)
        if value < 1:
            raise self.fail(
                column, self.text(column), "must be at least 1 GPU", "correct or remove the row"
            )
        return value


def _header_of(path: str, reader: Iterator[list[str]]) -> list[str]:
    """The first non-blank row, stripped and lowercased; an empty file is an error."""
    for fields in reader:
        if any(f.strip() for f in fields):
            return [f.strip().lower() for f in fields]
    raise TraceError(path, "the file is empty", "give a CSV file with a header row and jobs")


def _read_header(path: PathLike) -> list[str]:
    """The lowercased column names of ``path``'s first non-blank row."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8-sig", newline="") as f:
            return _header_of(name, csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise _io_error(name, e) from None


def _io_error(path: str, e: Exception) -> TraceError:
    """A ``TraceError`` for an exception met opening or parsing ``path``."""
    if isinstance(e, FileNotFoundError):
        return TraceError(path, "file not found", "check the path")
    if isinstance(e, IsADirectoryError):
        return TraceError(path, "is a directory, not a file", "name a CSV file inside it")
    if isinstance(e, UnicodeDecodeError):
        return TraceError(path, "is not UTF-8 text", "save the trace as a UTF-8 CSV file")
    if isinstance(e, csv.Error):
        return TraceError(path, f"is not valid CSV ({e})", "fix the quoting on that line")
    return TraceError(path, f"cannot be read ({e.__class__.__name__}: {e})", "check the file")


def _rows(path: PathLike, fmt: str) -> Iterator[_Cursor]:
    """Yield one cursor (reused) per non-blank data row of ``path`` in format ``fmt``, after
    checking the header has ``fmt``'s columns. Raises ``TraceError`` for I/O and CSV errors."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            header = _header_of(name, reader)
            cursor = _Cursor(name, _column_index(name, fmt, header, reader.line_num), [])
            for fields in reader:
                if not "".join(fields).strip():
                    continue
                cursor.fields = fields
                cursor.row += 1
                cursor.line = reader.line_num
                yield cursor
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise _io_error(name, e) from None


def _column_index(path: str, fmt: str, header: list[str], line: int) -> dict[str, int]:
    """Column name -> position (first occurrence); every column ``fmt`` needs must be there."""
    columns: dict[str, int] = {}
    for i, column in enumerate(header):
        columns.setdefault(column, i)
    for column in FORMATS[fmt]:
        if column not in columns:
            raise TraceError(
                path,
                f"the {FORMAT_NAMES[fmt]} format needs column '{column}'",
                f"use the header {','.join(FORMATS[fmt])}"
                + (",team" if fmt == "csv" else "")
                + " or pick the right format",
                row=0,
                line=line,
                column=column,
                value=",".join(header),
            )
    return columns


def _check_unique(seen: dict[str, int], job_id: str, cursor: _Cursor) -> None:
    """Record ``job_id`` at the cursor's row; an id seen on an earlier row is an error."""
    first = seen.setdefault(job_id, cursor.row)
    if first != cursor.row:
        raise cursor.fail(
            "job_id", job_id, f"repeats the id of row {first}", "give every job a unique id"
        )


def _finish(
    path: str, raw: list[_Raw], *, shift: bool, limits: dict[str, float] | None = None
) -> list[TraceJob]:
    """TraceJobs sorted by (submit_s, id); with ``shift`` the first submission is at 0.
    ``limits`` gives jobs their ``time_limit_s`` by id."""
    if not raw:
        raise TraceError(path, "the file has a header but no jobs", "add at least one job row")
    origin = min(r[1] for r in raw) if shift else 0.0
    given = limits or {}
    jobs = [TraceJob(i, s - origin, d, g, t, time_limit_s=given.get(i)) for i, s, d, g, t in raw]
    jobs.sort(key=_ORDER)
    return jobs


# --- the readers ---------------------------------------------------------------------------


def read_itp(path: PathLike, teams: int = 8, seed: int = 0) -> list[TraceJob]:
    """Read an ITP trace (``job_id,submission_time,duration,num_gpu``; seconds, GPUs).

    ITP records no team: each job gets one of ``teams`` skewed teams from its id and ``seed``
    (rule in ``_TeamPicker``). Submit times are shifted so the first is 0; a duration of 0 s
    becomes 1 s. Job ids must be unique. Raises ``TraceError`` on bad input.
    """
    picker = _TeamPicker(teams, os.fspath(path))
    raw: list[_Raw] = []
    seen: dict[str, int] = {}
    for c in _rows(path, "itp"):
        job_id = c.required("job_id")
        _check_unique(seen, job_id, c)
        submit, duration = c.number("submission_time"), c.duration("duration")
        raw.append((job_id, submit, duration, c.gpus("num_gpu"), picker.team(seed, job_id)))
    return _finish(os.fspath(path), raw, shift=True)


def read_philly(path: PathLike) -> list[TraceJob]:
    """Read Pollux's Philly trace (``timestamp,duration,num_gpus,gpu_time,cluster``).

    ``timestamp`` is a wall-clock time (``YYYY-MM-DD HH:MM:SS``, any ISO 8601 form accepted),
    taken as written: no time zone or daylight-saving correction (zoned times are converted
    to UTC). ``submit_s`` is seconds from the earliest timestamp; the team is ``cluster`` (the
    virtual cluster); ids are ``philly-<0-based data row index>``; ``gpu_time`` is not used.
    A duration of 0 s becomes 1 s. Raises ``TraceError`` on bad input.
    """
    rows: list[tuple[str, datetime, float, int, str]] = []
    for c in _rows(path, "philly"):
        stamp = c.required("timestamp")
        try:
            when = datetime.fromisoformat(stamp)
        except ValueError:
            raise c.fail(
                "timestamp", stamp, "is not a date and time", "write it like 2017-10-09 07:01:55"
            ) from None
        if when.tzinfo is not None:
            when = when.astimezone(UTC).replace(tzinfo=None)
        team = c.required("cluster")
        rows.append((f"philly-{c.row - 1}", when, c.duration("duration"), c.gpus("num_gpus"), team))
    origin = min((r[1] for r in rows), default=datetime.min)
    raw = [(i, (w - origin).total_seconds(), d, g, t) for i, w, d, g, t in rows]
    return _finish(os.fspath(path), raw, shift=False)


def read_csv(path: PathLike) -> list[TraceJob]:
    """Read a Boltforge CSV trace: ``job_id,submit_s,duration_s,gpus[,team][,time_limit_s]``.

    ``submit_s`` is seconds >= 0 from the trace start, kept as written (not shifted);
    ``duration_s`` seconds >= 0 (0 becomes 1 s); ``gpus`` a whole number >= 1; ``team``
    optional (absent or blank: ``"default"``); ``time_limit_s`` optional, the job's time limit
    in seconds > 0, used as given (absent or blank: none given, the replay's limit model gives
    one). Other columns are ignored; ids must be unique. Raises ``TraceError`` on bad input.
    """
    raw: list[_Raw] = []
    limits: dict[str, float] = {}
    seen: dict[str, int] = {}
    for c in _rows(path, "csv"):
        job_id = c.required("job_id")
        _check_unique(seen, job_id, c)
        submit = c.number("submit_s")
        if submit < 0:
            raise c.fail(
                "submit_s", c.text("submit_s"), "must not be negative", "count from the start, 0"
            )
        duration, gpus = c.duration("duration_s"), c.gpus("gpus")
        limit = c.limit("time_limit_s")
        if limit is not None:
            limits[job_id] = limit
        raw.append((job_id, submit, duration, gpus, c.text("team") or DEFAULT_TEAM))
    return _finish(os.fspath(path), raw, shift=False, limits=limits)


def synthetic(
    jobs: int, seed: int = 0, teams: int = 8, mean_interarrival_s: float = 120.0
) -> list[TraceJob]:
    """``jobs`` synthetic jobs, the same for the same arguments (``numpy`` PCG64 from ``seed``).

    Poisson arrivals (exponential gaps of mean ``mean_interarrival_s``, first job at 0);
    sizes from ``SYNTHETIC_SIZES`` with ``SYNTHETIC_SIZE_SHARES`` (80% 1 GPU, rare 16-64);
    runtimes log-normal (median 1 h, sigma 1.75: p99 ~58 h), rounded to whole seconds and
    clipped to [60 s, 30 days]. Ids ``syn-000000``...; teams by the ITP rule.
    """
    _check_synthetic(jobs, seed, mean_interarrival_s)
    picker = _TeamPicker(teams, "synthetic")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(mean_interarrival_s, jobs)
    submits = (np.cumsum(gaps) - gaps[0]).tolist()
    sizes = rng.choice(np.array(SYNTHETIC_SIZES), size=jobs, p=SYNTHETIC_SIZE_SHARES).tolist()
    runtimes = rng.lognormal(math.log(SYNTHETIC_MEDIAN_S), SYNTHETIC_SIGMA, jobs)
    durations = np.clip(np.rint(runtimes), SYNTHETIC_MIN_S, SYNTHETIC_MAX_S).tolist()
    width = max(6, len(str(jobs - 1)))
    out = []
    for k in range(jobs):
        job_id = f"syn-{k:0{width}d}"
        team = picker.team(seed, job_id)
        out.append(TraceJob(job_id, float(submits[k]), float(durations[k]), int(sizes[k]), team))
    out.sort(key=_ORDER)
    return out


def _check_synthetic(jobs: int, seed: int, mean_interarrival_s: float) -> None:
    """``synthetic``'s arguments: jobs >= 1, seed >= 0, a finite mean gap > 0."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise TraceError(
            "synthetic", "jobs must be a whole number >= 1", "pass e.g. 5000", value=jobs
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TraceError("synthetic", "seed must be a whole number >= 0", "pass e.g. 0", value=seed)
    if not (isinstance(mean_interarrival_s, int | float) and 0 < mean_interarrival_s < math.inf):
        raise TraceError(
            "synthetic",
            "mean_interarrival_s must be a number of seconds > 0",
            "pass e.g. 120",
            value=mean_interarrival_s,
        )


# --- entry point and load helpers ----------------------------------------------------------


def load_trace(
    path: PathLike, fmt: str | None = None, *, teams: int = 8, seed: int = 0
) -> list[TraceJob]:
    """Load a trace sorted by ``(submit_s, id)``.

    ``fmt`` is ``"itp"``, ``"philly"`` or ``"csv"``; None detects it from the header columns.
    ``path`` may be ``synthetic:N`` for ``synthetic(N, seed, teams)``. ``teams`` and ``seed``
    apply to the formats that carry no team (ITP, synthetic). Raises ``TraceError``.
    """
    name = os.fspath(path)
    if isinstance(path, str) and name.startswith("synthetic:"):
        count = name.removeprefix("synthetic:").strip()
        if not count.isdigit():
            raise TraceError(name, "synthetic:N needs a job count N", "e.g. synthetic:5000")
        return synthetic(int(count), seed=seed, teams=teams)
    if fmt is None:
        fmt = _detect(name)
    if fmt == "itp":
        return read_itp(name, teams=teams, seed=seed)
    if fmt == "philly":
        return read_philly(name)
    if fmt == "csv":
        return read_csv(name)
    raise TraceError(
        name,
        f"unknown trace format {fmt!r}",
        "use one of itp, philly, csv, or leave it out to detect it from the header",
    )


def _detect(path: str) -> str:
    """The first format (csv, itp, philly) whose columns the header holds."""
    header = set(_read_header(path))
    for fmt, columns in FORMATS.items():
        if header.issuperset(columns):
            return fmt
    wanted = "; ".join(f"{fmt}: {','.join(cols)}" for fmt, cols in FORMATS.items())
    raise TraceError(
        path,
        "the header matches no known trace format",
        f"use one of these headers ({wanted}) or name the format",
        row=0,
        value=",".join(sorted(header)),
    )


def scale_load(jobs: Iterable[TraceJob], factor: float) -> list[TraceJob]:
    """The jobs with every ``submit_s`` divided by ``factor`` (2: arrivals twice as dense,
    twice the offered load); order, durations, sizes and teams unchanged. ``factor`` > 0."""
    if not (isinstance(factor, int | float) and 0 < factor < math.inf):
        raise TraceError(
            "scale_load",
            "factor must be a number > 0",
            "pass e.g. 2 for twice the load",
            value=factor,
        )
    return [replace(j, submit_s=j.submit_s / factor) for j in jobs]


def offered_load(jobs: Sequence[TraceJob], total_gpus: int) -> float:
    """GPU-seconds asked for over GPU-seconds available while jobs arrive:
    ``sum(gpus * duration_s) / ((last submit - first submit) * total_gpus)``.

    0.0 for no jobs; ``math.inf`` when all jobs arrive at one instant (span 0).
    """
    if isinstance(total_gpus, bool) or not isinstance(total_gpus, int) or total_gpus < 1:
        raise TraceError(
            "offered_load",
            "total_gpus must be a whole number >= 1",
            "pass e.g. 1024",
            value=total_gpus,
        )
    if not jobs:
        return 0.0
    work = math.fsum(j.gpus * j.duration_s for j in jobs)
    submits = [j.submit_s for j in jobs]
    span = max(submits) - min(submits)
    return work / (span * total_gpus) if span > 0 else math.inf
