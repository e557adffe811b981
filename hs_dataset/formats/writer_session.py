"""What one writer session knows: the samples stored and pending, the quarantine, the manifest's edits, the report.

Shared by the thread that adds samples, the writer threads and the publisher (one
lock). The manifest is rewritten atomically; each state of it is numbered while the
lock is held and written after, so an older state never overwrites a newer one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hs_dataset.errors import DuplicateSampleError
from hs_dataset.formats.atomic import atomic_write_bytes
from hs_dataset.formats.build_state import BuildState
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, ShardRecord
from hs_dataset.formats.metadata import DatasetMetadata

__all__ = ["WriterReport", "WriterSession"]


@dataclass
class WriterReport:
    """What one writer session did (the run report adds these up)."""

    written: int = 0
    tokens: int = 0
    skipped_existing: int = 0
    quarantined: list[dict[str, str]] = field(default_factory=list)
    shards_written: int = 0
    bytes_written: int = 0
    adopted_shards: list[str] = field(default_factory=list)
    rejected_shards: list[str] = field(default_factory=list)  # unlisted shards of another dataset, renamed *.rejected
    removed_temp_files: int = 0


class WriterSession:
    """The sample ids a dataset holds (stored, quarantined) or is about to (pending), and its manifest."""

    def __init__(self, root: Path, manifest: Manifest, stored_ids: Iterable[str], report: WriterReport) -> None:
        self.root = root
        self.manifest = manifest
        self.report = report
        self._lock = threading.Lock()
        self._manifest_lock = threading.Lock()  # orders manifest writes; held only by writer threads and rare edits
        self._manifest_edits = self._manifest_saved = 0
        self._stored_ids: set[str] = set(stored_ids)
        self._pending_ids: set[str] = set()

    # ------------------------------------------------------------------ ids
    def contains(self, sample_id: str) -> bool:
        """True if the sample is stored, quarantined, or pending in this session."""
        with self._lock:
            return sample_id in self._stored_ids or sample_id in self._pending_ids

    @property
    def stored_ids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._stored_ids)

    def is_new(self, sample_id: str) -> bool:
        """False (counted as skipped) if a previous run stored it; :class:`DuplicateSampleError` if this run has it."""
        with self._lock:
            if sample_id in self._pending_ids:
                raise DuplicateSampleError(f"sample {sample_id!r} was given twice in this run; sample ids must be unique")
            if sample_id in self._stored_ids:
                self.report.skipped_existing += 1
                return False
        return True

    def add_pending(self, sample_id: str) -> None:
        with self._lock:
            self._pending_ids.add(sample_id)

    def forget(self, sample_ids: Iterable[str]) -> None:
        """The samples of a shard that failed are no longer pending (the caller hears of the failure)."""
        with self._lock:
            self._pending_ids.difference_update(sample_ids)

    def quarantine(self, sample_id: str, reason: str) -> None:
        """Record a sample that is not stored, and why, in the manifest (it is never taken again)."""
        with self._lock:
            self._pending_ids.add(sample_id)
            entry = {"sample_id": sample_id, "reason": reason}
            self.manifest.quarantine.append(entry)
            self.report.quarantined.append(entry)
            edit = self._numbered_state_locked()
        self.save_manifest(*edit)

    # ------------------------------------------------------------------ shards
    def list_shards(self, records: list[ShardRecord]) -> None:
        """Add shards (their renames already durable) to the manifest and write it."""
        with self._lock:
            self.manifest.shards.extend(records)
            self.manifest.shards.sort(key=lambda s: s.file)
            edit = self._numbered_state_locked()
        self.save_manifest(*edit)

    def mark_stored(self, listed: list[tuple[ShardRecord, list[str]]]) -> None:
        """The samples of listed shards are stored: count them."""
        ids = [sid for _record, batch_ids in listed for sid in batch_ids]
        with self._lock:
            self._stored_ids.update(ids)
            self._pending_ids.difference_update(ids)
            self.report.written += len(ids)
            for record, _ in listed:
                self.report.tokens += record.tokens
                self.report.shards_written += 1
                self.report.bytes_written += record.bytes

    # ------------------------------------------------------------------ manifest
    def edit_metadata(self, edit: Callable[[DatasetMetadata], DatasetMetadata]) -> None:
        """Replace the manifest's metadata with ``edit(metadata)`` and write the manifest (the identity is kept)."""
        with self._lock:
            self.manifest.metadata = edit(self.manifest.metadata)
            state = self._numbered_state_locked()
        self.save_manifest(*state)

    def record_build(self, build: BuildState) -> None:
        """Set the manifest's ``build`` record (running or finished) and write the manifest."""
        with self._lock:
            self.manifest.build = build
            state = self._numbered_state_locked()
        self.save_manifest(*state)

    def numbered_state(self) -> tuple[int, bytes]:
        """Number the manifest's current state and encode it."""
        with self._lock:
            return self._numbered_state_locked()

    def _numbered_state_locked(self) -> tuple[int, bytes]:
        self._manifest_edits += 1
        return self._manifest_edits, self.manifest.encode()

    def save_manifest(self, edit: int, data: bytes) -> None:
        """Write a manifest state unless a later one is already on disk.

        Outside the ids lock: the fsyncs (file and directory) can wait on a journal commit
        that flushes the other shards in flight, and ``add`` must not wait behind them.
        """
        with self._manifest_lock:
            if edit <= self._manifest_saved:
                return
            atomic_write_bytes(self.root / MANIFEST_NAME, data)
            self._manifest_saved = edit
