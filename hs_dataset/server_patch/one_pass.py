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
* a request needs a slot and none is free (then the fullest slot is written: the memory bound).

A pass's rows come as one packed record a row (:mod:`.row_record`: token id, position, states). They are held
in one store allocated once, ``[slots, piece_rows]`` records (:class:`_SlotStore`): each request being held owns
a slot, and a pass's rows go into their requests' slots with one ``index_copy_``; a piece is split back into
its named tensors when written. Why: filing each row by request in Python and joining a piece's rows with
``cat`` cost the scheduler process about 1 ms of Python a decode step at 128 requests
(``benchmarks/bench_one_pass_collector.py``), under the GIL that SGLang's own loop needs; now a step costs one
dictionary lookup per request and a tensor copy.
The slots fill at most ``max_held_bytes``; a request that finds none free first has the fullest slot written.

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
from hs_dataset.server_patch.row_record import RECORD, RecordLayout

__all__ = ["IDLE_FLUSH_S", "STALE_S", "PieceCollector"]

logger = logging.getLogger("hs_dataset.server_patch")

IDLE_FLUSH_S = 0.05  # no pass for this long (at least): every request's rows go out (the client may be waiting for them)
# ...and for this many of the recent intervals between passes: on a server slower than IDLE_FLUSH_S a pass
# (a CPU server under load) a fixed wait wrote every request's rows at every step, one piece per request per
# step, and a test's staging dir filled its 1,024 files with pieces whose conversations were still generating.
IDLE_PASSES = 4
_MAX_IDLE_S = 1.0  # however slow the passes, a quiet server's rows go out within this
STALE_S = 1.0  # no row of a request for this long (waiting, retracted, or done without a decode step): its rows go out
# Requests held at once at most (more: the fullest slot goes out early, as with too little memory). Far above any
# server's running requests; bounds the store's address space where max_held_bytes is set very high.
MAX_SLOTS = 1024
_REFUSED_REMEMBERED = 65536  # refused rids whose later rows are dropped (oldest forgotten first)


@dataclass
class _Block:
    """One pass's rows of one-pass requests, one packed record a row (:mod:`.row_record`), copied to the host as one piece."""

    piece: HostPiece  # its one tensor: RECORD, [rows, columns.row_bytes] bytes
    owners: list[tuple[str, int, int]]  # (rid, first row in the block, rows)
    columns: RecordLayout  # each row's token id, position and states within its record
    state_dtype: str


@dataclass
class _Gone:
    """Requests that left the decode batch: their rows go out now."""

    rids: frozenset[str]


@dataclass
class _Barrier:
    """Everything held goes out, then ``done`` is set (tests, shutdown)."""

    done: threading.Event = field(default_factory=threading.Event)


