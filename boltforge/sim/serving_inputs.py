"""The serving study's inputs: a request-rate trace (CSV) and the services that serve it (YAML).

**Request-rate trace.** A CSV with the header ``time_s,service,requests_per_s`` and one row per
service per step: ``time_s`` seconds on the training trace's clock (the first is 0, then every
``step_s``, the same step throughout), ``service`` a name from the services file,
``requests_per_s`` the mean rate offered over ``[time_s, time_s + step_s)``. Rows are sorted
by ``time_s``; every service has exactly one row at every time. The trace covers
``[0, horizon_s)``, ``horizon_s`` the last time plus one step.

**Services.** A YAML mapping with a ``services`` list; each entry names a service, the GPUs of
one replica (a replica is on one host), how many requests per second a replica serves at most
(``rps_per_replica``), its p99 latency SLO and the p99 a replica gives at light load
(``base_latency_ms``), its replica range, and how long a new replica takes before it serves
(``cold_start_s``). ``target_utilization``, ``target_queue``, ``scale_down_window_s`` and
``predictive`` tune its autoscaler (``boltforge.core.serving.autoscale.Autoscale``).

Every problem raises ``SpecError`` naming the file, the line (CSV) or field (YAML), what was
given, and the fix; nothing else escapes.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Self

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from boltforge.core.serving.autoscale import Autoscale
from boltforge.spec.errors import _MISSING, SpecError, SpecProblem, from_validation
from boltforge.spec.loader import read_text, read_yaml

HEADER = ("time_s", "service", "requests_per_s")
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"

FloatArray = npt.NDArray[np.float64]


# --- request-rate trace ------------------------------------------------------------------


@dataclass(frozen=True)
class RequestTrace:
    """Offered request rates by service, one value per step from time 0.

    ``rates[name][k]`` is the mean rate (requests/s) over ``[k * step_s, (k + 1) * step_s)``;
    every service has ``steps`` values.
    """

    step_s: float
    rates: dict[str, FloatArray]

    @property
    def steps(self) -> int:
        return len(next(iter(self.rates.values()))) if self.rates else 0

    @property
    def horizon_s(self) -> float:
        """The end of the last step."""
        return self.steps * self.step_s

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(self.rates)

    def rate(self, service: str, step: int) -> float:
        """The rate of ``service`` in step ``step`` (0 past the end)."""
        values = self.rates[service]
        return float(values[step]) if 0 <= step < len(values) else 0.0

    def peak(self, service: str) -> float:
        """The highest rate ``service`` sees in the trace."""
        return float(self.rates[service].max(initial=0.0))


def _problem(source: str, line: int, column: str | None, value: object, text: str) -> SpecError:
    where = f"line {line}" + (f", column {column}" if column else "")
    return SpecError(source, [SpecProblem(where, value, text)])


def read_requests(path: str | Path) -> RequestTrace:
    """Read and validate the request-rate CSV in ``path`` (see the module docstring)."""
    return parse_requests(read_text(path), str(path))


def parse_requests(text: str, source: str = "requests") -> RequestTrace:
    """Validate request-rate CSV ``text`` (see the module docstring); ``source`` names it in
    errors. Raises ``SpecError`` naming the line and the fix."""
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if header is None or tuple(c.strip() for c in header) != HEADER:
        raise _problem(
            source,
            1,
            None,
            ",".join(header) if header else _MISSING,
            "must be the header `time_s,service,requests_per_s`. To fix: make it the first "
            "line, then one row per service per step",
        )
    groups = list(_groups(_rows(rows, source), source))
    if len(groups) < 2:
        raise _problem(
            source,
            groups[0][1] if groups else 2,
            None,
            _MISSING,
            "the trace needs at least two time steps (the step is the gap between them). To "
            "fix: add rows for the next time_s",
        )
    step = groups[1][0] - groups[0][0]
    names = list(groups[0][2])
    for (before, _, _), (at, line, rates) in itertools.pairwise(groups):
        if not math.isclose(at - before, step, rel_tol=1e-9, abs_tol=1e-9):
            raise _problem(
                source,
                line,
                "time_s",
                at,
                f"follows time_s {before:g}, but the step is {step:g} s (the gap between the "
                f"first two times). To fix: one row per service every {step:g} s, no gaps",
            )
        _same_services(source, line, at, names, rates)
    values = {n: np.array([g[2][n] for g in groups], dtype=np.float64) for n in names}
    return RequestTrace(step, values)


def _rows(rows: Iterator[list[str]], source: str) -> Iterator[tuple[int, float, str, float]]:
    """The data rows as (line, time_s, service, rate), checked one by one and in order."""
    last = -math.inf
    for line, row in enumerate(rows, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(HEADER):
            raise _problem(
                source,
                line,
                None,
                ",".join(row),
                f"has {len(row)} fields, not 3. To fix: write `time_s,service,requests_per_s`, "
                "e.g. `60,chat,12.5`",
            )
        at = _number(source, line, "time_s", row[0], "seconds from the trace's start, e.g. 60")
        name = row[1].strip()
        rate = _number(source, line, "requests_per_s", row[2], "a rate such as 12.5")
        _check_row(source, line, at, last, name, rate)
        last = at
        yield line, at, name, rate


def _number(source: str, line: int, column: str, text: str, example: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _problem(
            source, line, column, text, f"must be a number. To fix: write {example}"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise _problem(
            source, line, column, text, f"must be a finite number >= 0. To fix: write {example}"
        )
    return value


def _check_row(source: str, line: int, at: float, last: float, name: str, rate: float) -> None:
    """One row's own rules: the first time is 0, times never go back, the name is valid."""
    if last == -math.inf and at != 0:
        raise _problem(
            source,
            line,
            "time_s",
            at,
            "the first time_s must be 0: the trace shares the training trace's clock, which "
            "starts at 0. To fix: shift every time_s by the first one",
        )
    if at < last:
        raise _problem(
            source,
            line,
            "time_s",
            at,
            f"goes back from {last:g}. To fix: sort the rows by time_s",
        )
    if not re.match(NAME_PATTERN, name):
        raise _problem(
            source,
            line,
            "service",
            name,
            "must be lowercase letters, digits, '-' or '_', starting with a letter or digit. "
            "To fix: use the service's name from the services file, e.g. `chat`",
        )


