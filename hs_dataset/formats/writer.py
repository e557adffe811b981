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

import errno
import json
import os
import queue
import threading
import uuid
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from hs_dataset.dtypes import state_dtype
from hs_dataset.faults import crash_point
from hs_dataset.host_buffers import HostBufferPool, lease_pool
from hs_dataset.libc import start_writeback
from hs_dataset.errors import (
    DiskFullError,
    DuplicateSampleError,
    ForeignDatasetError,
    FormatError,
    IntegrityError,
    NonFiniteStateError,
    SampleError,
)
from hs_dataset.formats.dirlock import LOCK_NAME, acquire_dir_lock
from hs_dataset.formats.atomic import atomic_write_bytes, fsync_dir, is_temp_name, publish, remove_quietly, temp_path_for, write_all
from hs_dataset.formats.encoding import (
    SCALE_SUFFIX,
    accept_encoded_state,
    all_finite,
    encode_state,
    get_encoding,
    state_encoding_for,
    tensor_bytes,
)
from hs_dataset.formats.hashing import SHARD_HASH, Hasher, file_digests, new_hasher, sha256_fileobj
from hs_dataset.formats.paths import open_regular, resolve_member
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, ShardRecord, identity_fingerprint
from hs_dataset.formats.safetensors_layout import build_header, read_header
from hs_dataset.formats.shard_layout import (
    AUX_KEY,
    DEFAULT_SHARD_BYTES,
    FINAL_KEY,
    INPUT_IDS_KEY,
    LOSS_MASK_KEY,
    MAX_SHARD_BYTES,
    NORM_WEIGHT_FILE,
    NORM_WEIGHT_KEY,
    OFFSETS_KEY,
    SHARD_FORMAT,
    SHARD_NAME_RE,
    shard_file_name,
)
from hs_dataset.sample import CapturedSample

__all__ = ["ShardWriter", "WriterReport"]

_HASH_CHUNK = 8 * 1024 * 1024
WRITEBACK_BYTES = 32 * 1024 * 1024  # how much of a shard is written before its writeback is started (see _EarlyWriteback)


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


@dataclass
class _Encoded:
    """A validated sample in storage form."""

    sample_id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux: torch.Tensor
    aux_scale: torch.Tensor | None
    final: torch.Tensor
    final_scale: torch.Tensor | None

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def nbytes(self) -> int:
        parts = (self.input_ids, self.loss_mask, self.aux, self.aux_scale, self.final, self.final_scale)
        return sum(t.numel() * t.element_size() for t in parts if t is not None) + 8


