"""The regeneration's progress line: conversations done, tokens/s generated and captured, and an ETA from this run's pace."""

from __future__ import annotations

import logging

from hs_dataset.regenerate.progress import RegenerationProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_line_rates_and_eta_count_this_run_s_conversations_only(caplog):
    clock = Clock()
    shown = RegenerationProgress(100, bar=False, log_every_s=60, clock=clock)
    for _ in range(40):  # read back from an earlier run's file: no time, no tokens
        shown.conversation_done(False)
    assert shown.eta_s() is None
    clock.now += 30
    shown.generated(3000)
    for _ in range(10):
        shown.conversation_done(True)
    shown.captured(6000)
    # 50 left at 10 conversations per 30 s
    assert shown.eta_s() == 150
    assert shown.line() == "regenerate: 50/100 conversations (10 this run), 100 tok/s generated, 200 tok/s captured, ETA 2m30s"
    with caplog.at_level(logging.INFO, logger="hs_dataset.regenerate"):
        shown.captured(0)  # 30 s since the start: not yet time for a line
        clock.now += 31
        shown.captured(0)
    assert [r.getMessage() for r in caplog.records] == [shown.line()]


def test_unknown_total_has_no_eta():
    shown = RegenerationProgress(None, bar=False)
    shown.conversation_done(True)
    assert shown.eta_s() is None and "ETA ?" in shown.line() and "1 conversations" in shown.line()
