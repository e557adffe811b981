"""The one-pass collector's idea of a quiet server follows the pace of its passes."""

from __future__ import annotations

from hs_dataset.server_patch.one_pass import _MAX_IDLE_S, IDLE_FLUSH_S, IDLE_PASSES, PieceCollector


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