class _SlotStore:
    """Records of the requests being held: ``[slots, piece_rows, row_bytes]``, one slot per request.

    Allocated at the first pass (``torch.empty``: pages are touched as rows arrive), for one record layout;
    a pass of another layout empties it first. Why records, not a tensor per name: a step's rows are filed
    with one ``index_copy_``, not one per tensor (Python under the GIL SGLang's scheduler needs).
    """

    def __init__(self, columns: RecordLayout, piece_rows: int, max_bytes: int, state_dtype: str) -> None:
        self.columns = columns
        self.row_bytes = columns.row_bytes
        self.piece_rows = max(1, min(piece_rows, max_bytes // self.row_bytes))  # a slot alone never passes the bound
        self.slots = max(1, min(MAX_SLOTS, max_bytes // (self.row_bytes * self.piece_rows)))
        self.state_dtype = state_dtype
        self.records = torch.empty((self.slots, self.piece_rows, self.row_bytes), dtype=torch.uint8)
        self.flat = as_words(self.records.view(-1, self.row_bytes))
        self.fill = [0] * self.slots  # rows held in each slot
        self.free = list(range(self.slots - 1, -1, -1))  # slots with no request (popped from the end: lowest first)

    @property
    def held_bytes(self) -> int:
        return sum(self.fill) * self.row_bytes

    def named(self, records: torch.Tensor) -> dict[str, torch.Tensor]:
        """``records [n, row_bytes]`` as a contiguous copy of each named tensor (a piece for the writer)."""
        return {name: t.clone(memory_format=torch.contiguous_format) for name, t in self.columns.split(records).items()}

    def rows(self, slot: int) -> dict[str, torch.Tensor]:
        """A copy of the rows held in ``slot``, by name (the slot is then free to take others)."""
        return self.named(self.records[slot, : self.fill[slot]])


class _Run:
    """A decode batch filed without a loop over its requests, while it stays the same batch.

    Why: a decode step holds the same requests, in the same order, for many steps in a row (the forward thread hands
    over the same owner list while its plan holds), one row each; each step's rows then go one row further into the
    same slots. Filing them request by request cost the collector's thread about 0.3 ms of Python a step at 128
    requests, under the GIL SGLang's scheduler needs; a run files a step with one ``index_copy_`` and a
    loop of additions. It ends when the owner list changes, a request is refused or one of its slots is freed.
    """

    __slots__ = ("dst", "headroom", "owners", "refusals", "rids", "slots", "steps", "updated")

    def __init__(self, owners: list[tuple[str, int, int]], slots: list[int], store: _SlotStore, refusals: int, now: float) -> None:
        self.owners = owners  # the block's owner list (the forward thread's object: compared by identity)
        self.rids = [rid for rid, _, _ in owners]
        self.slots = slots  # each request's slot, in row order
        self.dst = torch.tensor([slot * store.piece_rows + store.fill[slot] for slot in slots], dtype=torch.int64)
        self.headroom = store.piece_rows - max(store.fill[slot] for slot in slots)  # steps before a slot is full
        self.refusals = refusals
        self.updated = now  # when its requests last had a row (they all have one each step)
        self.steps = 0  # steps filed and not yet added to the slots' fill (:meth:`PieceCollector._settle`)

    @staticmethod
    def fits(owners: list[tuple[str, int, int]]) -> bool:
        """Whether a block is a decode step's: one row per request, request ``i``'s row at ``i``."""
        return all(start == i and rows == 1 for i, (_, start, rows) in enumerate(owners))


# Row copies by index move one element at a time: rows are moved as the widest words that divide them.
_WORDS = (torch.complex128, torch.int64, torch.int32, torch.int16, torch.uint8)


def as_words(t: torch.Tensor) -> torch.Tensor:
    """``t [N, ...]`` (each row contiguous; rows may lie apart, as a record's columns do) as ``[N, W]`` of the widest
    word that divides a row and its start.

    Why: ``index_copy_``/``index_select`` on the host copy element by element, so bfloat16 rows moved as
    16-byte words go about 5x faster (one decode step of 128 Kimi-wide rows: 0.95 ms as bfloat16, 0.18 ms as
    complex128 words, as fast as one plain copy of them).
    """
    rows = t.reshape(t.shape[0], -1)
    if rows.numel() == 0:
        return rows
    if rows.shape[1] == 1 and rows.stride(1) != 1:  # a scalar a row, rows apart: its one-element rows are contiguous
        rows = rows.as_strided(rows.shape, (rows.stride(0), 1))
    raw = rows.view(torch.uint8)
    for word in _WORDS:
        if raw.shape[1] % word.itemsize == 0 and raw.data_ptr() % word.itemsize == 0:
            return raw.view(word)
    return raw


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
        self._queue: queue.Queue[_Block | _Gone | _Barrier | None] = queue.Queue()
        self._store: _SlotStore | None = None
        self._slot_of: dict[str, int] = {}  # the requests whose rows are held, and their slots
        self._updated: dict[str, float] = {}  # when each of them last had a row (a run's requests: see _Run.updated)
        self._run: _Run | None = None  # the decode batch being filed as a run (the collector's thread)
        self._refused: OrderedDict[str, None] = OrderedDict()
        self._refused_lock = threading.Lock()
        self._pieces = itertools.count()  # piece numbers: unique within this process, whatever the rid
        self.refusals = 0  # requests refused so far: a plan made before a refusal is stale (the forward thread's cache)
        self._decoding: set[str] = set()  # forward thread: one-pass rids of the last decode step
        self._extended: set[str] = set()  # forward thread: one-pass rids with prefill rows since that step
        self._last_stale_check = time.monotonic()
        self._last_block = 0.0  # when the last pass's rows came (the collector's thread)
        self._pass_interval = 0.0  # recent time between passes, smoothed
        self._thread: threading.Thread | None = None
        for key in ("one_pass_rows", "one_pass_run_steps", "one_pass_pieces", "one_pass_refused", "one_pass_held_peak_bytes"):
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
            self.refusals += 1
            self.stats["one_pass_refused"] = self.refusals  # the status file's count is this one
            while len(self._refused) > _REFUSED_REMEMBERED:
                self._refused.popitem(last=False)
        self._refuse(rid, reason)

    def take(self, piece: HostPiece, owners: list[tuple[str, int, int]], columns: RecordLayout, state_dtype: str) -> None:
        """A pass's rows of one-pass requests, one record a row (already being copied to ``piece``): filed on the collector's thread."""
        self._queue.put(_Block(piece, owners, columns, state_dtype))

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
                for rid in list(self._slot_of):
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
        """File a block's rows into their requests' slots; the pinned copy goes back at once (its rows are copied out)."""
        try:
            records = block.piece.wait()[RECORD]
            self._ensure_store(block.columns, block.state_dtype)
            self._place(block, records)
        finally:
            block.piece.release()

    def _ensure_store(self, columns: RecordLayout, state_dtype: str) -> None:
        """The store for this record layout (a store of another layout is written out and replaced)."""
        store = self._store
        if store is not None and (store.columns is columns or store.columns == columns) and store.state_dtype == state_dtype:
            return
        self._write_all()
        self._store = _SlotStore(columns, self.piece_rows, self.max_held_bytes, state_dtype)

    @property
    def held_bytes(self) -> int:
        """Bytes of the rows held now, all requests together (within ``max_held_bytes``)."""
        if self._store is None:
            return 0
        pending = self._run.steps * len(self._run.slots) if self._run is not None else 0  # a run's steps not yet settled
        return self._store.held_bytes + pending * self._store.row_bytes

    @property
    def _slots(self) -> _SlotStore:
        """The slot store: made by the first pass filed (:meth:`_ensure_store`), before any path that uses it."""
        if self._store is None:
            raise RuntimeError("hs_dataset capture: one-pass rows used before any pass was filed")
        return self._store

    def _place(self, block: _Block, records: torch.Tensor) -> None:
        """Each owner's rows into its slot: gathered into one ``index_copy_`` (a decode step: one row each)."""
        run = self._run
        if run is not None and block.owners is run.owners and run.refusals == self.refusals:
            self._advance(run, records)
            return
        self._end_run()
        store = self._slots
        per_piece = store.piece_rows
        now = time.monotonic()
        src: list[int] = []
        dst: list[int] = []
        full: list[str] = []
        with self._refused_lock:
            refused = [rid in self._refused for rid, _, _ in block.owners]
        for (rid, start, rows), dropped in zip(block.owners, refused, strict=True):
            if dropped:
                continue
            self._updated[rid] = now
            self.stats["one_pass_rows"] += rows
            slot = self._slot_of.get(rid)
            if slot is None:
                slot = self._take_slot(rid, records, src, dst)
            filled = store.fill[slot]
            if filled + rows > per_piece:  # more rows than the slot has room for (a long prefill): the copies so far land first
                self._copy(records, src, dst)
                src.clear()
                dst.clear()
                self._spill(rid, slot, records, start, rows)
                continue
            base = slot * per_piece + filled
            src.extend(range(start, start + rows))
            dst.extend(range(base, base + rows))
            store.fill[slot] = filled + rows
            if filled + rows == per_piece:
                full.append(rid)
        self._copy(records, src, dst)
        self.stats["one_pass_held_peak_bytes"] = max(self.stats["one_pass_held_peak_bytes"], self.held_bytes)
        for rid in full:
            slot = self._slot_of.get(rid)
            if slot is not None and store.fill[slot] >= per_piece:  # (not written meanwhile to free a slot)
                self._write(rid)
        self._start_run(block, now)

    def _start_run(self, block: _Block, now: float) -> None:
        """File the next steps of this block's decode batch as a run, where every request of it holds a slot with room."""
        slot_of = self._slot_of
        if not block.owners or not _Run.fits(block.owners) or not all(rid in slot_of for rid, _, _ in block.owners):
            return
        with self._refused_lock:
            if any(rid in self._refused for rid, _, _ in block.owners):  # its later rows are dropped: request by request
                return
            refusals = self.refusals
        run = _Run(block.owners, [slot_of[rid] for rid, _, _ in block.owners], self._slots, refusals, now)
        if run.headroom > 0:
            self._run = run

    def _advance(self, run: _Run, records: torch.Tensor) -> None:
        """One more step of the run: each request's row one further into its slot; full slots written and taken again."""
        store = self._slots
        n = len(run.slots)
        store.flat.index_copy_(0, run.dst, as_words(records[:n]))
        run.dst += 1
        run.steps += 1  # the slots' fill is brought up to date when the run ends or is renewed: no loop over them here
        run.headroom -= 1
        run.updated = time.monotonic()
        self.stats["one_pass_rows"] += n
        self.stats["one_pass_run_steps"] += 1
        self.stats["one_pass_held_peak_bytes"] = max(self.stats["one_pass_held_peak_bytes"], self.held_bytes)
        if run.headroom == 0:
            self._renew(run)

    def _renew(self, run: _Run) -> None:
        """The run's full slots written as pieces, each request given a slot again; the run goes on if its slots have room."""
        self._settle(run)
        store = self._slots
        per_piece = store.piece_rows
        full = [i for i, slot in enumerate(run.slots) if store.fill[slot] >= per_piece]
        for i in full:
            self._write(run.rids[i])  # ends the run (a slot freed): it is taken up again below
        self._run = None
        if run.refusals != self.refusals or len(store.free) < len(full):
            return  # (a write refused its request: the next step files request by request)
        dst = run.dst.tolist()
        for i in full:
            slot = store.free.pop()
            self._slot_of[run.rids[i]] = slot
            self._updated[run.rids[i]] = run.updated
            run.slots[i] = slot
            dst[i] = slot * per_piece
        run.dst = torch.tensor(dst, dtype=torch.int64)
        run.headroom = per_piece - max(store.fill[slot] for slot in run.slots)
        if run.refusals == self.refusals and run.headroom > 0:
            self._run = run

    def _settle(self, run: _Run) -> None:
        """Add the run's steps filed since the last settling to its slots' fill."""
        if run.steps:
            fill = self._slots.fill
            for slot in run.slots:
                fill[slot] += run.steps
            run.steps = 0

    def _end_run(self) -> None:
        """No decode batch is filed as a run from now on (its steps are settled first)."""
        if self._run is not None:
            self._settle(self._run)
            self._run = None

    def _take_slot(self, rid: str, records: torch.Tensor, src: list[int], dst: list[int]) -> int:
        """A free slot for ``rid``; with none free the fullest is written first (the pass's copies gathered so far land before)."""
        store = self._slots
        if not store.free:
            self._copy(records, src, dst)
            src.clear()
            dst.clear()
            self._write(max(self._slot_of, key=lambda r: store.fill[self._slot_of[r]]))
        slot = store.free.pop()
        self._slot_of[rid] = slot
        return slot

    def _copy(self, records: torch.Tensor, src: list[int], dst: list[int]) -> None:
        """Rows ``src`` of the pass into the store's flat rows ``dst`` (as words; a slice where either is a run)."""
        if not src:
            return
        n, a, b = len(src), src[0], dst[0]
        rows = as_words(records)
        rows = rows[a : a + n] if src == list(range(a, a + n)) else rows.index_select(0, torch.tensor(src, dtype=torch.int64))
        flat = self._slots.flat
        if dst == list(range(b, b + n)):
            flat[b : b + n].copy_(rows)
        else:
            flat.index_copy_(0, torch.tensor(dst, dtype=torch.int64), rows)

    def _spill(self, rid: str, slot: int, records: torch.Tensor, start: int, rows: int) -> None:
        """More rows of ``rid`` than its slot has room for: the slot topped up and written, whole pieces straight from
        the pass, the rest into a slot."""
        store = self._slots
        per_piece = store.piece_rows
        filled = store.fill[slot]
        if filled:
            take = per_piece - filled
            store.records[slot, filled:per_piece].copy_(records[start : start + take])
            store.fill[slot] = per_piece
            self._write(rid)
            start, rows = start + take, rows - take
        while rows >= per_piece:  # whole pieces, copied out of the pass (its pinned memory goes back once filed)
            self._emit(rid, store.named(records[start : start + per_piece]), per_piece, store.state_dtype)
            start, rows = start + per_piece, rows - per_piece
        if rows and not self.refused(rid):
            held = self._slot_of.get(rid)
            rest = held if held is not None else self._take_slot(rid, records, [], [])
            store.records[rest, :rows].copy_(records[start : start + rows])
            store.fill[rest] = rows
            self._updated[rid] = time.monotonic()
        self.stats["one_pass_held_peak_bytes"] = max(self.stats["one_pass_held_peak_bytes"], self.held_bytes)

    def _write_stale(self) -> None:
        now = time.monotonic()
        if now - self._last_stale_check < STALE_S / 4:
            return
        self._last_stale_check = now
        run = self._run
        if run is not None:  # its requests' times are the run's
            self._updated.update(dict.fromkeys(run.rids, run.updated))
        for rid in [r for r, t in self._updated.items() if now - t > STALE_S]:
            self._write(rid)

    def _write_all(self) -> None:
        for rid in list(self._slot_of):
            self._write(rid)

    def _drop(self, rid: str) -> dict[str, torch.Tensor] | None:
        """Free ``rid``'s slot; a copy of the rows it held (None when it held none)."""
        self._updated.pop(rid, None)
        slot = self._slot_of.pop(rid, None)
        if slot is None:
            return None
        if self._run is not None and slot in self._run.slots:  # the run's slots are no longer all its own
            self._end_run()
        store = self._slots
        rows = store.rows(slot) if store.fill[slot] else None
        store.fill[slot] = 0
        store.free.append(slot)
        return rows

    def _write(self, rid: str) -> None:
        """A request's held rows as its next piece (room reserved first; none in time refuses the request)."""
        rows = self._drop(rid)
        if rows:
            self._emit(rid, rows, next(iter(rows.values())).shape[0], self._slots.state_dtype)

    def _emit(self, rid: str, tensors: dict[str, torch.Tensor], rows: int, state_dtype: str) -> None:
        """``tensors`` (``rows`` rows of ``rid``) to the writer as the request's next piece, room reserved first."""
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if not self.budget.reserve(nbytes, self.max_wait_s, nfiles=1):
            snap = self.budget.snapshot()
            self.refuse(
                rid,
                f"{REFUSED_STAGING_FULL}: {snap['disk_files']} files / {snap['disk_bytes']} bytes waiting and no room for "
                f"a one-pass piece of {rows} rows within {self.max_wait_s} s; the client is not draining pieces fast enough",
            )
            self._drop(rid)
            return
        k = next(self._pieces)
        meta = {"capture_path": ONE_PASS_PATH, "piece": str(k)}
        job = DumpJob(rid=rid, total=rows, pieces=[HostPiece(tensors)], reserved=nbytes, meta=meta, state_dtype=state_dtype)
        job.name = piece_name(rid, k)
        self.stats["one_pass_pieces"] += 1
        self.writer.submit(job)
