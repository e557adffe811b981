"""The status file carries the CPU time of capture's threads and of the process, without counting as a change."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from hs_dataset.libc import name_os_thread
from hs_dataset.server_patch.contract.status import read_statuses
from hs_dataset.server_patch.reporter import StatusReporter, cpu_ms

pytestmark = pytest.mark.unit


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(1000))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread CPU is read from /proc (Linux)")
def test_a_named_capture_threads_cpu_is_reported_and_another_threads_is_not():
    def worker(name: str) -> None:
        name_os_thread(name)
        _burn(0.2)
        done.wait()

    done = threading.Event()
    threads = [threading.Thread(target=worker, args=(n,)) for n in ("hs-test-burn", "not-ours-burn")]
    for t in threads:
        t.start()
    time.sleep(0.3)
    try:
        found = cpu_ms()
    finally:
        done.set()
        for t in threads:
            t.join()
    assert 150 <= found["cpu_ms_hs-test-burn"] <= 2000, found
    assert not any("not-ours" in key for key in found), found
    assert found["cpu_ms_process"] >= found["cpu_ms_hs-test-burn"]


def test_the_cpu_readings_are_counts_and_do_not_rewrite_a_quiet_status(tmp_path):
    stats = {"decode_passes": 3}
    reporter = StatusReporter(str(tmp_path), "dp0", stats, facts={}, identity={})
    reporter.write()
    (status,) = read_statuses(str(tmp_path))
    assert status["counts"]["decode_passes"] == 3
    assert isinstance(status["counts"]["cpu_ms_process"], int), status["counts"]
    first = status["counted_at"]
    _burn(0.05)
    reporter.write()  # nothing but the CPU moved: not rewritten before the heartbeat
    (again,) = read_statuses(str(tmp_path))
    assert again["counted_at"] == first
    stats["decode_passes"] = 4
    reporter.write()
    (after,) = read_statuses(str(tmp_path))
    assert after["counts"]["decode_passes"] == 4 and after["counted_at"] >= first