def _groups(
    rows: Iterator[tuple[int, float, str, float]], source: str
) -> Iterator[tuple[float, int, dict[str, float]]]:
    """The rows grouped by time: (time_s, first line, rate by service); a service twice at
    one time is an error."""
    at, first, rates = -1.0, 0, dict[str, float]()
    for line, t, name, rate in rows:
        if t != at:
            if rates:
                yield at, first, rates
            at, first, rates = t, line, {}
        if name in rates:
            raise _problem(
                source,
                line,
                "service",
                name,
                f"has a second row at time_s {t:g}. To fix: keep one row per service per step",
            )
        rates[name] = rate
    if rates:
        yield at, first, rates


def _same_services(
    source: str, line: int, at: float, names: list[str], rates: dict[str, float]
) -> None:
    """Every time has a row for each service the first time has, and no other."""
    missing = [n for n in names if n not in rates]
    extra = [n for n in rates if n not in names]
    if missing or extra:
        what = (
            f"has no row for {', '.join(missing)}"
            if missing
            else f"adds {', '.join(extra)}, which has no row at time_s 0"
        )
        raise _problem(
            source,
            line,
            "service",
            _MISSING,
            f"time_s {at:g} {what}. To fix: give every service exactly one row at every time_s",
        )


# --- services ------------------------------------------------------------------------------


