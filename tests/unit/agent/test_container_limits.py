"""The limits a container is given so that its engine can set them without privileges, and
the engine's own error carried into a failed start's words."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from boltforge.agent import ulimits
from boltforge.agent.containers import engine_error, exit_words

RUNC = (
    "runc: runc create failed: unable to start container process: error setting rlimit "
    "type 7: operation not permitted"
)


def limits(values: dict[int, tuple[int, int]]) -> object:
    return lambda which: values[which]


def test_open_files_are_the_agents_own_and_processes_at_most_the_pids_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own = {resource.RLIMIT_NOFILE: (1024, 20000), resource.RLIMIT_NPROC: (96365, 96365)}
    monkeypatch.setattr(resource, "getrlimit", limits(own))
    assert ulimits.ulimit_args(4096) == [
        "--ulimit",
        "nofile=1024:20000",
        "--ulimit",
        "nproc=4096:4096",
    ]


def test_unlimited_stays_unlimited_where_no_cap_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    inf = resource.RLIM_INFINITY
    own = {resource.RLIMIT_NOFILE: (inf, inf), resource.RLIMIT_NPROC: (100, inf)}
    monkeypatch.setattr(resource, "getrlimit", limits(own))
    assert ulimits.ulimit_args(4096) == ["--ulimit", "nofile=-1:-1", "--ulimit", "nproc=100:4096"]


def test_the_engines_last_error_line_is_found_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "r.log"
    log.write_text(f"starting\nError: an older one\nsome output\nError: {RUNC}\n")
    assert engine_error(log) == RUNC
    log.write_text("a log without the engine's words\n")
    assert engine_error(log) == ""
    assert engine_error(tmp_path / "missing.log") == ""


def test_only_the_logs_tail_is_read(tmp_path: Path) -> None:
    log = tmp_path / "r.log"
    log.write_text("Error: long ago\n" + "x" * 100 + "\n")
    assert engine_error(log, tail=50) == ""


def test_an_engine_failure_carries_the_engines_words() -> None:
    words = exit_words(126, False, 0, oom=False, said=RUNC)
    assert words == f"the command in the image could not be invoked (exit 126): {RUNC}"
    assert exit_words(126, False, 0, oom=False).endswith("(exit 126; its log says why)")
