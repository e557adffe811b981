"""A leftover temporary file is one no live writer holds locked, whatever pid its name claims and whatever its times say.

Untrusted input: readers wait on a temporary only while its writer is proven to write it
(HANG: a planted name with a live pid, or a live pid and an mtime a day ahead, made them
wait; LOST: a live writer's file taken for a leftover). Assertion tags: tests/fixtures/tally.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from hs_dataset.formats.atomic import TEMP_PREFIX, temp_path_for
from hs_dataset.formats.held_temps import create_held, is_abandoned

_HOLD = "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"


def test_a_held_temp_is_waited_for_whatever_its_times(tmp_path):
    final = tmp_path / "blake3-abc.safetensors"
    mine = temp_path_for(final)
    fd = create_held(mine)
    try:
        assert not is_abandoned(mine), "LOST: a live writer's temp file was taken for a leftover"
        old = time.time() - 86400
        os.utime(mine, (old, old))
        assert not is_abandoned(mine), "LOST: a slow live writer's day-old temp file was taken for a leftover"
    finally:
        os.close(fd)
    assert is_abandoned(mine), "HANG: a temp its writer let go of is still waited for"


def test_a_temp_under_a_live_pid_with_a_future_mtime_and_no_lock_is_a_leftover(tmp_path):
    planted = tmp_path / f"{TEMP_PREFIX}{os.getpid()}-abcd-blake3-abc.safetensors"
    planted.write_bytes(b"x")
    ahead = time.time() + 86400
    os.utime(planted, (ahead, ahead))
    assert is_abandoned(planted), "HANG: a live pid and an mtime a day ahead made readers wait until the clock caught up"


def test_a_temp_held_by_another_live_process_is_waited_for_until_it_ends(tmp_path):
    path = tmp_path / "blake3-abc.safetensors"
    temp = tmp_path / f"{TEMP_PREFIX}0-x-{path.name}"
    temp.write_bytes(b"x")
    child = subprocess.Popen([sys.executable, "-c", _HOLD, str(temp)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        named = tmp_path / f"{TEMP_PREFIX}{child.pid}-x-{path.name}"
        os.rename(temp, named)
        assert not is_abandoned(named), "LOST: another process's download in flight was taken for a leftover"
    finally:
        child.communicate("")
    assert is_abandoned(named), "HANG: the temp of a writer that exited is still waited for"


def test_names_without_a_live_pid_are_leftovers_even_when_held(tmp_path):
    final = tmp_path / "blake3-abc.safetensors"
    dead = tmp_path / f"{TEMP_PREFIX}{2**22 + 12345}-abcd-{final.name}"  # above any pid_max: no such process
    fd = create_held(dead)  # a lock held by someone else than the pid the name gives
    try:
        assert is_abandoned(dead)
    finally:
        os.close(fd)
    for name in (f"{TEMP_PREFIX}notapid-{final.name}", f"{TEMP_PREFIX}{'9' * 40}-x-{final.name}", f"{TEMP_PREFIX}0-x-{final.name}"):
        (tmp_path / name).write_bytes(b"x")
        assert is_abandoned(tmp_path / name), name
    assert is_abandoned(tmp_path / f"{TEMP_PREFIX}{os.getpid()}-gone-{final.name}"), "a temp file that is gone is nothing to wait for"
    fifo = tmp_path / f"{TEMP_PREFIX}{os.getpid()}-fifo-{final.name}"
    os.mkfifo(fifo)
    assert is_abandoned(fifo), "a FIFO under a temp name is nobody's download"
