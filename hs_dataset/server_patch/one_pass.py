"""One-pass capture on the server: every row a one-pass request's passes compute, written as pieces.

A one-pass request (:func:`~hs_dataset.server_patch.contract.rid.is_one_pass`) is a generation whose
states are kept while the server generates it: its prompt's prefill rows (after any prefix-cache hit,
in chunks or not), then one row per decode step. The forward thread hands each pass's rows of such
requests over as one host copy (:meth:`PieceCollector.take`) and goes on. The collector's thread
waits for the copy, files each row under its request, and writes a request's rows as one piece
(``{rid}.{k}.safetensors``, :func:`~hs_dataset.server_patch.contract.dump.piece_name`, with each
row's position) when

* they reach ``piece_rows`` (a long answer goes out in pieces, so its rows are never all held),
* the request is gone from a decode step (finished; or retracted -- a later piece continues it),
* nothing arrived for a few passes' time (``IDLE_PASSES`` times the recent interval between passes,
  at least ``IDLE_FLUSH_S``: a quiet server, a prefill-only request), or no row of the request for ``STALE_S``,
* the rows held by all requests reach ``max_held_bytes`` (then all are written: the memory bound).

A piece reserves its staging room first (the same budget as dumps); none within ``max_wait_s`` refuses
the request with a marker, and its later rows are dropped: the client then captures that conversation
by prefill. The client, not the server, decides when a request's rows are complete (it knows how many
tokens the server generated), so nothing here waits for a request to end.

Runs inside SGLang scheduler processes: stdlib, torch and this package only.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from hs_dataset.libc import name_os_thread
from hs_dataset.server_patch.budget import StagingBudget
from hs_dataset.server_patch.contract.dump import ONE_PASS_PATH, REFUSED_STAGING_FULL, piece_name
from hs_dataset.server_patch.copier import HostPiece
from hs_dataset.server_patch.dump_writer import DumpJob, DumpWriter

__all__ = ["IDLE_FLUSH_S", "STALE_S", "PieceCollector"]

logger = logging.getLogger("hs_dataset.server_patch")

IDLE_FLUSH_S = 0.05  # no pass for this long (at least): every request's rows go out (the client may be waiting for them)
# ...and for this many of the recent intervals between passes: on a server slower than IDLE_FLUSH_S a pass
# (a CPU server under load) a fixed wait wrote every request's rows at every step, one piece per request per
# step, and a test's staging dir filled its 1,024 files with pieces whose conversations were still generating.
IDLE_PASSES = 4
_MAX_IDLE_S = 1.0  # however slow the passes, a quiet server's rows go out within this
STALE_S = 1.0  # no row of a request for this long (waiting, retracted, or done without a decode step): its rows go out
_REFUSED_REMEMBERED = 65536  # refused rids whose later rows are dropped (oldest forgotten first)


@dataclass
class _Block:
    """One pass's rows of one-pass requests, copied to the host as one piece."""

    piece: HostPiece
    owners: list[tuple[str, int, int]]  # (rid, first row in the block, rows)
    row_bytes: int  # bytes of one row's states, ids and position
    state_dtype: str


@dataclass
class _Gone:
    """Requests that left the decode batch: their rows go out now."""

    rids: frozenset[str]


@dataclass
class _Barrier:
    """Everything held goes out, then ``done`` is set (tests, shutdown)."""

    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Held:
    """One request's rows waiting to be written: views into the host blocks they came in."""

    parts: list[tuple[dict[str, torch.Tensor], int, int]] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0
    updated: float = 0.0
    state_dtype: str = ""


