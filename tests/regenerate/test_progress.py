"""The regeneration's progress line: conversations done, tokens/s generated and captured, and an ETA from this run's pace."""

from __future__ import annotations

import io

from hs_dataset.progress.settings import ProgressSettings
from hs_dataset.regenerate.progress import RegenerationProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_line_rates_and_eta_count_this_run_s_conversations_only():
    clock, out = Clock(), io.StringIO()
    shown = RegenerationProgress(100, ProgressSettings(interval_s=60, stream=out, clock=clock, heartbeat=False))
    for _ in range(40):  # read back from an earlier run's file: no time, no tokens
        shown.conversation_done(False)
    assert shown.task.snapshot().fresh == 0 and shown.line().endswith("ETA ?")
    clock.now += 30
    shown.generated(3000)
    for _ in range(10):
        shown.conversation_done(True)
    shown.captured(6000)
    # 50 left at 10 conversations per 30 s
    expected = "regenerate: 50/100 conversations, 3.0k tokens generated, 100 tok/s, 10 this run, 200 tok/s captured, ETA 2m30s"
    assert shown.line() == expected
    assert out.getvalue().splitlines() == ["regenerate: 0/100 conversations, 0 this run, ETA ?"]  # 30 s: not yet due
    clock.now += 31
    shown.captured(0)
    assert out.getvalue().splitlines()[-1].startswith("regenerate: 50/100 conversations, 3.0k tokens generated, 49 tok/s")
    shown.close()
    assert out.getvalue().splitlines()[-1].endswith("done in 1m01s")


def test_unknown_total_has_no_eta():
    shown = RegenerationProgress(None, None)
    shown.conversation_done(True)
    assert "ETA ?" in shown.line() and "1 conversations" in shown.line()
