"""The stream's bounded cache: a normal dataset directory that never holds more than a bound on disk.

Every file counts toward the bound, including the room a manifest rewrite needs (its
temporary copy beside the old one). To make room for a shard, the oldest complete
shards are evicted (``formats/evict.py``: out of the manifest atomically, then deleted);
the stream says which shards may go (those whose samples its epoch already yielded).
Shards are written by a ``ShardWriter`` session each, so the directory stays one that
``open_dataset`` and ``hs-dataset verify`` read. One stream per directory: it holds the
directory's ``.lock`` (``formats/dirlock.py``) and hands it to the writer while a shard
is written. A cached shard is served only after its bytes matched the recorded hash in
this process (again whenever the file changed); one that does not is evicted and its
samples are captured again, never counted as hits. The manifest's metadata carries
``stream_cache: true``: a dataset without it (one ``hs-dataset build`` wrote, even of
the same card) is refused as a cache directory, so its shards are never evicted.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from hs_dataset.codecs.registry import get_encoding, state_encoding_for
from hs_dataset.config.sections import MAX_SHARD_BYTES
from hs_dataset.errors import ForeignDatasetError, FormatError, HsDatasetError, IntegrityError, UnsafePathError, UsageError
from hs_dataset.formats.dirlock import acquire_dir_lock, release_dir_lock
from hs_dataset.formats.encoding import decode_state, encode_state
from hs_dataset.formats.evict import evict_shards
from hs_dataset.formats.identity import describe_differences, identity_differences, identity_fields
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, ShardRecord, is_dataset_dir
from hs_dataset.formats.metadata import DatasetMetadata
from hs_dataset.formats.paths import resolve_member
from hs_dataset.formats.reader import ShardReader
from hs_dataset.formats.shard_layout import SHARD_NAME_RE
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.sample import CapturedSample

__all__ = ["MANIFEST_ENTRY_BYTES", "STREAM_CACHE_KEY", "StreamCache", "disk_bytes"]

_HEADER_BYTES = 2048  # a shard header's fixed part (tensor table, metadata, padding); sample ids are added per sample
MANIFEST_ENTRY_BYTES = 512  # one more shards[] entry in manifest.json
STREAM_CACHE_KEY = "stream_cache"  # metadata key marking a stream's cache directory (true)

Where = tuple[str, int]  # a cached sample's shard file and index in it
Signature = tuple[int, int, int, int]  # inode, size, mtime_ns, ctime_ns: a file changed since it was checked has another

logger = logging.getLogger("hs_dataset.streaming.cache")


@dataclass(frozen=True)
class _Known:
    """A cached shard whose bytes were checked against ``hash`` while the file had ``signature``."""

    hash: str
    signature: Signature
    reader: ShardReader


class StreamCache:
    """The cache directory ``root``, kept within ``max_bytes``, holding the data ``metadata`` describes."""

    def __init__(
        self,
        root: Path,
        max_bytes: int,
        metadata: DatasetMetadata | Mapping[str, Any],
        *,
        final_norm_weight: torch.Tensor,
        storage: str,
        dtype: torch.dtype,
        card_name: str,
    ) -> None:
        # marked as a cache: a dataset built by hs-dataset build of the same card is never taken for one (and evicted)
        self.root, self.max_bytes, self.metadata = root, max_bytes, replace(DatasetMetadata.coerce(metadata), stream_cache=True)
        self.final_norm_weight, self.storage, self.card_name = final_norm_weight, storage, card_name
        self.encoding = get_encoding(state_encoding_for(dtype, storage))
        self._lock_fd: int | None = None
        self._shards: dict[str, _Known] = {}  # file -> the checked reader of it
        self.damaged: list[dict[str, str]] = []  # shards evicted because their bytes failed the check

    # ------------------------------------------------------------------ open / resume
    def open(self) -> list[ShardRecord]:
        """Refuse another dataset's directory, create or resume the cache, and bring it within the bound.

        Returns the shards evicted to do so (a lowered bound, or shards a crash left behind).
        """
        if is_dataset_dir(self.root):
            manifest = Manifest.load(self.root)
            differences = identity_differences(identity_fields(manifest.metadata), identity_fields(self.metadata))
            if differences:
                raise ForeignDatasetError(
                    f"{self.root}: holds the states of another dataset than {self.card_name!r}; these fields differ:\n"
                    f"{describe_differences(differences, wanted='stream')}\npass another cache_dir, or delete this one to reuse the name"
                )
            if manifest.metadata.stream_cache is not True:
                raise ForeignDatasetError(
                    f"{self.root}: holds a dataset that is not a stream cache (metadata.{STREAM_CACHE_KEY} unset: hs-dataset build's "
                    "output, or a cache of an older hs_dataset); the stream would evict its shards: pass another cache_dir"
                )
            self.lock()
            try:
                self.index()  # damaged shards out before the writer resumes (it reads every listed header)
            finally:
                self.unlock()
        self.write([])  # creates the manifest and norm weight, or resumes (temp files removed, orphans adopted)
        self.lock()
        try:
            removed = self.make_room(0, consumed=None)
        finally:
            self.unlock()
        if removed is None:
            fixed = disk_bytes(self.root) - Manifest.load(self.root).num_bytes
            raise UsageError(
                f"max_cache_bytes={self.max_bytes} is smaller than the cache's own files in {self.root} "
                f"({fixed} bytes: manifest and norm weight, plus {self.reserve()} kept free for the manifest's rewrite); "
                "raise max_cache_bytes to hold at least a few samples' states"
            )
        return removed

    def lock(self) -> None:
        self._lock_fd = acquire_dir_lock(self.root)

    def unlock(self) -> None:
        if self._lock_fd is not None:
            release_dir_lock(self._lock_fd)
            self._lock_fd = None

    def reserve(self) -> int:
        """Room kept free so a manifest rewrite (temp copy beside the old one) stays within the bound."""
        try:
            size = (self.root / MANIFEST_NAME).stat().st_size
        except OSError:
            size = 0
        return size + 4096

    # ------------------------------------------------------------------ contents
    def write(self, samples: list[CapturedSample]) -> None:
        """One ``ShardWriter`` session: ``samples`` become one shard (NaN/inf ones go to the manifest's quarantine)."""
        held = self._lock_fd is not None
        self.unlock()  # the writer takes the directory lock itself
        try:
            with ShardWriter(
                self.root,
                self.metadata,
                final_norm_weight=self.final_norm_weight,
                storage=self.storage,
                shard_bytes=MAX_SHARD_BYTES,
                writer_threads=1,
            ) as writer:
                for sample in samples:
                    writer.add(sample)
        finally:
            if held:
                self.lock()

    def index(self) -> tuple[Manifest, dict[str, Where]]:
        """The cache's manifest and where each cached sample lies (shard file, index in it).

        A shard is served only once its bytes were checked against the recorded hash
        (``hashing.py``, through the reader), here on first use and again whenever the
        file's inode, size, mtime or ctime moved. A shard that fails the check (edited,
        truncated, replaced, missing) is evicted and its samples are captured again; the
        caller holds the directory lock. A shard name that leads out of the directory
        (a symlink) is refused, naming it.
        """
        manifest = Manifest.load(self.root)
        index: dict[str, Where] = {}
        live: dict[str, _Known] = {}
        damaged: list[dict[str, str]] = []
        for record in manifest.shards:
            path = resolve_member(self.root, record.file, what="shards[].file")
            known = self._shards.get(record.file)
            try:
                signature = _signature(path)
                # a name comes back with other bytes when the newest shard was evicted: compare the recorded hash
                # (format-2 records hold BLAKE3 only, so sha256 would be None on both sides)
                if known is None or known.hash != record.content_hash or known.signature != signature:
                    known = _Known(record.content_hash, signature, ShardReader(path, manifest=manifest, record=record, verify_hash=True))
            except (IntegrityError, FormatError, FileNotFoundError) as exc:
                if isinstance(exc, UnsafePathError):
                    raise
                damaged.append({"file": record.file, "reason": str(exc) if isinstance(exc, HsDatasetError) else f"{path}: missing"})
                continue
            live[record.file] = known
            for i, sid in enumerate(known.reader.sample_ids):
                index[sid] = (record.file, i)
        self._shards = live
        if damaged:
            manifest = self._evict_damaged(damaged)
        return manifest, index

    def _evict_damaged(self, damaged: list[dict[str, str]]) -> Manifest:
        for entry in damaged:
            logger.warning("stream cache: %s; evicted, its samples are captured again", entry["reason"])
        evict_shards(self.root, [entry["file"] for entry in damaged])
        self.damaged.extend(damaged)
        return Manifest.load(self.root)

    def take_damaged(self) -> list[dict[str, str]]:
        """The shards evicted as damaged since the last call (file, reason)."""
        damaged, self.damaged = self.damaged, []
        return damaged

    def read(self, where: Where) -> dict[str, Any]:
        """The cached sample at ``where`` (from :meth:`index`)."""
        file, i = where
        return self._shards[file].reader.sample(i)

    def cached_samples(self) -> int:
        return sum(r.samples for r in Manifest.load(self.root).shards)

    # ------------------------------------------------------------------ the bound
    def make_room(self, need: int, *, consumed: set[str] | None) -> list[ShardRecord] | None:
        """Evict the oldest shards until ``need`` more bytes fit; only fully ``consumed`` shards (all when None).

        Returns the evicted shards, or None when that is not possible (nothing is evicted then).
        """
        manifest = Manifest.load(self.root)
        order = sorted(manifest.shards, key=lambda r: _seq(r.file))
        victims: list[str] = []
        free = self.max_bytes - disk_bytes(self.root) - self.reserve()
        for record in order:
            if free >= need:
                break
            if consumed is not None and not all(sid in consumed for sid in self._shard_ids(record.file)):
                continue
            victims.append(record.file)
            free += record.bytes
        if free < need:
            return None
        if not victims:
            return []
        removed = evict_shards(self.root, victims)
        for record in removed:
            self._shards.pop(record.file, None)
        return removed

    def room_for(self, sample: CapturedSample) -> int:
        """The bytes ``sample`` takes in a shard; UsageError when the bound cannot hold even that one sample."""
        need = self.shard_estimate([sample])
        fixed = disk_bytes(self.root) - Manifest.load(self.root).num_bytes
        if need + MANIFEST_ENTRY_BYTES + fixed + self.reserve() > self.max_bytes:
            raise UsageError(
                f"max_cache_bytes={self.max_bytes} cannot hold one sample: {sample.sample_id!r} "
                f"({sample.num_tokens} tokens) takes {need} bytes in a shard, and the cache's own files {fixed + self.reserve()}; "
                f"raise max_cache_bytes to at least {need + MANIFEST_ENTRY_BYTES + fixed + self.reserve()}"
            )
        return need

    def shard_estimate(self, samples: Iterable[CapturedSample]) -> int:
        """An upper bound of the bytes these samples take in one shard (data, offsets, header with their ids)."""
        total = _HEADER_BYTES + 8
        for s in samples:
            t, k, h = s.aux_hidden_states.shape
            total += t * (8 + 1) + t * (k + 1) * self.encoding.row_bytes(h) + 8 + len(json.dumps(s.sample_id)) + 2
        return total

    def as_stored(self, sample: CapturedSample) -> dict[str, Any]:
        """The sample as a later epoch reads it from the cache (scaled storage: encoded and decoded once)."""
        aux, final = sample.aux_hidden_states, sample.final_hidden_state
        if self.encoding.scaled:
            aux = decode_state(*encode_state(aux, self.encoding), self.encoding)
            final = decode_state(*encode_state(final, self.encoding), self.encoding)
        return {
            "sample_id": sample.sample_id,
            "input_ids": sample.input_ids,
            "loss_mask": sample.loss_mask,
            "aux_hidden_states": aux,
            "final_hidden_state": final,
        }

    def _shard_ids(self, file: str) -> list[str]:
        if file not in self._shards:
            self.index()
        known = self._shards.get(file)
        return list(known.reader.sample_ids) if known is not None else []


def disk_bytes(root: Path) -> int:
    """Bytes of every regular file under ``root`` (what the cache bound counts)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


def _signature(path: Path) -> Signature:
    st = os.lstat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _seq(file: str) -> int:
    match = SHARD_NAME_RE.match(Path(file).name)
    return int(match.group("seq")) if match else -1