class ShardWriter:
    """Write captured samples into a dataset directory.

    ``metadata`` is the dataset-level metadata recorded in the manifest (model,
    ``aux_layer_ids`` as HF ``hidden_states`` indexes, ``final_state``, ``dtype``,
    ``hidden_size``, config and tokenizer; see docs/FORMAT.md). It must contain at
    least ``aux_layer_ids``, ``hidden_size`` and ``dtype``.

    Use as a context manager; :meth:`close` flushes the last shard.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        metadata: dict[str, Any],
        *,
        final_norm_weight: torch.Tensor | None = None,
        storage: str = "native",
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        nonfinite: str = "quarantine",
        writer_threads: int = 2,
        shard_prefix: str = "",
        created_by: str | None = None,
    ) -> None:
        if not 1 <= shard_bytes <= MAX_SHARD_BYTES:
            raise ValueError(f"shard_bytes must be in [1, {MAX_SHARD_BYTES}] (shards stay < 4 GiB), got {shard_bytes}")
        if nonfinite not in ("quarantine", "refuse"):
            raise ValueError(f"nonfinite must be 'quarantine' or 'refuse', got {nonfinite!r}")
        if writer_threads < 1:
            raise ValueError(f"writer_threads must be >= 1, got {writer_threads}")
        if shard_prefix and not all(c.isalnum() or c in "-_." for c in shard_prefix):
            raise ValueError(f"shard_prefix may hold only letters, digits, '-', '_' and '.', got {shard_prefix!r}")
        missing = [k for k in ("aux_layer_ids", "hidden_size", "dtype") if k not in metadata]
        if missing:
            raise ValueError(f"metadata lacks {missing}; the manifest must say what the states mean")
        self.root = Path(root)
        self.metadata = dict(metadata)
        self.state_dtype = state_dtype(self.metadata["dtype"])
        self.num_aux = len(self.metadata["aux_layer_ids"])
        self.hidden_size = int(self.metadata["hidden_size"])
        self.state_encoding = get_encoding(state_encoding_for(self.state_dtype, storage))
        self.shard_bytes = shard_bytes
        self.nonfinite = nonfinite
        self.shard_prefix = shard_prefix
        self.report = WriterReport()

        self._lock = threading.Lock()
        self._manifest_lock = threading.Lock()  # orders manifest writes; held only by writer threads and rare edits
        self._manifest_edits = self._manifest_saved = 0
        self._buffer: list[_Encoded] = []
        self._buffer_bytes = 0
        self._stored_ids: set[str] = set()
        self._session_ids: set[str] = set()
        self._next_seq = 0
        self._error: BaseException | None = None
        self._in_flight = threading.BoundedSemaphore(writer_threads)
        self._futures: list[Future] = []
        self._closed = False
        # Leased samples wait here until their shards are written: their pools keep room for that many bytes.
        self._lease_room = (writer_threads + 1) * shard_bytes
        self._held_pools: list[tuple[HostBufferPool, Callable[[], None]]] = []

        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = acquire_dir_lock(self.root)
        try:
            self.manifest = self._open_or_create(final_norm_weight, created_by)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._pool = ThreadPoolExecutor(max_workers=writer_threads, thread_name_prefix="hs-shard-writer")
        # Shards written and renamed, waiting to be made durable and listed: one thread lists them, in batches.
        self._unlisted: list[tuple[ShardRecord, list[str]]] = []
        self._publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hs-shard-publisher")
        self._publishes: list[Future] = []

    # ------------------------------------------------------------------ open
    def _tensor_table(self) -> dict[str, dict[str, Any]]:
        state = {"encoding": self.state_encoding.name}
        return {
            OFFSETS_KEY: {"encoding": "int64", "shape": ["samples+1"]},
            INPUT_IDS_KEY: {"encoding": "int64", "shape": ["tokens"]},
            LOSS_MASK_KEY: {"encoding": "bool", "shape": ["tokens"]},
            AUX_KEY: {**state, "shape": ["tokens", self.num_aux, self.hidden_size]},
            FINAL_KEY: {**state, "shape": ["tokens", self.hidden_size]},
        }

    def _open_or_create(self, final_norm_weight: torch.Tensor | None, created_by: str | None) -> Manifest:
        from hs_dataset.version import __version__

        entries = [e for e in os.listdir(self.root) if e != LOCK_NAME]
        for name in entries:
            if is_temp_name(name):
                remove_quietly(self.root / name)
                self.report.removed_temp_files += 1
        entries = [e for e in entries if not is_temp_name(e)]
        if MANIFEST_NAME in entries:
            manifest = Manifest.load(self.root)
            wanted = identity_fingerprint(self.metadata)
            if manifest.identity != wanted:
                raise ForeignDatasetError(
                    f"{self.root} already holds a different dataset (config {manifest.metadata.get('config_name')!r}, "
                    f"model {manifest.metadata.get('model')!r}); write to another directory or delete this one"
                )
            if manifest.tensors.get(AUX_KEY, {}).get("encoding") != self.state_encoding.name:
                raise ForeignDatasetError(
                    f"{self.root} stores states as {manifest.tensors.get(AUX_KEY, {}).get('encoding')!r} but this run asks for "
                    f"{self.state_encoding.name!r}; use the same --storage as the first run or another directory"
                )
            self._resume(manifest, entries)
            fsync_dir(self.root)
            return manifest
        if entries == [NORM_WEIGHT_FILE]:
            # a crash between publishing the norm weight and the first manifest: nothing else was written
            remove_quietly(self.root / NORM_WEIGHT_FILE)
            entries = []
        if entries:
            raise ForeignDatasetError(
                f"{self.root} is not empty and holds no hs_dataset manifest ({len(entries)} entries, e.g. {sorted(entries)[:3]}); "
                "choose an empty or new output directory"
            )
        metadata = dict(self.metadata)
        if final_norm_weight is not None:
            metadata["final_norm"] = {**metadata.get("final_norm", {}), **self._write_norm_weight(final_norm_weight)}
        manifest = Manifest(
            dataset_id=uuid.uuid4().hex,
            metadata=metadata,
            tensors=self._tensor_table(),
            created_by=created_by or f"hs_dataset {__version__}",
            identity=identity_fingerprint(self.metadata),
        )
        manifest.save(self.root)
        return manifest

    def _write_norm_weight(self, weight: torch.Tensor) -> dict[str, Any]:
        from safetensors.torch import save_file

        final = self.root / NORM_WEIGHT_FILE
        temp = temp_path_for(final)
        save_file({NORM_WEIGHT_KEY: weight.detach().to("cpu").contiguous()}, str(temp))
        os.chmod(temp, 0o644)
        with open(temp, "rb") as f:
            os.fsync(f.fileno())
            digest = sha256_fileobj(f)
        publish(temp, final)
        return {"weight_file": NORM_WEIGHT_FILE, "weight_key": NORM_WEIGHT_KEY, "weight_sha256": digest}

    def _resume(self, manifest: Manifest, entries: list[str]) -> None:
        listed = {s.file for s in manifest.shards}
        for index, record in enumerate(manifest.shards):
            path = resolve_member(self.root, record.file, what=f"shards[{index}].file")
            if not path.is_file() or path.stat().st_size != record.bytes:
                raise IntegrityError(
                    f"{path}: listed in the manifest but missing or of the wrong size; run `hs-dataset verify {self.root}` "
                    "and restore the file (or start a new output directory)"
                )
        for name in sorted(entries):
            match = SHARD_NAME_RE.match(name)
            if match and name not in listed and match.group("prefix") == self.shard_prefix:
                self._adopt_orphan(manifest, name)
        for record in manifest.shards:
            match = SHARD_NAME_RE.match(Path(record.file).name)
            ids = _shard_sample_ids(resolve_member(self.root, record.file, what="shards[].file"))
            self._stored_ids.update(ids)
            if match and match.group("prefix") == self.shard_prefix:
                self._next_seq = max(self._next_seq, int(match.group("seq")) + 1)
        self._stored_ids.update(q["sample_id"] for q in manifest.quarantine)

    def _adopt_orphan(self, manifest: Manifest, name: str) -> None:
        """A crash between rename and manifest update leaves a complete shard: hash it and list it."""
        path = self.root / name
        try:
            with open_regular(path, what="unlisted shard") as f:
                specs, meta, _ = read_header(f, str(path))
                if meta.get("dataset_id") != manifest.dataset_id or meta.get("format") != SHARD_FORMAT:
                    raise FormatError(f"{path}: belongs to another dataset")
                digest = file_digests(f, (SHARD_HASH,))[SHARD_HASH]
            ids = json.loads(meta["sample_ids"])
            record = ShardRecord(name, len(ids), int(specs[INPUT_IDS_KEY].shape[0]), path.stat().st_size, blake3=digest)
        except (FormatError, KeyError, ValueError, OSError):
            os.replace(path, self.root / f"{name}.rejected")
            self.report.rejected_shards.append(name)
            return
        manifest.shards.append(record)
        manifest.shards.sort(key=lambda s: s.file)
        manifest.save(self.root)
        self.report.adopted_shards.append(name)

    # ------------------------------------------------------------------ add
    def contains(self, sample_id: str) -> bool:
        """True if the sample is stored, quarantined, or pending in this session."""
        with self._lock:
            return sample_id in self._stored_ids or sample_id in self._session_ids

    @property
    def stored_ids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._stored_ids)

    def add(self, sample: CapturedSample) -> bool:
        """Queue one sample; returns False if a previous run already stored it.

        Raises :class:`SampleError` subclasses for bad samples (nothing is written for
        them), :class:`DiskFullError` if a background flush ran out of space.
        """
        self._raise_background_error()
        if self._closed:
            raise RuntimeError("ShardWriter is closed")
        sid = sample.sample_id
        if not isinstance(sid, str) or not sid or len(sid) > 1024:
            raise SampleError(f"sample id must be a non-empty string of at most 1024 chars, got {sid!r}")
        with self._lock:
            if sid in self._session_ids:
                raise DuplicateSampleError(f"sample {sid!r} was given twice in this run; sample ids must be unique")
            if sid in self._stored_ids:
                self.report.skipped_existing += 1
                return False
        encoded = self._validate_and_encode(sample)
        if encoded is None:
            return False
        with self._lock:
            self._session_ids.add(sid)
            self._buffer.append(encoded)
            self._buffer_bytes += encoded.nbytes
            full = self._buffer_bytes >= self.shard_bytes
        if full:
            self.flush()
        return True

    def add_many(self, samples: Iterable[CapturedSample]) -> int:
        return sum(self.add(s) for s in samples)

    def _validate_and_encode(self, s: CapturedSample) -> _Encoded | None:
        sid = s.sample_id
        ids, mask, aux, final = s.input_ids, s.loss_mask, s.aux_hidden_states, s.final_hidden_state
        if not all(isinstance(t, torch.Tensor) for t in (ids, mask, aux, final)):
            raise SampleError(f"{sid}: input_ids, loss_mask and both states must be torch tensors")
        if ids.dim() != 1 or ids.shape[0] == 0:
            raise SampleError(f"{sid}: empty sample or input_ids not 1-D (shape {tuple(ids.shape)}); every sample needs >= 1 token")
        if ids.dtype not in (torch.int64, torch.int32):
            raise SampleError(f"{sid}: input_ids must be int64, got {ids.dtype}")
        t = ids.shape[0]
        if mask.shape != (t,) or mask.dtype not in (torch.bool, torch.uint8, torch.int64, torch.int32):
            raise SampleError(f"{sid}: loss_mask must be bool [{t}], got {mask.dtype} {tuple(mask.shape)}")
        if mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):
            raise SampleError(f"{sid}: loss_mask must hold only 0/1")
        want_aux = (t, self.num_aux, self.hidden_size)
        if tuple(aux.shape) != want_aux:
            raise SampleError(f"{sid}: aux_hidden_states shape {tuple(aux.shape)} != expected {want_aux} [tokens, K, H]")
        if tuple(final.shape) != (t, self.hidden_size):
            raise SampleError(f"{sid}: final_hidden_state shape {tuple(final.shape)} != expected {(t, self.hidden_size)} [tokens, H]")
        pre_encoded = s.aux_scale is not None or s.final_scale is not None  # fp8 from the server's GPU
        for name, state in (("aux_hidden_states", aux), ("final_hidden_state", final)):
            if state.dtype != self.state_dtype and not pre_encoded:
                raise SampleError(f"{sid}: {name} dtype {state.dtype} != dataset dtype {self.state_dtype}; capture in one dtype")
        bad = _nonfinite_report(aux, final)
        if bad:
            if self.nonfinite == "refuse":
                raise NonFiniteStateError(f"{sid}: {bad}")
            self._quarantine(sid, bad)
            return None
        if pre_encoded:  # stored as the server encoded them (the same quantizer), after checks
            try:
                aux_data, aux_scale = accept_encoded_state(_on_host(aux), _on_host(s.aux_scale), self.state_encoding, f"{sid}: aux_hidden_states")
                final_data, final_scale = accept_encoded_state(_on_host(final), _on_host(s.final_scale), self.state_encoding, f"{sid}: final_hidden_state")
            except ValueError as exc:
                raise SampleError(str(exc)) from None
        else:
            aux_data, aux_scale = encode_state(_on_host(aux), self.state_encoding)
            final_data, final_scale = encode_state(_on_host(final), self.state_encoding)
        self._hold_room_for_leases(aux_data, aux_scale, final_data, final_scale)
        ids, mask = _on_host(ids), _on_host(mask)
        return _Encoded(
            sid,
            (ids if ids.dtype == torch.int64 else ids.to(torch.int64)).contiguous(),
            (mask if mask.dtype == torch.bool else mask.bool()).contiguous(),
            aux_data,
            aux_scale,
            final_data,
            final_scale,
        )

    def _hold_room_for_leases(self, *states: torch.Tensor | None) -> None:
        """Have the pool of any leased state keep room for this writer's leases until it closes.

        Why: a sample waits here until its shard is on disk, and then its buffer goes back
        to the pool it was leased from (the SGLang client's dump reads), a whole shard's
        buffers at once. Without room above the pool's base cap they were freed and the
        next dumps read into memory never touched before, a page fault per 4 KiB. Copying
        each sample into the writer's own pool instead (before) avoided that, but the copy
        ran on the one thread that adds samples and held a Kimi node at ~1.7 GB/s of
        shards (benchmarks/bench_node.py --trace). At most ``writer_threads + 1`` shards'
        samples are held, which is the room asked for.
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

    def _quarantine(self, sid: str, reason: str) -> None:
        with self._lock:
            self._session_ids.add(sid)
            entry = {"sample_id": sid, "reason": reason}
            self.manifest.quarantine.append(entry)
            self.report.quarantined.append(entry)
            edit = self._manifest_edit_locked()
        self._save_manifest(*edit)

    def _manifest_edit_locked(self) -> tuple[int, bytes]:
        """Number this state of the manifest and encode it (the caller holds ``_lock``)."""
        self._manifest_edits += 1
        return self._manifest_edits, self.manifest.encode()

    def _save_manifest(self, edit: int, data: bytes) -> None:
        """Write a manifest state unless a later one is already on disk.

        Outside ``_lock``: the fsyncs (file and directory) can wait on a journal commit that
        flushes the other shards in flight, and ``add`` must not wait behind them.
        """
        with self._manifest_lock:
            if edit <= self._manifest_saved:
                return
            atomic_write_bytes(self.root / MANIFEST_NAME, data)
            self._manifest_saved = edit

    # ------------------------------------------------------------------ flush
    def flush(self) -> None:
        """Hand the buffered samples to a background writer (blocks while too many are in flight)."""
        self._raise_background_error()
        with self._lock:
            batch, self._buffer, self._buffer_bytes = self._buffer, [], 0
            if not batch:
                return
            seq = self._next_seq
            self._next_seq += 1
        self._in_flight.acquire()
        future = self._pool.submit(self._write_and_publish, seq, batch)
        future.add_done_callback(lambda _f: self._in_flight.release())
        self._futures = [f for f in self._futures if not f.done()] + [future]

    def _write_and_publish(self, seq: int, batch: list[_Encoded]) -> None:
        """Write one shard and rename it into place, then hand it to the publisher.

        The writer thread is free for the next shard once the shard's own bytes are on
        disk: the directory fsync and the manifest write (three more fsyncs, each able
        to wait on a journal commit that flushes every shard in flight) are the
        publisher's, which lists every shard finished meanwhile in one manifest write.
        """
        ids = [s.sample_id for s in batch]
        try:
            name = shard_file_name(self.shard_prefix, seq)
            record = _write_shard(self.root / name, name, batch, self.manifest.dataset_id, self.state_encoding.name, seq)
        except BaseException as exc:  # surfaced to the caller at the next add/flush/close
            self._fail(exc, ids)
            return
        with self._lock:  # the samples' memory goes back as this returns, not after the listing
            self._unlisted.append((record, ids))
            self._publishes = [f for f in self._publishes if not f.done()] + [self._publisher.submit(self._list_unlisted)]

    def _list_unlisted(self) -> None:
        """Make the renames of the shards written so far durable, then list them all in one manifest write.

        A shard is listed only after a directory fsync that follows its rename, so a
        manifest on disk never names a shard whose rename could still be lost.
        """
        with self._lock:
            ready, self._unlisted = self._unlisted, []
        if not ready:  # listed by an earlier call
            return
        ids = [sid for _record, batch_ids in ready for sid in batch_ids]
        try:
            fsync_dir(self.root)
            crash_point("shard.after_publish")
            with self._lock:
                self.manifest.shards.extend(record for record, _ in ready)
                self.manifest.shards.sort(key=lambda s: s.file)
                edit = self._manifest_edit_locked()
            self._save_manifest(*edit)
        except BaseException as exc:
            self._fail(exc, ids)
            return
        with self._lock:
            self._stored_ids.update(ids)
            self._session_ids.difference_update(ids)
            self.report.written += len(ids)
            for record, _ in ready:
                self.report.tokens += record.tokens
                self.report.shards_written += 1
                self.report.bytes_written += record.bytes

    def _fail(self, exc: BaseException, ids: list[str]) -> None:
        """Record a background error for the caller's next add/flush/close; the samples are no longer pending."""
        with self._lock:
            self._session_ids.difference_update(ids)
            if self._error is None:
                self._error = exc

    def _raise_background_error(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is None:
            return
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            raise DiskFullError(
                errno.ENOSPC,
                f"disk full while writing a shard in {self.root}: the partial shard was discarded and the manifest "
                "still lists only complete shards; free space and run the same command again to resume",
            ) from error
        raise error

    def close(self) -> WriterReport:
        """Flush the last shard, wait for every writer thread, and return the report."""
        if self._closed:
            return self.report
        try:
            self.flush()
            for future in list(self._futures):
                future.result()
            with self._lock:
                publishes = list(self._publishes)
            for future in publishes:
                future.result()
            self._raise_background_error()
        finally:
            self._closed = True
            self._pool.shutdown(wait=True)
            self._publisher.shutdown(wait=True)  # after the writers: none can queue a listing any more
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

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


# ---------------------------------------------------------------------- shard bytes
def _on_host(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` on the host without autograd, with no call into torch when it already is.

    Why: even a no-op torch call (``detach``, ``to``) hands the GIL back, and ``add``
    runs on one thread that shares the GIL with the client's loaders and writer
    threads, where each hand-back can wait a switch interval (``bench_node.py --trace``
    showed that thread busy through the whole ramp).
    """
    if t is None or (t.device.type == "cpu" and not t.requires_grad):
        return t
    return t.detach().to("cpu")


def _nonfinite_report(aux: torch.Tensor, final: torch.Tensor) -> str:
    problems = []
    for name, state in (("aux_hidden_states", aux), ("final_hidden_state", final)):
        if all_finite(state):
            continue
        finite = torch.isfinite(state.float() if state.dtype == torch.float8_e4m3fn else state)
        bad_tokens = (~finite).flatten(1).any(dim=1).nonzero().flatten()
        problems.append(f"{name} has NaN/inf at {bad_tokens.numel()} token(s), first at token {int(bad_tokens[0])}")
    return "; ".join(problems)


def _shard_entries(batch: list[_Encoded]) -> list[tuple[str, str, tuple[int, ...], list[memoryview]]]:
    """(name, dtype, shape, per-sample byte views), ordered by descending item size so every tensor is aligned."""
    from hs_dataset.formats.encoding import safetensors_dtype

    tokens = sum(s.tokens for s in batch)
    offsets = torch.tensor([0] + [s.tokens for s in batch], dtype=torch.int64).cumsum(0)
    first = batch[0]
    entries: list[tuple[str, torch.dtype, tuple[int, ...], list[memoryview]]] = [
        (OFFSETS_KEY, torch.int64, (len(batch) + 1,), [tensor_bytes(offsets)]),
        (INPUT_IDS_KEY, torch.int64, (tokens,), [tensor_bytes(s.input_ids) for s in batch]),
        (AUX_KEY, first.aux.dtype, (tokens, *first.aux.shape[1:]), [tensor_bytes(s.aux) for s in batch]),
        (FINAL_KEY, first.final.dtype, (tokens, first.final.shape[1]), [tensor_bytes(s.final) for s in batch]),
        (LOSS_MASK_KEY, torch.bool, (tokens,), [tensor_bytes(s.loss_mask) for s in batch]),
    ]
    if first.aux_scale is not None:
        entries.append((AUX_KEY + SCALE_SUFFIX, torch.float32, (tokens, first.aux.shape[1]), [tensor_bytes(s.aux_scale) for s in batch]))
        entries.append((FINAL_KEY + SCALE_SUFFIX, torch.float32, (tokens,), [tensor_bytes(s.final_scale) for s in batch]))
    entries.sort(key=lambda e: -torch.empty((), dtype=e[1]).element_size())
    return [(name, safetensors_dtype(dtype), shape, views) for name, dtype, shape, views in entries]


class _Hasher(threading.Thread):
    """Hashes the buffers the writer hands it, in parallel with the writes (blake3 releases the GIL)."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="hs-shard-hasher")
        self.digest: Hasher = new_hasher(SHARD_HASH)
        self.queue: queue.Queue[memoryview | None] = queue.Queue(maxsize=16)

    def run(self) -> None:
        while (chunk := self.queue.get()) is not None:
            self.digest.update(chunk)


class _EarlyWriteback:
    """Starts the disk writing a shard's bytes every :data:`WRITEBACK_BYTES` while the rest is still being written.

    Why: without it a shard reaches the disk only at its ``fsync``, as one burst from one
    file, which one stream could not keep the disk busy with: while few shards are in
    flight (the first ones of a run, the last ones) the disk idled. With it one file
    alone was written 1.29–1.54x faster on the H200 host, 8 at once no slower
    (``benchmarks/bench_writeback.py``), and bench_node's last shards end together.
    ``fsync`` still makes the shard durable.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.started = 0  # bytes whose writeback has been asked for
        self.enabled = True

    def wrote_up_to(self, size: int) -> None:
        if self.enabled and size - self.started >= WRITEBACK_BYTES:
            self.enabled = start_writeback(self.fd, self.started, size - self.started)
            self.started = size


def _write_shard(final: Path, name: str, batch: list[_Encoded], dataset_id: str, encoding: str, seq: int) -> ShardRecord:
    """Write one shard to a temp file while hashing it, fsync, then rename it into place (see ``_list_unlisted``)."""
    entries = _shard_entries(batch)
    metadata = {
        "format": SHARD_FORMAT,
        "format_version": "1",
        "dataset_id": dataset_id,
        "shard_seq": str(seq),
        "state_encoding": encoding,
        "sample_ids": json.dumps([s.sample_id for s in batch]),
    }
    header, _specs = build_header([(n, d, s, sum(v.nbytes for v in views)) for n, d, s, views in entries], metadata)
    temp = temp_path_for(final)
    hasher = _Hasher()
    hasher.start()
    size = 0
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    views = [memoryview(header)] + [v for _n, _d, _s, per_sample in entries for v in per_sample]
    total = sum(v.nbytes for v in views)
    writeback = _EarlyWriteback(fd)
    try:
        for view in views:
            for start in range(0, view.nbytes, _HASH_CHUNK):
                chunk = view[start : start + _HASH_CHUNK]
                hasher.queue.put(chunk)
                write_all(fd, chunk)
                size += chunk.nbytes
                writeback.wrote_up_to(size)
                if size * 2 >= total > (size - chunk.nbytes) * 2:
                    crash_point("shard.mid_write")
        hasher.queue.put(None)
        os.fsync(fd)
        hasher.join()
        crash_point("shard.before_publish")
    except BaseException:
        hasher.queue.put(None)
        os.close(fd)
        remove_quietly(temp)
        raise
    os.close(fd)
    os.replace(temp, final)  # durable once the publisher fsyncs the directory, before the manifest lists it
    return ShardRecord(name, len(batch), sum(s.tokens for s in batch), size, blake3=hasher.digest.hexdigest())


def _shard_sample_ids(path: Path) -> list[str]:
    with open_regular(path, what="shard") as f:
        _specs, meta, _ = read_header(f, str(path))
    try:
        return list(json.loads(meta["sample_ids"]))
    except (KeyError, ValueError):
        raise FormatError(f"{path}: header has no valid sample_ids list") from None

