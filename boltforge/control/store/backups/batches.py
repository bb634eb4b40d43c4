"""Rows a backup or restore reads, writes and inserts a batch at a time, and the progress it
tells as each batch is done."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

BATCH = 1000  # rows read, written and inserted at a time

Progress = Callable[[str, int, int], None]
"""Told ``(table, rows_done, rows_total)`` as a backup or restore goes through a table."""


def tell(progress: Progress | None, table: str, done: int, total: int) -> None:
    if progress is not None:
        progress(table, done, total)


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk
