"""The libc bindings (``hs_dataset.libc``) and the shard writer's early writeback built on them."""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import sys
import threading

import pytest

from hs_dataset import libc, open_dataset
from hs_dataset.formats import ShardWriter, shard_file
from hs_dataset.formats.verify import verify_dataset
from tests.fixtures.samples import make_metadata, make_sample

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range and prctl are Linux calls")


def test_each_binding_is_its_own_function_object():
    """Two callers binding one libc name with different C types do not change each other's."""
    as_size = libc.libc_function("strlen", ctypes.c_size_t, ctypes.c_char_p)
    as_byte = libc.libc_function("strlen", ctypes.c_uint8, ctypes.c_char_p)
    text = b"x" * 300
    assert as_size(text) == 300
    assert as_byte(text) == 300 % 256
    assert as_size(text) == 300  # unchanged by the other binding


def test_a_missing_call_is_none_not_an_error():
    assert libc.libc_function("hs_dataset_no_such_libc_call", ctypes.c_int) is None


@linux_only
def test_start_writeback_on_a_file_and_refused_on_a_pipe(tmp_path):
    path = tmp_path / "f.bin"
    data = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
        assert libc.start_writeback(fd, 0, len(data)) is True
        os.fsync(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == data
    read_end, write_end = os.pipe()
    try:
        assert libc.start_writeback(write_end, 0, 4096) is False  # ESPIPE: the caller stops asking
    finally:
        os.close(read_end)
        os.close(write_end)


@linux_only
def test_name_os_thread_is_visible_to_the_os():
    seen: list[str] = []

    def named() -> None:
        libc.name_os_thread("hs-test-thread-name-too-long")
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            seen.append(f.read().strip())

    t = threading.Thread(target=named)
    t.start()
    t.join()
    assert seen == ["hs-test-thread-"]  # the kernel keeps 15 bytes


def _write_with_recorded_writeback(tmp_path, monkeypatch, answer: bool):
    calls: list[tuple[str, int, int]] = []

    def record(fd: int, offset: int, length: int) -> bool:
        calls.append((os.readlink(f"/proc/self/fd/{fd}") if sys.platform.startswith("linux") else str(fd), offset, length))
        return answer

    monkeypatch.setattr(shard_file, "start_writeback", record)
    monkeypatch.setattr(shard_file, "WRITEBACK_BYTES", 2048)
    root = tmp_path / "ds"
    with ShardWriter(root, make_metadata(h=64), shard_bytes=40_000, writer_threads=2) as w:
        w.add_many(make_sample(f"s{i:03d}", 20 + i, h=64) for i in range(24))
    verify_dataset(root)
    assert len(open_dataset(root)) == 24
    shards = json.loads((root / "manifest.json").read_text())["shards"]
    return calls, shards


@linux_only
def test_every_shard_has_its_writeback_started_in_order_and_stays_exact(tmp_path, monkeypatch):
    calls, shards = _write_with_recorded_writeback(tmp_path, monkeypatch, answer=True)
    assert len(shards) > 1
    by_file: dict[str, list[tuple[int, int]]] = {}
    for name, offset, length in calls:
        by_file.setdefault(name, []).append((offset, length))
    size_of = {s["file"]: s["bytes"] for s in shards}
    final_name = {name: os.path.basename(name).split("-", 4)[4] for name in by_file}  # .hs-tmp-{pid}-{hex}-{final}
    assert sorted(final_name.values()) == sorted(size_of)  # one temp file per shard, each asked for
    for name, ranges in by_file.items():
        assert ranges[0][0] == 0
        for (offset, length), (next_offset, _) in itertools.pairwise(ranges):
            assert length >= 2048 and offset + length == next_offset  # contiguous, never re-asked
        assert ranges[-1][0] + ranges[-1][1] <= size_of[final_name[name]]  # never past the file


def test_a_refused_writeback_is_asked_once_per_shard(tmp_path, monkeypatch):
    calls, shards = _write_with_recorded_writeback(tmp_path, monkeypatch, answer=False)
    assert len(calls) == len(shards)  # the writer stopped asking after the refusal, and the shards are still exact