class _Exact(BaseModel):
    """A study input: unknown fields refused, immutable, and no coercion (a number given as
    a string is an error)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class StudyService(_Exact):
    """One inference service (see the module docstring)."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    gpus_per_replica: int = Field(ge=1, le=64)
    rps_per_replica: float = Field(gt=0)
    latency_slo_ms: float = Field(gt=0)
    base_latency_ms: float = Field(gt=0)
    min_replicas: int = Field(ge=0)
    max_replicas: int = Field(ge=1)
    cold_start_s: float = Field(ge=0)
    target_utilization: float = Field(0.7, gt=0, le=1)
    target_queue: float = Field(4.0, ge=0)
    scale_down_window_s: float = Field(300.0, ge=0)
    predictive: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas {self.min_replicas} is above max_replicas {self.max_replicas}. "
                "To fix: lower min_replicas or raise max_replicas"
            )
        if self.base_latency_ms >= self.latency_slo_ms:
            raise ValueError(
                f"base_latency_ms {self.base_latency_ms:g} is not below latency_slo_ms "
                f"{self.latency_slo_ms:g}: no load could meet the SLO. To fix: give the p99 a "
                "replica has at light load, below the SLO"
            )
        return self

    def rules(self) -> Autoscale:
        """The autoscaler's rules for this service."""
        return Autoscale(
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            target_queue=self.target_queue,
            rps_per_replica=self.rps_per_replica,
            target_utilization=self.target_utilization,
            latency_slo_ms=self.latency_slo_ms,
            scale_down_window_s=self.scale_down_window_s,
            cold_start_s=self.cold_start_s,
            predictive=self.predictive,
        )

    def static_replicas(self, peak_rps: float) -> int:
        """The fixed count that serves ``peak_rps`` at the target utilization, within the
        service's replica range."""
        need = math.ceil(peak_rps / (self.rps_per_replica * self.target_utilization))
        return min(max(need, self.min_replicas, 1), self.max_replicas)


class ServicesSpec(_Exact):
    """The services file: a non-empty list of services with distinct names."""

    services: list[StudyService]

    @model_validator(mode="after")
    def _unique(self) -> Self:
        if not self.services:
            raise ValueError(
                "lists no service. To fix: add one under `services:` (see "
                "examples/serving/services.yaml)"
            )
        names = [s.name for s in self.services]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"service names must be distinct; {', '.join(twice)} appears more than once. "
                "To fix: rename or merge the duplicates"
            )
        return self


def parse_services(data: object, source: str = "services") -> ServicesSpec:
    """Validate already-loaded YAML ``data`` as a services file, or raise ``SpecError``."""
    if not isinstance(data, dict):
        raise SpecError(
            source,
            [
                SpecProblem(
                    "services file",
                    type(data).__name__,
                    "must be a mapping with a `services:` list. To fix: see "
                    "examples/serving/services.yaml",
                )
            ],
        )
    try:
        return ServicesSpec.model_validate(data)
    except ValidationError as e:
        found = from_validation(source, _ROOT, e)
        problems = [replace(p, field=_field(p.field)) for p in found.problems]
        raise SpecError(source, problems) from None


_ROOT = "<root>"


def _field(path: str) -> str:
    """A field path without the root's placeholder: ``services[0].name``."""
    return path.removeprefix(_ROOT + ".") if path != _ROOT else "services file"


def load_services(path: str | Path) -> ServicesSpec:
    """Read and validate the services file in ``path``; raise ``SpecError`` on any problem."""
    return parse_services(read_yaml(path), str(path))


def check_match(requests: RequestTrace, services: ServicesSpec, source: str) -> None:
    """Raise ``SpecError`` (naming ``source``) unless the trace and the services file name the
    same services."""
    declared = [s.name for s in services.services]
    problems = [
        SpecProblem(
            f"service {n}",
            _MISSING,
            "has request rows but is not in the services file. To fix: add it there",
        )
        for n in requests.services
        if n not in declared
    ]
    problems += [
        SpecProblem(
            f"service {n}",
            _MISSING,
            "is in the services file but has no request rows. To fix: add its rows or "
            "remove it from the services file",
        )
        for n in declared
        if n not in requests.rates
    ]
    if problems:
        raise SpecError(source, problems)
