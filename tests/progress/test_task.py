"""A task's progress: a plain line at the interval (fake clock, no sleeping), a final line, a bar only on a terminal."""

from __future__ import annotations

import io

from hs_dataset.progress.settings import ProgressSettings, active, interval_from_env, showing
from hs_dataset.progress.task import Task, task


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def settings(clock: Clock, out: io.StringIO, interval_s: float = 30.0) -> ProgressSettings:
    return ProgressSettings(interval_s=interval_s, stream=out, clock=clock, heartbeat=False)


def lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_a_line_at_the_start_then_one_per_interval_then_the_final_one():
    clock, out = Clock(), io.StringIO()
    shown = Task("verify", "shards", 4, settings=settings(clock, out), verb="read")
    assert lines(out) == ["verify: 0/4 shards, ETA ?"]
    clock.now += 10
    shown.advance(tokens=100, nbytes=2048)
    assert len(lines(out)) == 1  # not yet 30 s
    clock.now += 20
    shown.advance(tokens=100, nbytes=2048)
    assert lines(out)[-1] == "verify: 2/4 shards, 200 tokens, 7 tok/s, 4.0 KiB read, ETA 30s"
    clock.now += 1
    shown.advance(tokens=100, nbytes=2048)
    assert len(lines(out)) == 2
    shown.close()
    shown.close()  # idempotent
    assert lines(out)[-1] == "verify: 3/4 shards, 300 tokens, 10 tok/s, 6.0 KiB read, done in 31s"
    assert len(lines(out)) == 3
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_interval_zero_writes_only_the_final_line():
    clock, out = Clock(), io.StringIO()
    shown = Task("export", "samples", 2, settings=settings(clock, out, interval_s=0))
    for _ in range(2):
        clock.now += 1000
        shown.advance(tokens=5)
    shown.close()
    assert lines(out) == ["export: 2/2 samples, 10 tokens, 0 tok/s, done in 33m20s"]


def test_sizes_show_the_open_shard_and_items_found_done_are_untimed():
    clock, out = Clock(), io.StringIO()
    held = {"written": 0, "open": 3 * 2**20}
    shown = Task("build", "samples", 10, settings=settings(clock, out, 1), sizes=lambda: (held["written"] + held["open"], held["open"]))
    shown.advance(5, fresh=False)  # stored by an earlier run
    clock.now += 2
    shown.advance(tokens=50)
    assert lines(out)[-1] == "build: 6/10 samples, 50 tokens, 25 tok/s, 3.0 MiB written (open shard 3.0 MiB), ETA 8s"


def test_track_counts_each_item_after_its_body_and_a_loop_left_early_is_stopped():
    clock, out = Clock(), io.StringIO()
    shown = Task("merge", "shards", 3, settings=settings(clock, out, 0), verb="linked")
    for item in shown.track([1, 2, 3], tokens=lambda i: i, nbytes=lambda i: 1024):
        assert shown.done == item - 1
        if item == 2:
            break
    assert lines(out) == ["merge: 1/3 shards, 1 tokens, 1.0 KiB linked, stopped after 0s"]


def test_track_to_the_end_closes_with_the_final_line():
    clock, out = Clock(), io.StringIO()
    shown = Task("push", "commits", 2, settings=settings(clock, out, 0), verb="uploaded")
    assert list(shown.track(["a", "b"], nbytes=lambda _: 2**20)) == ["a", "b"]
    assert lines(out) == ["push: 2/2 commits, 2.0 MiB uploaded, done in 0s"]


def test_without_settings_a_task_counts_and_shows_nothing(capsys):
    assert active() is None
    shown = task("verify", "shards", 2)
    shown.advance(2, tokens=4)
    shown.close()
    assert shown.done == 2 and capsys.readouterr() == ("", "")


def test_showing_sets_the_settings_for_tasks_opened_inside_and_restores_them():
    clock, out = Clock(), io.StringIO()
    with showing(settings(clock, out, 0)):
        task("verify", "shards", 1).close()
    assert active() is None
    assert lines(out) == ["verify: 0/1 shards, done in 0s"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_only_on_a_terminal():
    assert ProgressSettings(stream=Terminal()).wants_bar()
    assert not ProgressSettings(stream=io.StringIO()).wants_bar()
    clock, out = Clock(), Terminal()
    shown = Task("build", "samples", 2, settings=ProgressSettings(stream=out, clock=clock, heartbeat=False))
    clock.now += 1
    shown.advance(tokens=10)
    shown.close()
    assert "build" in out.getvalue() and "2/2" not in out.getvalue().splitlines()[0]  # tqdm's bar, redrawn with \r
    assert "\r" in out.getvalue()


def test_the_interval_comes_from_the_environment(monkeypatch):
    import pytest

    from hs_dataset.errors import UsageError

    monkeypatch.setenv("HS_DATASET_PROGRESS_INTERVAL", "5")
    assert interval_from_env() == 5.0
    monkeypatch.setenv("HS_DATASET_PROGRESS_INTERVAL", "soon")
    with pytest.raises(UsageError, match="HS_DATASET_PROGRESS_INTERVAL"):
        interval_from_env()
    monkeypatch.delenv("HS_DATASET_PROGRESS_INTERVAL")
    assert interval_from_env() == 30.0
