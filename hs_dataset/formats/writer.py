"""The shard writer: many samples per safetensors shard, published atomically, resumable.

Guarantees (docs/FORMAT.md, "Writing"):

* a shard becomes visible only complete: temp file, fsync, rename; the directory is
  fsynced before a manifest lists it;
* its BLAKE3 hash is computed while the bytes are written (a second thread hashes
  the same buffers, straight from the caller's tensors), never by re-reading;
* the manifest is rewritten atomically by one publisher thread, listing every shard
  written since its last write, so a crash loses at most the shards still being
  written (a shard renamed but not yet listed is adopted on resume);
* reopening a directory resumes it: temp files are removed, complete shards that a
  crash left out of the manifest are re-hashed and adopted, and sample ids already
  stored are skipped, so no sample is ever stored twice;
* shards are flushed by background threads (``writer_threads``) while capture goes
  on; at most that many shards are in flight, which bounds memory (back-pressure).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from hs_dataset.codecs.registry import Encoding, get_encoding, state_encoding_for
from hs_dataset.config.sections import MAX_SHARD_BYTES
from hs_dataset.dtypes import state_dtype
from hs_dataset.errors import NonFiniteStateError, SampleError, UsageError
from hs_dataset.formats.atomic import remove_quietly
from hs_dataset.formats.build_state import BuildState
from hs_dataset.formats.dirlock import LOCK_NAME, acquire_dir_lock
from hs_dataset.formats.manifest import Manifest, is_dataset_dir
from hs_dataset.formats.metadata import DatasetMetadata, RegeneratedFile, RegenerationRecord
from hs_dataset.formats.paths import check_local_path, make_directory
from hs_dataset.formats.sample_encoder import SampleEncoder
from hs_dataset.formats.shard_file import EncodedSample
from hs_dataset.formats.shard_flusher import ShardFlusher
from hs_dataset.formats.shard_layout import DEFAULT_SHARD_BYTES
from hs_dataset.formats.writer_resume import WriteTarget, open_or_resume
from hs_dataset.formats.writer_session import WriterReport, WriterSession
from hs_dataset.host_buffers import HostBufferPool, lease_pool
from hs_dataset.sample import CapturedSample, sample_id_problem

__all__ = ["ShardWriter"]


class ShardWriter:
    """Write captured samples into a dataset directory.

    ``metadata`` is the dataset-level metadata recorded in the manifest
    (:class:`~hs_dataset.formats.metadata.DatasetMetadata`, or its JSON form: model,
    ``aux_layer_ids`` as HF ``hidden_states`` indexes, ``final_state``, ``dtype``,
    ``hidden_size``, config and tokenizer; see docs/FORMAT.md). It must set at least
    ``aux_layer_ids``, ``hidden_size`` and ``dtype``. The writer is the manifest's only
    owner: what is recorded once the data is written (the regenerated files) goes
    through :meth:`record_regenerated_file`. ``build``: the running record of the build
    that writes it (:mod:`~hs_dataset.formats.build_state`), written with the first
    manifest (or over a resumed one's); :meth:`finish_build` marks it finished.

    Use as a context manager; :meth:`close` flushes the last shard. The parts:
    :mod:`~hs_dataset.formats.writer_resume` opens or resumes the directory,
    :class:`~hs_dataset.formats.sample_encoder.SampleEncoder` checks and encodes each
    sample, :class:`~hs_dataset.formats.writer_session.WriterSession` keeps the ids and
    the manifest, :class:`~hs_dataset.formats.shard_flusher.ShardFlusher` writes the
    shards (:mod:`~hs_dataset.formats.shard_file`) in the background.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        metadata: DatasetMetadata | Mapping[str, Any],
        *,
        final_norm_weight: torch.Tensor | None = None,
        storage: str = "native",
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        nonfinite: str = "quarantine",
        writer_threads: int = 2,
        shard_prefix: str = "",
        created_by: str | None = None,
        build: BuildState | None = None,
    ) -> None:
        metadata = DatasetMetadata.coerce(metadata, "ShardWriter metadata")
        _check_options(metadata, shard_bytes, nonfinite, writer_threads, shard_prefix)
        self.root = check_local_path(root, what="output directory")
        self.metadata = metadata
        hidden_size = int(metadata.hidden_size or 0)
        dtype = state_dtype(str(metadata.dtype))
        encoding = get_encoding(state_encoding_for(dtype, storage))
        if problem := encoding.hidden_size_problem(hidden_size):
            raise UsageError(f"{root}: {problem}")
        self._encoder = SampleEncoder(dtype, len(metadata.aux_layer_ids or ()), hidden_size, encoding)
        self.shard_bytes = shard_bytes
        self.nonfinite = nonfinite
        self.shard_prefix = shard_prefix
        self.report = WriterReport()

        self._lock = threading.Lock()  # the buffer and the shard numbers
        self._buffer: list[EncodedSample] = []
        self._buffer_bytes = 0
        self._closed = False
        # Leased samples wait here until their shards are written: their pools keep room for that many bytes.
        self._lease_room = (writer_threads + 1) * shard_bytes
        self._held_pools: list[tuple[HostBufferPool, Callable[[], None]]] = []

        _make_output_dir(self.root)
        lock_was_there = os.path.lexists(self.root / LOCK_NAME)
        self._lock_fd = acquire_dir_lock(self.root)
        try:
            target = WriteTarget(self.root, self.metadata, self.state_encoding, shard_prefix, build)
            opened = open_or_resume(target, self.report, final_norm_weight, created_by)
        except BaseException:
            os.close(self._lock_fd)
            if not lock_was_there and not is_dataset_dir(self.root):  # a refused directory is left as it was found
                remove_quietly(self.root / LOCK_NAME)
            raise
        self._next_seq = opened.next_seq
        self._session = WriterSession(self.root, opened.manifest, opened.stored_ids, self.report)
        self._flusher = ShardFlusher(self._session, self.state_encoding.name, shard_prefix, writer_threads)
        if build is not None and opened.manifest.build != build:  # a resumed dataset: this run's record replaces the last one's
            self._session.record_build(build)

    # ------------------------------------------------------------------ what it writes
    @property
    def manifest(self) -> Manifest:
        return self._session.manifest

    @property
    def state_dtype(self) -> torch.dtype:
        return self._encoder.state_dtype

    @property
    def num_aux(self) -> int:
        return self._encoder.num_aux

    @property
    def hidden_size(self) -> int:
        return self._encoder.hidden_size

    @property
    def state_encoding(self) -> Encoding:
        return self._encoder.encoding

    @property
    def open_shard_bytes(self) -> int:
        """Bytes taken but not yet in a listed shard (buffered, or being written): a progress line counts them as written.

        Why: a shard is published only once full (1 GiB by default), so the published bytes
        alone stay 0 for most of a small or slow build.
        """
        with self._lock:
            buffered = self._buffer_bytes
        return buffered + self._flusher.unpublished_bytes

    def progress_bytes(self) -> tuple[int, int]:
        """(bytes this session wrote, the open shard's included; of them, the open shard's): what a progress line shows."""
        held = self.open_shard_bytes
        return self.report.bytes_written + held, held

    # ------------------------------------------------------------------ add
    def contains(self, sample_id: str) -> bool:
        """True if the sample is stored, quarantined, or pending in this session."""
        return self._session.contains(sample_id)

    @property
    def stored_ids(self) -> frozenset[str]:
        return self._session.stored_ids

    def add(self, sample: CapturedSample) -> bool:
        """Queue one sample; returns False if a previous run already stored it.

        Raises :class:`SampleError` subclasses for bad samples (nothing is written for
        them), :class:`DiskFullError` if a background flush ran out of space.
        """
        self._flusher.raise_error()
        if self._closed:
            raise RuntimeError("ShardWriter is closed")
        sid = sample.sample_id
        problem = sample_id_problem(sid)
        if problem is not None:
            raise SampleError(problem)
        if not self._session.is_new(sid):
            return False
        encoded = self._checked_and_encoded(sample)
        if encoded is None:
            return False
        self._session.add_pending(sid)
        with self._lock:
            self._buffer.append(encoded)
            self._buffer_bytes += encoded.nbytes
            full = self._buffer_bytes >= self.shard_bytes
        if full:
            self.flush()
        return True

    def add_many(self, samples: Iterable[CapturedSample]) -> int:
        return sum(self.add(s) for s in samples)

    def _checked_and_encoded(self, sample: CapturedSample) -> EncodedSample | None:
        """The sample in storage form; None when it was quarantined for NaN/inf states."""
        self._encoder.check(sample)
        bad = self._encoder.nonfinite_problem(sample)
        encoded = None
        if not bad:
            try:
                encoded = self._encoder.encode(sample)
            except NonFiniteStateError as exc:  # states the server encoded, with scales that decode to NaN/inf
                bad = str(exc).removeprefix(f"{sample.sample_id}: ")
        if encoded is None:
            if self.nonfinite == "refuse":
                raise NonFiniteStateError(f"{sample.sample_id}: {bad}")
            self._session.quarantine(sample.sample_id, bad)
            return None
        self._hold_room_for_leases(encoded.aux, encoded.aux_scale, encoded.final, encoded.final_scale)
        return encoded

    def _hold_room_for_leases(self, *states: torch.Tensor | None) -> None:
        """Have the pool of any leased state keep room for this writer's leases until it closes.

        Why: a sample waits here until its shard is on disk, and then its buffer goes back
        to the pool it was leased from (the SGLang client's dump reads), a whole shard's
        buffers at once. Without room above the pool's base cap they were freed and the
        next dumps read into memory never touched before, a page fault per 4 KiB. Copying
        each sample into the writer's own pool instead would run on the one thread that
        adds samples and slow it (see docs/BENCHMARKS.md, ``benchmarks/bench_node.py
        --trace``). At most ``writer_threads + 1`` shards' samples are held, which is the
        room asked for.
        """
        for state in states:
            pool = None if state is None else lease_pool(state)
            if pool is not None and all(held is not pool for held, _release in self._held_pools):
                release = pool.hold_room(self._lease_room)
                weakref.finalize(self, release)  # a writer dropped without close() gives the room back too
                self._held_pools.append((pool, release))

    def _release_held_pools(self) -> None:
        for _pool, release in self._held_pools:
            release()
        self._held_pools = []

    # ------------------------------------------------------------------ metadata
    def record_regenerated_file(self, name: str, entry: RegeneratedFile, *, regeneration: RegenerationRecord) -> None:
        """List a regenerated-conversations file in ``metadata.regeneration.files`` and rewrite the manifest.

        ``regeneration`` is this run's record, used when the manifest has none yet; a
        resumed dataset keeps the record of its first run and gains the file.
        """
        if self._closed:
            raise RuntimeError("ShardWriter is closed; record the regenerated file before closing it")

        def with_file(metadata: DatasetMetadata) -> DatasetMetadata:
            record = metadata.regeneration or regeneration
            return replace(metadata, regeneration=record.with_file(name, entry))

        self._session.edit_metadata(with_file)

    def record_build(self, build: BuildState) -> None:
        """Record the build writing this dataset (``running``, its expected total and resume command) in the manifest."""
        if self._closed:
            raise RuntimeError("ShardWriter is closed; record the build before closing it")
        self._session.record_build(build)

    def finish_build(self, build: BuildState) -> None:
        """Store every buffered sample, wait until its shard is listed, then record ``build`` as finished.

        Why in this order: a manifest that says ``finished`` must count every sample the
        build stored; a crash before this write leaves ``running``, and a resume finishes it.
        """
        self.flush()
        self._flusher.wait()
        self._flusher.raise_error()
        self.record_build(build.as_finished())

    # ------------------------------------------------------------------ flush
    def flush(self) -> None:
        """Hand the buffered samples to a background writer (blocks while too many are in flight)."""
        self._flusher.raise_error()
        with self._lock:
            batch, self._buffer, self._buffer_bytes = self._buffer, [], 0
            if not batch:
                return
            seq = self._next_seq
            self._next_seq += 1
        self._flusher.submit(seq, batch)

    def close(self) -> WriterReport:
        """Flush the last shard, wait for every writer thread, and return the report."""
        if self._closed:
            return self.report
        try:
            self.flush()
            self._flusher.wait()
            self._flusher.raise_error()
        finally:
            self._closed = True
            self._flusher.shutdown()
            self._release_held_pools()
            os.close(self._lock_fd)
        return self.report

    def abort(self) -> None:
        """Stop without flushing the buffer (buffered samples are simply not stored)."""
        with self._lock:
            self._buffer, self._buffer_bytes = [], 0
        try:
            self.close()
        except BaseException:
            pass

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _make_output_dir(root: Path) -> None:
    """``root`` created as a directory, or one already; a file (or a link to one) there, or a file among its parents, is refused in one line."""
    make_directory(root, what="the output")


def _check_options(metadata: DatasetMetadata, shard_bytes: int, nonfinite: str, writer_threads: int, shard_prefix: str) -> None:
    if not 1 <= shard_bytes <= MAX_SHARD_BYTES:
        raise ValueError(f"shard_bytes must be in [1, {MAX_SHARD_BYTES}] (shards stay < 4 GiB), got {shard_bytes}")
    if nonfinite not in ("quarantine", "refuse"):
        raise ValueError(f"nonfinite must be 'quarantine' or 'refuse', got {nonfinite!r}")
    if writer_threads < 1:
        raise ValueError(f"writer_threads must be >= 1, got {writer_threads}")
    if shard_prefix and not all(c.isalnum() or c in "-_." for c in shard_prefix):
        raise ValueError(f"shard_prefix may hold only letters, digits, '-', '_' and '.', got {shard_prefix!r}")
    missing = [k for k in ("aux_layer_ids", "hidden_size", "dtype") if getattr(metadata, k) is None]
    if missing:
        raise ValueError(f"metadata lacks {missing}; the manifest must say what the states mean")
