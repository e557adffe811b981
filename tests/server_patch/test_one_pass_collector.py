"""The one-pass collector: its idea of a quiet server follows the pace of its passes, and every row it is handed
comes out once, in its own request's pieces, within the memory bound (the slot store)."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from hs_dataset.server_patch.budget import StagingBudget
from hs_dataset.server_patch.copier import HostPiece
from hs_dataset.server_patch.one_pass import _MAX_IDLE_S, IDLE_FLUSH_S, IDLE_PASSES, PieceCollector, _Block, _Gone, as_words
from hs_dataset.server_patch.row_record import RECORD, packed


def collector() -> PieceCollector:
    return PieceCollector(budget=None, writer=None, stats={}, refuse=lambda rid, why: None, piece_rows=256,
                          max_held_bytes=1 << 20, max_wait_s=1.0, start_thread=False)  # fmt: skip


def test_a_fast_server_is_quiet_after_the_floor_a_slow_one_after_a_few_of_its_passes():
    fast, slow = collector(), collector()
    assert fast.idle_wait() == IDLE_FLUSH_S  # before any pass
    for k in range(20):
        fast._passed(100.0 + 0.01 * k)  # 10 ms a pass: a GPU decode step
        slow._passed(100.0 + 0.2 * k)  # 200 ms a pass: a CPU server under load
    assert fast.idle_wait() == IDLE_FLUSH_S
    assert abs(slow.idle_wait() - IDLE_PASSES * 0.2) < 1e-6  # not one piece per request per step


def test_however_slow_the_passes_a_quiet_server_writes_within_the_cap():
    c = collector()
    for k in range(5):
        c._passed(100.0 + 30.0 * k)  # a pass every 30 s
    assert c.idle_wait() == _MAX_IDLE_S


# ---------------------------------------------------------------------------- filing rows into pieces

HIDDEN = 4


class Pieces:
    """A writer that keeps every piece (name, rows by tensor) in the order they came."""

    def __init__(self) -> None:
        self.jobs: list = []
        self.lock = threading.Lock()

    def submit(self, job) -> None:
        with self.lock:
            self.jobs.append(job)

    def rows_of(self) -> dict[str, list[tuple[int, int, float]]]:
        """(position, token id, first state value) of every row written, by request, piece after piece."""
        out: dict[str, list[tuple[int, int, float]]] = {}
        for job in self.jobs:
            t = job.pieces[0].wait()
            for pos, tok, val in zip(t["positions"].tolist(), t["input_ids"].tolist(), t["aux"][:, 0, 0].tolist(), strict=True):
                out.setdefault(job.rid, []).append((pos, tok, val))
        return out


def filing(piece_rows: int = 4, held_bytes: int = 1 << 20) -> tuple[PieceCollector, Pieces]:
    writer = Pieces()
    c = PieceCollector(budget=StagingBudget(1 << 40, 1 << 20, lambda: (0, 0)), writer=writer, stats={},
                       refuse=lambda rid, why: None, piece_rows=piece_rows, max_held_bytes=held_bytes,
                       max_wait_s=1.0, start_thread=False)  # fmt: skip
    return c, writer


class ReusedPiece(HostPiece):
    """A pass's host copy whose memory is reused once released (as the pinned pool's is): zeroed on release."""

    def release(self) -> None:
        for t in self._tensors.values():
            t.zero_()
        super().release()


def block(rows: list[tuple[str, int, int]], owners: list | None = None, dtype: torch.dtype = torch.float32) -> _Block:
    """One pass: (rid, first position, rows) per request; each row's token is its position + 1000 * request, its
    state the same value (so a row in the wrong place shows). ``owners``: the owner list to hand over (the forward
    thread hands the same list object for every step of one decode batch); else a new one."""
    made, ids, pos, start = [], [], [], 0
    for rid, first, n in rows:
        made.append((rid, start, n))
        ids += [p + 1000 * int(rid.split("-")[2]) for p in range(first, first + n)]
        pos += list(range(first, first + n))
        start += n
    ids_t = torch.tensor(ids, dtype=torch.int64)
    tensors = {
        "input_ids": ids_t,
        "positions": torch.tensor(pos, dtype=torch.int64),
        "aux": ids_t.to(dtype).view(-1, 1, 1).expand(-1, 3, HIDDEN).contiguous(),
        "final": ids_t.to(dtype).view(-1, 1).expand(-1, HIDDEN).contiguous(),
    }
    columns, record = packed(tensors)
    if owners is not None:
        assert owners == made
    return _Block(ReusedPiece({RECORD: record}), made if owners is None else owners, columns, "float32")


def rid(k: int) -> str:
    return f"hs-t-{k}-g10"


def expected_rows(k: int, positions: range) -> list[tuple[int, int, float]]:
    return [(p, p + 1000 * k, float(p + 1000 * k)) for p in positions]


def test_decode_steps_go_out_as_pieces_of_piece_rows_each_request_its_own_rows_in_order():
    c, writer = filing(piece_rows=4)
    c._handle(block([(rid(k), 0, 10) for k in range(3)]))  # the prompts' prefill: 10 rows each (2 pieces + 2 held)
    for step in range(9):  # then 9 decode steps, one row each, the batch in another order each step
        order = [(k + step) % 3 for k in range(3)]
        c._handle(block([(rid(k), 10 + step, 1) for k in order]))
    c._write_all()
    rows = writer.rows_of()
    for k in range(3):
        assert rows[rid(k)] == expected_rows(k, range(19))
    assert all(len(j.pieces[0].wait()["positions"]) <= 4 for j in writer.jobs)
    assert c.held_bytes == 0 and c.stats["one_pass_rows"] == 57


def test_a_request_gone_from_the_decode_batch_is_written_at_once_the_others_stay_held():
    c, writer = filing(piece_rows=8)
    c._handle(block([(rid(1), 5, 1), (rid(2), 9, 1)]))
    c._handle(_Gone(frozenset({rid(1)})))
    assert [j.rid for j in writer.jobs] == [rid(1)]
    assert c.held_bytes > 0  # rid 2's row
    c._write_all()
    assert writer.rows_of() == {rid(1): expected_rows(1, range(5, 6)), rid(2): expected_rows(2, range(9, 10))}


def test_rows_of_a_refused_request_are_dropped():
    c, writer = filing()
    c.refuse(rid(1), "test")
    c._handle(block([(rid(1), 0, 3), (rid(2), 0, 3)]))
    c._write_all()
    assert set(writer.rows_of()) == {rid(2)}


def test_with_fewer_slots_than_requests_the_fullest_goes_out_and_memory_stays_within_the_bound():
    row_bytes = block([(rid(0), 0, 1)]).columns.row_bytes
    c, writer = filing(piece_rows=4, held_bytes=2 * 4 * row_bytes)  # two slots of 4 rows
    for step in range(6):
        c._handle(block([(rid(k), step, 1) for k in range(5)]))
        assert c.held_bytes <= 2 * 4 * row_bytes
    assert c.stats["one_pass_held_peak_bytes"] <= 2 * 4 * row_bytes
    c._write_all()
    rows = writer.rows_of()
    for k in range(5):
        assert sorted(rows[rid(k)]) == expected_rows(k, range(6))


def test_a_slot_never_holds_more_than_the_bound_even_when_piece_rows_would():
    row_bytes = block([(rid(0), 0, 1)]).columns.row_bytes
    c, writer = filing(piece_rows=256, held_bytes=3 * row_bytes)
    c._handle(block([(rid(0), 0, 10)]))
    assert c.held_bytes <= 3 * row_bytes
    c._write_all()
    assert writer.rows_of()[rid(0)] == expected_rows(0, range(10))
    assert max(len(j.pieces[0].wait()["positions"]) for j in writer.jobs) == 3


def test_a_layout_change_writes_what_is_held_first():
    c, writer = filing(piece_rows=8)
    c._handle(block([(rid(1), 0, 2)]))
    c._handle(block([(rid(2), 0, 2)], dtype=torch.float16))
    assert [j.rid for j in writer.jobs] == [rid(1)]
    c._write_all()
    assert writer.jobs[1].pieces[0].wait()["aux"].dtype == torch.float16


@settings(max_examples=60, deadline=None)
@given(
    piece_rows=st.integers(1, 6),
    slots=st.integers(1, 4),
    passes=st.lists(
        st.lists(st.tuples(st.integers(0, 5), st.integers(1, 14)), min_size=1, max_size=6, unique_by=lambda t: t[0]),
        min_size=1,
        max_size=8,
    ),
    gone=st.lists(st.integers(0, 5), max_size=4),
)
def test_every_row_comes_out_once_in_its_requests_pieces_in_order(piece_rows, slots, passes, gone):
    """Any passes of any requests: the pieces of each request hold exactly its rows, in the order they came."""
    row_bytes = block([(rid(0), 0, 1)]).columns.row_bytes
    c, writer = filing(piece_rows=piece_rows, held_bytes=slots * piece_rows * row_bytes)
    sent: dict[str, list] = {}
    next_pos: dict[int, int] = {}
    for i, rows in enumerate(passes):
        spec = []
        for k, n in rows:
            spec.append((rid(k), next_pos.get(k, 0), n))
            sent.setdefault(rid(k), []).extend(expected_rows(k, range(next_pos.get(k, 0), next_pos.get(k, 0) + n)))
            next_pos[k] = next_pos.get(k, 0) + n
        c._handle(block(spec))
        assert 0 <= c.held_bytes <= slots * piece_rows * row_bytes
        if i < len(gone):
            c._handle(_Gone(frozenset({rid(gone[i])})))
    c._write_all()
    assert c.held_bytes == 0
    got = writer.rows_of()
    assert {r: sorted(v) for r, v in got.items()} == {r: sorted(v) for r, v in sent.items()}
    for r, rows in got.items():  # within a request, pieces in order and each piece's rows in order
        assert [p for p, _, _ in rows] == sorted(p for p, _, _ in rows), r
    assert all(0 < len(j.pieces[0].wait()["positions"]) <= piece_rows for j in writer.jobs)


def decode_batches(c: PieceCollector, batches, refusals, *, same_owners: bool) -> None:
    """Decode steps of a few batches (rids, steps): each batch's steps share one owner list where ``same_owners`` (as
    the forward thread's plan hands them over); the requests a batch drops are gone; ``refusals``: (batch, step, k)."""
    pos: dict[int, int] = {}
    last: set[str] = set()
    for b, (ks, steps) in enumerate(batches):
        rids = {rid(k) for k in ks}
        if last - rids:
            c._handle(_Gone(frozenset(last - rids)))
        last = rids
        owners = [(rid(k), i, 1) for i, k in enumerate(ks)]
        for step in range(steps):
            for k in [k for bb, s, k in refusals if (bb, s) == (b, step)]:
                c.refuse(rid(k), "test")
            c._handle(block([(rid(k), pos.get(k, 0), 1) for k in ks], owners if same_owners else None))
            for k in ks:
                pos[k] = pos.get(k, 0) + 1
    c._write_all()


