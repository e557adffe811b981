"""The status file carries the CPU time of capture's threads and of the process, without counting as a change."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from hs_dataset.libc import name_os_thread
from hs_dataset.server_patch.contract.status import read_statuses
from hs_dataset.server_patch.reporter import StatusReporter, ThreadCpu

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
        found = ThreadCpu().read()
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread CPU is read from /proc (Linux)")
def test_names_are_read_once_per_thread_and_a_thread_named_later_is_counted_after_the_refresh(monkeypatch):
    import hs_dataset.server_patch.reporter as reporter

    name_reads: list[str] = []
    read_name = reporter._capture_thread_name
    me = threading.get_ident()  # the reporters other tests left running read names through the same function

    def counted(task: str) -> str | None:
        if threading.get_ident() == me:
            name_reads.append(task)
        return read_name(task)

    monkeypatch.setattr(reporter, "_capture_thread_name", counted)
    named, done = threading.Event(), threading.Event()
    started = threading.Event()

    def worker() -> None:
        started.set()
        named.wait()
        name_os_thread("hs-test-late")
        _burn(0.1)
        done.wait()

    thread = threading.Thread(target=worker)
    thread.start()
    started.wait()
    try:
        cpu = reporter.ThreadCpu(refresh_s=3600)
        first = cpu.read()
        reads_first = len(name_reads)
        assert reads_first >= 2 and not any("hs-test-late" in k for k in first)  # this thread and the worker, at least
        named.set()
        time.sleep(0.3)
        cpu.read()
        assert len(name_reads) == reads_first  # no name read again before the refresh
        cpu._read_at = float("-inf")  # the refresh is due
        later = cpu.read()
        assert 50 <= later["cpu_ms_hs-test-late"] <= 2000, later
    finally:
        named.set()
        done.set()
        thread.join()
