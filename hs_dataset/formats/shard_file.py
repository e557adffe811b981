"""One shard file: its tensors concatenated from the samples, streamed to disk while hashed, fsynced, renamed.

The bytes go straight from each sample's tensors into the file (no concatenated copy
of a 2 GiB shard in memory) behind the header of the one builder
(:func:`~hs_dataset.codecs.safetensors_header.dump_header`), so a shard is a standard
safetensors file. Its BLAKE3 hash is computed by a second thread from the same
buffers while they are written, never by re-reading (docs/FORMAT.md, "Writing").
"""

from __future__ import annotations

import json
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from hs_dataset.codecs.fp8 import SCALE_SUFFIX
from hs_dataset.codecs.safetensors_header import dump_header
from hs_dataset.codecs.safetensors_layout import read_header
from hs_dataset.errors import FormatError
from hs_dataset.faults import crash_point
from hs_dataset.formats.atomic import remove_quietly, temp_path_for, write_all
from hs_dataset.formats.encoding import safetensors_dtype, tensor_bytes
from hs_dataset.formats.hashing import SHARD_HASH, Hasher, new_hasher
from hs_dataset.formats.manifest import ShardRecord
from hs_dataset.formats.paths import open_regular
from hs_dataset.formats.shard_layout import (
    AUX_KEY,
    CAPTURE_PATHS_KEY,
    FINAL_KEY,
    INPUT_IDS_KEY,
    LOSS_MASK_KEY,
    OFFSETS_KEY,
    SHARD_FORMAT,
)
from hs_dataset.formats.writable import open_for_writing
from hs_dataset.libc import start_writeback

__all__ = ["WRITEBACK_BYTES", "EarlyWriteback", "EncodedSample", "capture_counts", "shard_sample_ids", "write_shard"]

_HASH_CHUNK = 8 * 1024 * 1024
WRITEBACK_BYTES = 32 * 1024 * 1024  # how much of a shard is written before its writeback is started (see EarlyWriteback)


@dataclass
class EncodedSample:
    """A validated sample in storage form: what a shard's tensors are concatenated from."""

    sample_id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux: torch.Tensor
    aux_scale: torch.Tensor | None
    final: torch.Tensor
    final_scale: torch.Tensor | None
    capture_path: str | None = None

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def nbytes(self) -> int:
        parts = (self.input_ids, self.loss_mask, self.aux, self.aux_scale, self.final, self.final_scale)
        return sum(t.numel() * t.element_size() for t in parts if t is not None) + 8


def _shard_tensors(batch: list[EncodedSample]) -> dict[str, tuple[str, tuple[int, ...], list[memoryview]]]:
    """Every tensor of the shard: name -> (safetensors dtype, shape, per-sample byte views)."""
    tokens = sum(s.tokens for s in batch)
    offsets = torch.tensor([0] + [s.tokens for s in batch], dtype=torch.int64).cumsum(0)
    first = batch[0]
    tensors: dict[str, tuple[torch.dtype, tuple[int, ...], list[memoryview]]] = {
        OFFSETS_KEY: (torch.int64, (len(batch) + 1,), [tensor_bytes(offsets)]),
        INPUT_IDS_KEY: (torch.int64, (tokens,), [tensor_bytes(s.input_ids) for s in batch]),
        AUX_KEY: (first.aux.dtype, (tokens, *first.aux.shape[1:]), [tensor_bytes(s.aux) for s in batch]),
        FINAL_KEY: (first.final.dtype, (tokens, first.final.shape[1]), [tensor_bytes(s.final) for s in batch]),
        LOSS_MASK_KEY: (torch.bool, (tokens,), [tensor_bytes(s.loss_mask) for s in batch]),
    }
    if first.aux_scale is not None:
        # per-token scales [T, K] / [T], or per-group ones [T, K, G] / [T, G]: the samples' own trailing shape
        tensors[AUX_KEY + SCALE_SUFFIX] = (
            first.aux_scale.dtype,
            (tokens, *first.aux_scale.shape[1:]),
            [tensor_bytes(s.aux_scale) for s in batch],
        )
        tensors[FINAL_KEY + SCALE_SUFFIX] = (
            first.final_scale.dtype,
            (tokens, *first.final_scale.shape[1:]),
            [tensor_bytes(s.final_scale) for s in batch],
        )
    if first.aux.shape[1] == 0:  # no aux layer (the final state only): the shard holds no aux tensor at all
        tensors.pop(AUX_KEY)
        tensors.pop(AUX_KEY + SCALE_SUFFIX, None)
    return {name: (safetensors_dtype(dtype), shape, views) for name, (dtype, shape, views) in tensors.items()}