@settings(max_examples=80, deadline=None)
@given(
    piece_rows=st.integers(1, 6),
    slots=st.integers(1, 7),
    batches=st.lists(
        st.tuples(st.lists(st.integers(0, 6), min_size=1, max_size=5, unique=True), st.integers(1, 15)), min_size=1, max_size=4
    ),
    refusals=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 14), st.integers(0, 6)), max_size=2),
)
@example(piece_rows=2, slots=4, batches=[([0, 1, 2], 2), ([0, 1, 3, 2, 4], 2)], refusals=[])  # fewer slots than requests
def test_a_decode_batch_filed_as_a_run_writes_the_very_pieces_of_filing_request_by_request(piece_rows, slots, batches, refusals):
    """The run (one copy a step while the forward thread hands over the same batch) against filing each request's
    row by itself: each request gets the same rows in the same order; the memory bound holds. Where every batch has
    a slot for each of its requests, the very same pieces. (With fewer slots the fullest is written to free one, and
    which is fullest first can differ: a run takes a slot again as it writes one, not at the next step, so
    requests hold slots in another order. Hypothesis found that case on 2026-12-07; the rows are the same.)"""
    row_bytes = block([(rid(0), 0, 1)]).columns.row_bytes
    bound = slots * piece_rows * row_bytes
    (run, run_writer), (each, each_writer) = filing(piece_rows, bound), filing(piece_rows, bound)
    decode_batches(run, batches, refusals, same_owners=True)
    decode_batches(each, batches, refusals, same_owners=False)
    assert each.stats["one_pass_run_steps"] == 0

    def by_request(writer: Pieces) -> dict[str, list]:
        out: dict[str, list] = {}
        for j in writer.jobs:
            out.setdefault(j.rid, []).append([t.tolist() for t in j.pieces[0].wait().values()])
        return out

    def rows_by_request(writer: Pieces) -> dict[str, list]:
        return {r: [list(itertools.chain(*parts)) for parts in zip(*pieces, strict=True)] for r, pieces in by_request(writer).items()}

    assert rows_by_request(run_writer) == rows_by_request(each_writer)
    if all(len(ks) <= slots for ks, _ in batches):
        assert by_request(run_writer) == by_request(each_writer)
    assert run.stats["one_pass_rows"] == each.stats["one_pass_rows"]
    assert run.stats["one_pass_held_peak_bytes"] <= bound and run.held_bytes == 0