class PieceCollector:
    """Files one-pass rows by request and writes them as pieces; see the module docstring."""

    def __init__(
        self,
        *,
        budget: StagingBudget,
        writer: DumpWriter,
        stats: dict,
        refuse: Callable[[str, str], None],
        piece_rows: int,
        max_held_bytes: int,
        max_wait_s: float,
        start_thread: bool = True,
    ) -> None:
        """``refuse(rid, reason)``: the core's refusal (marker, log, stats)."""
        self.budget = budget
        self.writer = writer
        self.stats = stats
        self._refuse = refuse
        self.piece_rows = int(piece_rows)
        self.max_held_bytes = int(max_held_bytes)
        self.max_wait_s = float(max_wait_s)
        self.held_bytes = 0
        self._queue: queue.Queue[_Block | _Gone | _Barrier | None] = queue.Queue()
        self._held: dict[str, _Held] = {}
        self._refused: OrderedDict[str, None] = OrderedDict()
        self._refused_lock = threading.Lock()
        self._pieces = itertools.count()  # piece numbers: unique within this process, whatever the rid
        self._decoding: set[str] = set()  # forward thread: one-pass rids of the last decode step
        self._extended: set[str] = set()  # forward thread: one-pass rids with prefill rows since that step
        self._last_stale_check = time.monotonic()
        self._last_block = 0.0  # when the last pass's rows came (the collector's thread)
        self._pass_interval = 0.0  # recent time between passes, smoothed
        self._thread: threading.Thread | None = None
        for key in ("one_pass_rows", "one_pass_pieces", "one_pass_refused", "one_pass_held_peak_bytes"):
            stats.setdefault(key, 0)
        if start_thread:
            self._thread = threading.Thread(target=self._loop, name="hs-one-pass", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ forward thread
    def refused(self, rid: str) -> bool:
        with self._refused_lock:
            return rid in self._refused

    def refuse(self, rid: str, reason: str) -> None:
        """Refuse ``rid`` once (its marker) and drop its later rows."""
        with self._refused_lock:
            if rid in self._refused:
                return
            self._refused[rid] = None
            while len(self._refused) > _REFUSED_REMEMBERED:
                self._refused.popitem(last=False)
        self.stats["one_pass_refused"] += 1
        self._refuse(rid, reason)

    def take(self, piece: HostPiece, owners: list[tuple[str, int, int]], row_bytes: int, state_dtype: str) -> None:
        """A pass's rows of one-pass requests (already being copied to ``piece``): filed on the collector's thread."""
        self._queue.put(_Block(piece, owners, row_bytes, state_dtype))

    def extended(self, rids: Iterable[str]) -> None:
        """One-pass rids that had prefill rows in a pass (gone if the next decode step lacks them)."""
        self._extended.update(rids)

    def decode_step(self, rids: Iterable[str]) -> None:
        """The one-pass rids of a decode step; those of the last step (or prefilled since) not in it are gone."""
        now = set(rids)
        gone = (self._decoding | self._extended) - now
        self._decoding, self._extended = now, set()
        if gone:
            self._queue.put(_Gone(frozenset(gone)))

    def flush(self, timeout: float) -> bool:
        """Write every row held now; False if that did not finish within ``timeout``."""
        if self._thread is None:
            self._write_all()
            return True
        barrier = _Barrier()
        self._queue.put(barrier)
        return barrier.done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is held and stop the thread (before the writer's flush: the pieces go through it)."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        self._thread = None

    # ------------------------------------------------------------------ the collector's thread
    def _loop(self) -> None:
        name_os_thread("hs-one-pass")
        while True:
            try:
                item = self._queue.get(timeout=self.idle_wait())
            except queue.Empty:
                self._write_all()
                continue
            try:
                if item is None:
                    self._write_all()
                    return
                self._handle(item)
                self._write_stale()
            except Exception:  # never let the thread die: the requests it held are refused instead
                logger.exception("hs_dataset capture: one-pass rows could not be filed")
                for rid in list(self._held):
                    self._drop(rid)
                    self.refuse(rid, "the server could not file this request's rows (see its log)")

    def idle_wait(self) -> float:
        """How long no pass means a quiet server: a few recent pass intervals, at least ``IDLE_FLUSH_S``."""
        return min(_MAX_IDLE_S, max(IDLE_FLUSH_S, IDLE_PASSES * self._pass_interval))

    def _passed(self, now: float) -> None:
        """A pass's rows came at ``now``: the smoothed interval between passes follows."""
        if self._last_block:
            gap = min(now - self._last_block, _MAX_IDLE_S)
            self._pass_interval = gap if not self._pass_interval else 0.8 * self._pass_interval + 0.2 * gap
        self._last_block = now

    def _handle(self, item: _Block | _Gone | _Barrier) -> None:
        if isinstance(item, _Block):
            self._passed(time.monotonic())
            self._file(item)
        elif isinstance(item, _Gone):
            for rid in item.rids:
                self._write(rid)
        else:
            self._write_all()
            item.done.set()

    def _file(self, block: _Block) -> None:
        """File a block's rows under their requests; the pinned copy goes back at once (its rows live in plain memory)."""
        try:
            tensors = {name: t.clone() for name, t in block.piece.wait().items()}
        finally:
            block.piece.release()
        now = time.monotonic()
        for rid, start, rows in block.owners:
            if self.refused(rid):
                continue
            held = self._held.get(rid)
            if held is None:
                held = self._held[rid] = _Held(state_dtype=block.state_dtype)
            held.parts.append((tensors, start, rows))
            held.rows += rows
            held.nbytes += rows * block.row_bytes
            held.updated = now
            self.held_bytes += rows * block.row_bytes
            self.stats["one_pass_rows"] += rows
            if held.rows >= self.piece_rows:
                self._write(rid)
        self.stats["one_pass_held_peak_bytes"] = max(self.stats["one_pass_held_peak_bytes"], self.held_bytes)
        if self.held_bytes > self.max_held_bytes:
            self._write_all()

    def _write_stale(self) -> None:
        now = time.monotonic()
        if now - self._last_stale_check < STALE_S / 4:
            return
        self._last_stale_check = now
        for rid in [r for r, h in self._held.items() if now - h.updated > STALE_S]:
            self._write(rid)

    def _write_all(self) -> None:
        for rid in list(self._held):
            self._write(rid)

    def _drop(self, rid: str) -> _Held | None:
        held = self._held.pop(rid, None)
        if held is not None:
            self.held_bytes -= held.nbytes
        return held

    def _write(self, rid: str) -> None:
        """A request's held rows as its next piece (room reserved first; none in time refuses the request)."""
        held = self._drop(rid)
        if held is None or not held.rows:
            return
        names = held.parts[0][0].keys()
        tensors = {name: torch.cat([part[name][start : start + rows] for part, start, rows in held.parts]) for name in names}
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if not self.budget.reserve(nbytes, self.max_wait_s, nfiles=1):
            snap = self.budget.snapshot()
            self.refuse(
                rid,
                f"{REFUSED_STAGING_FULL}: {snap['disk_files']} files / {snap['disk_bytes']} bytes waiting and no room for "
                f"a one-pass piece of {held.rows} rows within {self.max_wait_s} s; the client is not draining pieces fast enough",
            )
            return
        k = next(self._pieces)
        meta = {"capture_path": ONE_PASS_PATH, "piece": str(k)}
        job = DumpJob(rid=rid, total=held.rows, pieces=[HostPiece(tensors)], reserved=nbytes, meta=meta, state_dtype=held.state_dtype)
        job.name = piece_name(rid, k)
        self.stats["one_pass_pieces"] += 1
        self.writer.submit(job)
