"""The regenerated conversations, stored beside the shards as they finish (JSONL, one fsynced chunk per line).

Regeneration is the slow, non-reproducible-in-general step (sampling, batch-dependent
numerics), so what the model wrote is kept: a killed build resumes from this file and
never writes a finished turn differently. Each line is one *chunk*: the records of one
fixed window of conversations, appended with a single ``write`` and fsynced. A kill
can only tear the last line; it is cut off on open, and its window is regenerated
whole, with the same batch as before. The file's sha256 goes into the manifest at the
end of a build and ``hs-dataset push`` publishes it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hs_dataset.errors import FormatError
from hs_dataset.formats.atomic import write_all
from hs_dataset.formats.hashing import sha256_file
from hs_dataset.formats.paths import resolve_member

__all__ = ["REGENERATED_NAME", "RegeneratedStore"]

REGENERATED_NAME = "regenerated.jsonl"


class RegeneratedStore:
    """Records by sample id, read from ``root/name`` (torn tail removed) and appended to it."""

    def __init__(self, root: str | os.PathLike, name: str = REGENERATED_NAME) -> None:
        self.name = name
        self.path = resolve_member(root, name, what="regenerated conversations file")
        self.records: dict[str, dict[str, Any]] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good = data.rfind(b"\n") + 1  # a kill mid-append leaves at most one partial last line
        for number, line in enumerate(data[:good].splitlines(), 1):
            try:
                chunk = json.loads(line)
            except json.JSONDecodeError as exc:
                raise FormatError(
                    f"{self.path}: line {number} is not JSON ({exc.msg}); the file is damaged: delete it to regenerate every conversation"
                ) from None
            for record in chunk["records"]:
                self.records[record["sample_id"]] = record
        if good != len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())

    def get(self, sample_id: str) -> dict[str, Any] | None:
        return self.records.get(sample_id)

    def append_chunk(self, records: list[dict[str, Any]]) -> None:
        """Append one window's records as one line, durably, before anything downstream uses them."""
        line = json.dumps({"records": records}, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            write_all(fd, memoryview(line))
            os.fsync(fd)
        finally:
            os.close(fd)
        for record in records:
            self.records[record["sample_id"]] = record

    def sha256(self) -> str | None:
        return sha256_file(self.path) if self.path.exists() else None
