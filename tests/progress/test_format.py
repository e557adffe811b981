"""The plain progress line: readable in a SLURM log, the ETA from this run's pace only."""

from __future__ import annotations

import pytest

from hs_dataset.progress.format import Snapshot, count, duration, eta_s, line, size


def snap(**changes) -> Snapshot:
    base = {"name": "build", "unit": "samples", "done": 413, "total": 1000, "fresh": 413, "tokens": 1_234_567, "elapsed_s": 232.0}
    return Snapshot(**{**base, **changes})


@pytest.mark.parametrize(("n", "text"), [(0, "0"), (950, "950"), (12_345, "12.3k"), (1_234_567, "1.2M"), (3_400_000_000, "3.4G")])
def test_counts_are_short(n, text):
    assert count(n) == text


@pytest.mark.parametrize(
    ("n", "text"), [(512, "512 B"), (3 * 1024, "3.0 KiB"), (int(812.4 * 2**20), "812.4 MiB"), (int(1.25 * 2**30), "1.25 GiB")]
)
def test_sizes_in_binary_units(n, text):
    assert size(n) == text


@pytest.mark.parametrize(("s", "text"), [(0, "0s"), (59.9, "59s"), (250, "4m10s"), (3900, "1h05m")])
def test_durations(s, text):
    assert duration(s) == text


def test_the_line_has_count_tokens_rate_bytes_with_the_open_shard_and_eta():
    text = line(snap(written=int(812.4 * 2**20), open_bytes=int(96.1 * 2**20)))
    # 587 left at 413 per 232 s
    assert text == "build: 413/1000 samples, 1.2M tokens, 5,321 tok/s, 812.4 MiB written (open shard 96.1 MiB), ETA 5m29s"
    assert "\r" not in text and "\x1b" not in text and "\n" not in text


def test_items_found_done_take_no_time_in_the_eta():
    resumed = snap(done=500, fresh=100, elapsed_s=60.0)  # 400 were stored by an earlier run
    assert eta_s(resumed) == 500 * 60.0 / 100


def test_unknown_total_or_nothing_done_this_run_has_no_eta():
    assert eta_s(snap(total=None)) is None and line(snap(total=None)).endswith("ETA ?")
    assert "413 samples," in line(snap(total=None))
    assert eta_s(snap(fresh=0)) is None


def test_the_final_line_says_how_long_and_a_failed_one_when_it_stopped():
    assert line(snap(done=1000), final=True).endswith(", done in 3m52s")
    assert line(snap(), stopped=True).endswith(", stopped after 3m52s")


def test_parts_with_nothing_to_say_are_left_out():
    assert line(snap(tokens=0)) == "build: 413/1000 samples, ETA 5m29s"
    assert line(snap(tokens=0, written=0, verb="read")) == "build: 413/1000 samples, 0 B read, ETA 5m29s"
    assert line(snap(tokens=0, detail=("7 this run",))) == "build: 413/1000 samples, 7 this run, ETA 5m29s"
