"""The dump writer threads: each finished request becomes ``{rid}.safetensors`` in the staging directory.

Runs inside SGLang scheduler processes (stdlib and torch only). The forward thread
hands over a :class:`DumpJob` (the request's host pieces, one per prefill chunk) and
goes on; a writer thread waits for the pieces' copies, then writes the dump as the
safetensors header (:func:`~hs_dataset.codecs.safetensors_header.dump_header`) followed
by the tensors' bytes straight from the pinned host buffers, in one ``os.writev``
(:meth:`~hs_dataset.server_patch.staging.StagingDir.write_atomic`): no serialized
copy of the file is built, which is what lets a writer thread keep its rate (see
docs/BENCHMARKS.md).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from hs_dataset.codecs.fp8 import SCALE_SUFFIX, STATE_ENCODING_KEY
from hs_dataset.codecs.safetensors_header import dump_header
from hs_dataset.dtypes import from_torch
from hs_dataset.libc import name_os_thread
from hs_dataset.server_patch.budget import StagingBudget
from hs_dataset.server_patch.config import CaptureConfig
from hs_dataset.server_patch.contract.dump import DUMP_FORMAT, DUMP_SUFFIX, DUMP_VERSION, REFUSED_WRITE_FAILED
from hs_dataset.server_patch.copier import HostPiece, host_bytes
from hs_dataset.server_patch.staging import StagingDir

__all__ = ["DumpJob", "DumpWriter"]

logger = logging.getLogger("hs_dataset.server_patch")


@dataclass
class DumpJob:
    """One complete request, waiting for a writer thread."""

    rid: str
    total: int  # tokens the request has (the rid says so)
    pieces: list[HostPiece]  # its rows, one piece per prefill chunk, in order
    reserved: int  # staging bytes reserved for it (one file)
    meta: dict  # per-dump metadata: batch size, chunks, forward-thread CPU
    state_dtype: str = ""
    name: str = ""  # the file's name when not ``{rid}.safetensors`` (a one-pass piece)


class DumpWriter:
    """A queue of :class:`DumpJob` and the threads that write them; every job's budget is committed or released."""

    def __init__(
        self,
        config: CaptureConfig,
        staging: StagingDir,
        budget: StagingBudget,
        *,
        sglang_version: str,
        extra_metadata: Mapping[str, str],
        stats: dict,
        refuse: Callable[[str, str], None],
        written: Callable[[str], None] = lambda rid: None,
    ) -> None:
        """``stats``: the core's counters (dumps written, their bytes), updated here; ``refuse``: the core's refusal;
        ``written(rid)``: told of each dump published (the status file lists the last few)."""
        self.config = config
        self.staging = staging
        self.budget = budget
        self.sglang_version = sglang_version
        self.extra_metadata = dict(extra_metadata)
        self.stats = stats
        self._refuse = refuse
        self._written = written
        self._queue: queue.Queue[DumpJob | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._pending = 0
        self._pending_cond = threading.Condition()

    def start(self, threads: int) -> None:
        for i in range(int(threads)):
            t = threading.Thread(target=self._loop, name=f"hs-dump-writer-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def submit(self, job: DumpJob) -> None:
        """Queue a dump (forward thread): counted as pending until a writer is done with it."""
        with self._pending_cond:
            self._pending += 1
        self._queue.put(job)

    def flush(self, timeout: float) -> bool:
        """Wait until every queued dump is written; False if some are still pending after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._pending_cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._pending_cond.wait(left)
        return True

    def stop(self) -> None:
        """Ask every writer thread to end once the jobs queued before are done (they are not joined)."""
        for _ in self._threads:
            self._queue.put(None)

    def _loop(self) -> None:
        name_os_thread("hs-dump-writer")
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._write(job)
            except Exception as exc:  # never let a writer thread die silently
                logger.exception("hs_dataset capture: writing %s failed", job.rid)
                self.budget.release(job.reserved, 1)
                self._refuse(job.rid, f"{REFUSED_WRITE_FAILED}: {type(exc).__name__}: {exc}")
            finally:
                for p in job.pieces:
                    p.release()
                with self._pending_cond:
                    self._pending -= 1
                    self._pending_cond.notify_all()

    def _write(self, job: DumpJob) -> None:
        """Write one dump: its safetensors header, then each tensor's rows straight from host memory.

        The file is exactly what ``safetensors.torch.save`` made of the same tensors and
        metadata (tests/server_patch/test_staging_writev.py), written with ``os.writev`` from the
        pinned buffers of the request's pieces (one per prefill chunk) -- no
        concatenation, no serialized copy.
        """
        parts = [p.wait() for p in job.pieces]
        tokens = sum(int(p["input_ids"].shape[0]) for p in parts)
        if tokens != job.total:
            raise RuntimeError(f"assembled {tokens} tokens, expected {job.total}")
        encoding = self.config.state_encoding if "aux_scale" in parts[0] else None
        aux0 = parts[0]["aux"]
        columns, shapes = _columns(parts, tokens, encoding is not None)
        entries = [
            (name, from_torch(ts[0].dtype).safetensors, shapes[name], sum(t.numel() * t.element_size() for t in ts))
            for name, ts in columns.items()
        ]
        header, order = dump_header(entries, self._metadata(job, str(aux0.dtype).replace("torch.", ""), encoding))
        buffers = [header] + [host_bytes(t.contiguous()) for name in order for t in columns[name]]  # views keep their tensors alive
        written = self.staging.write_atomic(job.name or job.rid + DUMP_SUFFIX, buffers)
        if written:
            size = len(header) + sum(e[3] for e in entries)
            self.budget.committed(job.reserved, 1)
            self.stats["dumps_written"] += 1
            self.stats["dump_bytes"] += size
            self._written(job.rid)
        else:  # a dump for this rid already exists (the request was prefilled twice): keep the first
            self.budget.release(job.reserved, 1)

    def _metadata(self, job: DumpJob, aux_dtype: str, encoding: str | None) -> dict[str, str]:
        """The dump's ``__metadata__``, in the order the client and the tests read back byte for byte."""
        return {
            "format": DUMP_FORMAT,
            "version": DUMP_VERSION,
            "rid": job.rid,
            "hf_aux_layer_ids": json.dumps(list(self.config.hf_aux_layer_ids)),
            "final_state": "pre_norm",
            "sglang_version": self.sglang_version,
            "dtype": job.state_dtype or aux_dtype,
            "mechanism": self.config.mechanism,
            **({STATE_ENCODING_KEY: encoding} if encoding else {}),
            **self.extra_metadata,
            **job.meta,
        }


def _columns(
    parts: list[Mapping[str, torch.Tensor]], tokens: int, encoded: bool
) -> tuple[dict[str, list[torch.Tensor]], dict[str, tuple[int, ...]]]:
    """Each dump tensor as the rows of every piece in order (no concatenation), and its shape in the file.

    ``encoded``: the pieces hold codes and scales (fp8 or 4-bit), each stored as it is.
    """
    aux0 = parts[0]["aux"]

    def column(name: str, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        # the rows of every piece, in order; a dtype change (rare: int32 ids) costs a host copy
        return [p[name] if dtype is None or p[name].dtype == dtype else p[name].to(dtype) for p in parts]

    names = {"input_ids": "input_ids", "aux_hidden_states": "aux", "final_hidden_state": "final"}
    if "positions" in parts[0]:  # a one-pass piece: each row's position in its request
        names = {"input_ids": "input_ids", "positions": "positions", **{k: v for k, v in names.items() if k != "input_ids"}}
    if encoded:
        names.update({"aux_hidden_states" + SCALE_SUFFIX: "aux_scale", "final_hidden_state" + SCALE_SUFFIX: "final_scale"})
    dtypes = {"input_ids": torch.int64, "positions": torch.int64, "final_hidden_state": None if encoded else aux0.dtype}
    columns = {stored: column(piece, dtypes.get(stored)) for stored, piece in names.items()}
    shapes = {stored: (tokens, *parts[0][piece].shape[1:]) for stored, piece in names.items()}
    return columns, shapes