def test_a_steady_decode_batch_is_filed_as_a_run_across_full_slots():
    c, writer = filing(piece_rows=4)
    decode_batches(c, [([0, 1, 2], 11)], [], same_owners=True)
    assert c.stats["one_pass_run_steps"] == 10  # every step after the first (slots written and taken again within the run)
    rows = writer.rows_of()
    assert all(rows[rid(k)] == expected_rows(k, range(11)) for k in range(3))
    assert [len(j.pieces[0].wait()["positions"]) for j in writer.jobs] == [4] * 6 + [3] * 3


@pytest.mark.parametrize("threaded", [False, True])
def test_flush_writes_everything_held(threaded):
    c, writer = filing(piece_rows=64)
    if threaded:
        c = PieceCollector(budget=c.budget, writer=writer, stats={}, refuse=lambda rid, why: None, piece_rows=64,
                           max_held_bytes=1 << 20, max_wait_s=1.0)  # fmt: skip
        b = block([(rid(1), 0, 3)])
        c.take(b.piece, b.owners, b.columns, b.state_dtype)
    else:
        c._handle(block([(rid(1), 0, 3)]))
    assert c.flush(10)
    assert writer.rows_of() == {rid(1): expected_rows(1, range(3))}
    c.close()


@pytest.mark.parametrize(
    ("shape", "dtype", "word"),
    [((5, 3, 8), torch.bfloat16, torch.complex128), ((5,), torch.int64, torch.int64), ((5, 3), torch.bfloat16, torch.int16),
     ((5, 6), torch.uint8, torch.int16), ((4, 7), torch.uint8, torch.uint8)],
)  # fmt: skip
def test_rows_move_as_the_widest_word_that_divides_them_and_keep_their_bytes(shape, dtype, word):
    t = torch.arange(torch.Size(shape).numel()).to(dtype).view(shape)
    words = as_words(t)
    assert words.dtype == word and words.shape[0] == shape[0]
    assert bytes(words.view(torch.uint8).flatten().tolist()) == bytes(t.reshape(shape[0], -1).view(torch.uint8).flatten().tolist())
