"""Reading what replicas append to their log and progress files, from where the agent left off."""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any


class FileTail:
    """The bytes appended to a file since the last read. A missing file reads as empty."""

    def __init__(self, path: Path, offset: int | None = None) -> None:
        self.path = path
        self.offset = offset if offset is not None else _size(path)

    def read(self, limit: int) -> bytes:
        """Up to ``limit`` new bytes (fewer when less was written)."""
        if limit <= 0:
            return b""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read(limit)
        except FileNotFoundError:
            return b""
        self.offset += len(data)
        return data


class LogTail:
    """A replica's output as text, never splitting a UTF-8 character between two reads."""

    def __init__(self, path: Path) -> None:
        self._file = FileTail(path)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read(self, limit: int) -> str:
        """Up to about ``limit`` bytes of new output, decoded."""
        return self._decoder.decode(self._file.read(limit))


class ProgressTail:
    """Complete JSON lines appended to a progress file; a partial last line waits for its end,
    and a line that is not a JSON object is skipped."""

    def __init__(self, path: Path) -> None:
        self._file = FileTail(path)
        self._partial = b""

    def read(self, limit: int) -> list[dict[str, Any]]:
        """The objects of the complete lines among the next ``limit`` bytes."""
        data = self._partial + self._file.read(limit)
        *lines, self._partial = data.split(b"\n")
        return [obj for obj in map(_parse, lines) if obj is not None]


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
