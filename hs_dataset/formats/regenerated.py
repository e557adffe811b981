"""The regenerated conversations, stored beside the shards as they finish (JSONL, one fsynced chunk per line).

Regeneration is the slow, non-reproducible-in-general step (sampling, batch-dependent
numerics), so what the model wrote is kept: a killed build resumes from this file and
never writes a finished turn differently. Each line is one *chunk*: the records of
conversations finished together (a window of the in-process model, or what finished on
the servers since the last line), appended and fsynced before any of them is captured.
A kill can only tear the last line; it is cut off on open, and its conversations are
regenerated. The store keeps only where each record lies (sample id -> line), not the
records, so its memory follows the number of conversations, not their tokens; a record
is read back from its line when a resumed build reaches it. The file's sha256 goes into
the manifest at the end of a build and ``hs-dataset push`` publishes it. What one record
holds, and the check each passes on reading, is ``formats/regenerated_record.py``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hs_dataset import strict_json
from hs_dataset.errors import IntegrityError
from hs_dataset.faults import crash_point
from hs_dataset.formats.atomic import write_all
from hs_dataset.formats.hashing import sha256_file, sha256_fileobj
from hs_dataset.formats.paths import open_regular, resolve_member
from hs_dataset.formats.regenerated_record import check_record, damaged

__all__ = ["REGENERATED_NAME", "RegeneratedStore", "read_regenerated"]

REGENERATED_NAME = "regenerated.jsonl"
MAX_CHUNK_BYTES = 256 * 1024 * 1024  # one line (conversations stored together); a larger one is damage, not data


def _chunk_records(line: bytes, where: str, number: int, vocab_size: int | None = None) -> list[dict[str, Any]]:
    """One line's records, checked (ids against ``vocab_size`` when known); FormatError names the line and the field."""
    try:
        chunk = strict_json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise damaged(where, f"line {number}", f"is not JSON ({getattr(exc, 'msg', exc)})") from None
    except RecursionError:
        raise damaged(where, f"line {number}", "is JSON nested too deeply to read") from None
    if not isinstance(chunk, dict) or not isinstance(chunk.get("records"), list):
        raise damaged(where, f"line {number}", 'must be an object {"records": [...]}')
    for index, record in enumerate(chunk["records"]):
        check_record(record, where, f"line {number} records[{index}]", vocab_size)
    return chunk["records"]


def _stored_twice(where: str, number: int, sample_id: str) -> Exception:
    """A sample id on two lines: a build appends a conversation once, so the file was edited (or two were joined).

    Refused on resume as on reading a finished file: taking either record silently would
    store one of two conversations under the id without a word.
    """
    return damaged(where, f"line {number}", f"stores sample {sample_id!r} a second time")


def read_regenerated(path: str | os.PathLike, *, what: str, sha256: str | None, vocab_size: int | None = None) -> dict[str, dict[str, Any]]:
    """The finished file's records by sample id, once its sha256 is the one ``what`` records (a finished build leaves no torn line).

    ``vocab_size``: the vocabulary the manifest records (``formats/vocabulary.vocab_size_of``): a re-hashed file
    with an id just above the model's vocabulary is self-consistent, so its ids are checked against the model's
    bound, not only the largest any model may have (None: that bound).

    Raises FileNotFoundError when missing, UnsafePathError when not a regular file,
    IntegrityError on another sha256, FormatError on a damaged line or a sample id stored twice.
    """
    records: dict[str, dict[str, Any]] = {}
    with open_regular(path, what=what) as f:
        digest = sha256_fileobj(f)
        if digest != sha256:
            raise IntegrityError(
                f"{path}: sha256 is {digest} but {what}.sha256 is {sha256!r}; the file changed after the build: restore it"
            )
        f.seek(0)
        for number, line in enumerate(iter(lambda: f.readline(MAX_CHUNK_BYTES + 1), b""), 1):
            if not line.endswith(b"\n"):
                raise damaged(str(path), f"line {number}", f"is cut off (no newline) or longer than {MAX_CHUNK_BYTES} bytes")
            for record in _chunk_records(line, str(path), number, vocab_size):
                if record["sample_id"] in records:
                    raise _stored_twice(str(path), number, record["sample_id"])
                records[record["sample_id"]] = record
    return records


class RegeneratedStore:
    """Where each stored record lies in ``root/name`` (torn tail removed on open); records are appended to it and read back by id.

    ``vocab_size``: the model's vocabulary size, which a resuming build knows: a stored record is resumed from and
    captured as it is, so its ids are checked against the model's vocabulary, not only against the largest one any
    model may have (None: that bound only, for tools that open the file without the model).
    """

    def __init__(self, root: str | os.PathLike, name: str = REGENERATED_NAME, *, vocab_size: int | None = None) -> None:
        self.name = name
        self.vocab_size = vocab_size
        self.path = resolve_member(root, name, what="regenerated conversations file")
        self._lines: dict[str, int] = {}  # sample id -> byte offset of the line holding its record
        self._cached: tuple[int, dict[str, dict[str, Any]]] | None = None  # the last line read back, by offset
        self._end = 0
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            offset = 0
            for number, line in enumerate(iter(lambda: f.readline(MAX_CHUNK_BYTES + 1), b""), start=1):
                if not line.endswith(b"\n"):
                    if f.read(1):
                        raise damaged(str(self.path), f"line {number}", f"is longer than {MAX_CHUNK_BYTES} bytes")
                    break  # a kill mid-append leaves at most one partial last line
                for record in _chunk_records(line, str(self.path), number, self.vocab_size):
                    if record["sample_id"] in self._lines:  # never appended twice: an edit, resumed from would be one of two
                        raise _stored_twice(str(self.path), number, record["sample_id"])
                    self._lines[record["sample_id"]] = offset
                offset += len(line)
        self._end = offset
        if self._end != self.path.stat().st_size:
            with open(self.path, "r+b") as f:
                f.truncate(self._end)
                os.fsync(f.fileno())

    def __contains__(self, sample_id: str) -> bool:
        return sample_id in self._lines

    def __len__(self) -> int:
        return len(self._lines)

    def get(self, sample_id: str) -> dict[str, Any] | None:
        """The stored record of ``sample_id`` (read back from its line), or None."""
        offset = self._lines.get(sample_id)
        if offset is None:
            return None
        if self._cached is None or self._cached[0] != offset:
            with open_regular(self.path, what="regenerated conversations file") as f:
                f.seek(offset)
                records = _chunk_records(f.readline(MAX_CHUNK_BYTES + 1), str(self.path), 0, self.vocab_size)
            self._cached = (offset, {r["sample_id"]: r for r in records})
        return self._cached[1].get(sample_id)

    @property
    def records(self) -> dict[str, dict[str, Any]]:
        """Every stored record by sample id, read from the file (for tools and tests: the whole file in memory)."""
        return {sample_id: self.get(sample_id) for sample_id in self._lines}

    def append_chunk(self, records: list[dict[str, Any]]) -> None:
        """Append records finished together as one line, durably, before anything downstream uses them."""
        line = json.dumps({"records": records}, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            half = len(line) // 2
            write_all(fd, memoryview(line)[:half])
            crash_point("regenerate.mid_chunk")
            write_all(fd, memoryview(line)[half:])
            os.fsync(fd)
        finally:
            os.close(fd)
        for record in records:
            self._lines[record["sample_id"]] = self._end
        self._end += len(line)

    def sha256(self) -> str | None:
        return sha256_file(self.path) if self.path.exists() else None
