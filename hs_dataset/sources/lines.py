"""Read a JSONL file's lines with a byte cap, so one huge line never has to fit in memory.

A source file is untrusted: a single 50 MB line (a pasted log, a base64 blob, a file
that is not JSONL at all) must cost bounded memory. Each line is read with
``readline(cap + 1)``; a line longer than the cap is skipped in bounded chunks and
handed on as ``None`` with its size, for the caller to count. Decoding is the caller's
business too (bytes in, so invalid UTF-8 is one bad row, not a fatal error).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

__all__ = ["SKIP_CHUNK_BYTES", "Line", "read_lines"]

SKIP_CHUNK_BYTES = 1 << 20  # what an over-long line's remainder is read (and dropped) in


@dataclass(frozen=True)
class Line:
    """One physical line: its 1-based number, its bytes (``None`` when over the cap) and its size."""

    number: int
    data: bytes | None
    size: int


def _skip_rest(handle: BinaryIO, head: bytes) -> int:
    """Consume the rest of an over-long line; return its total size in bytes."""
    size, chunk = len(head), head
    while not chunk.endswith(b"\n"):
        chunk = handle.readline(SKIP_CHUNK_BYTES)
        if not chunk:
            break
        size += len(chunk)
    return size


def read_lines(handle: BinaryIO, max_bytes: int) -> Iterator[Line]:
    """Every line of ``handle`` (newline included), none holding more than ``max_bytes`` bytes in memory."""
    number = 0
    while True:
        data = handle.readline(max_bytes + 1)
        if not data:
            return
        number += 1
        body = len(data) - int(data.endswith(b"\n"))
        if body > max_bytes:
            yield Line(number, None, _skip_rest(handle, data))
        else:
            yield Line(number, data, len(data))