def _shard_prefix_and_views(batch: list[EncodedSample], metadata: dict[str, str]) -> list[memoryview]:
    """The header, then every tensor's per-sample views in the order the header lays them out."""
    tensors = _shard_tensors(batch)
    header, order = dump_header([(n, d, s, sum(v.nbytes for v in views)) for n, (d, s, views) in tensors.items()], metadata)
    return [memoryview(header)] + [v for name in order for v in tensors[name][2]]


class _Hasher(threading.Thread):
    """Hashes the buffers the writer hands it, in parallel with the writes (blake3 releases the GIL)."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="hs-shard-hasher")
        self.digest: Hasher = new_hasher(SHARD_HASH)
        self.queue: queue.Queue[memoryview | None] = queue.Queue(maxsize=16)

    def run(self) -> None:
        while (chunk := self.queue.get()) is not None:
            self.digest.update(chunk)


class EarlyWriteback:
    """Starts the disk writing a shard's bytes every :data:`WRITEBACK_BYTES` while the rest is still being written.

    Why: without it a shard reaches the disk only at its ``fsync``, as one burst from one
    file, which one stream could not keep the disk busy with: while few shards are in
    flight (the first ones of a run, the last ones) the disk idled. With it one file
    alone is written faster and several at once no slower (see docs/BENCHMARKS.md,
    ``benchmarks/bench_writeback.py``). ``fsync`` still makes the shard durable.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.started = 0  # bytes whose writeback has been asked for
        self.enabled = True

    def wrote_up_to(self, size: int) -> None:
        if self.enabled and size - self.started >= WRITEBACK_BYTES:
            self.enabled = start_writeback(self.fd, self.started, size - self.started)
            self.started = size


def write_shard(final: Path, name: str, batch: list[EncodedSample], dataset_id: str, encoding: str, seq: int) -> ShardRecord:
    """Write one shard to a temp file while hashing it, fsync, then rename it into place.

    The rename is made durable by the publisher's directory fsync, before a manifest
    lists the shard (:class:`~hs_dataset.formats.shard_flusher.ShardFlusher`).
    """
    metadata = {
        "format": SHARD_FORMAT,
        "format_version": "1",
        "dataset_id": dataset_id,
        "shard_seq": str(seq),
        "state_encoding": encoding,
        "sample_ids": json.dumps([s.sample_id for s in batch]),
    }
    captured_by = capture_counts([s.capture_path for s in batch])
    if captured_by:
        metadata[CAPTURE_PATHS_KEY] = json.dumps([s.capture_path or "" for s in batch])
    views = _shard_prefix_and_views(batch, metadata)
    temp = temp_path_for(final)
    hasher = _Hasher()
    hasher.start()
    size = 0
    fd = open_for_writing(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    total = sum(v.nbytes for v in views)
    writeback = EarlyWriteback(fd)
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
    return ShardRecord(name, len(batch), sum(s.tokens for s in batch), size, blake3=hasher.digest.hexdigest(), captured_by=captured_by)


def capture_counts(paths: list[str | None]) -> dict[str, int] | None:
    """How many samples each capture path stored (None where no sample says: one way of capture only)."""
    counts: dict[str, int] = {}
    for path in paths:
        if path:
            counts[path] = counts.get(path, 0) + 1
    return counts or None


def shard_sample_ids(path: Path) -> list[str]:
    """The sample ids a shard's header lists, in order."""
    with open_regular(path, what="shard") as f:
        _specs, meta, _ = read_header(f, str(path))
    try:
        return list(json.loads(meta["sample_ids"]))
    except (KeyError, ValueError):
        raise FormatError(f"{path}: header has no valid sample_ids list") from None
