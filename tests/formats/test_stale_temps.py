"""A leftover temporary file is stale when its writer is gone or it stopped growing, whatever pid its name claims.

Untrusted input: readers wait on a temporary only while it may still be written (HANG:
a planted name with a live pid made them wait for ever; LOST: a live writer's file taken
for a leftover). Assertion tags: tests/fixtures/tally.py.
"""

from __future__ import annotations

import os
import time

from hs_dataset.formats.atomic import TEMP_PREFIX, is_stale_temp, temp_path_for


def test_a_temp_file_is_stale_when_its_writer_is_gone_or_it_stopped_growing(tmp_path):
    """A leftover ``.hs-tmp-<live pid>`` made readers wait for ever: age bounds the wait whatever the pid says."""
    final = tmp_path / "blake3-abc.safetensors"
    mine = temp_path_for(final)
    mine.write_bytes(b"x")
    assert not is_stale_temp(mine), "LOST: a live writer's fresh temp file was taken for a leftover"
    old = time.time() - 3600
    os.utime(mine, (old, old))
    assert is_stale_temp(mine), "HANG: an hour-old temp file under a live pid would be waited on for ever"
    assert is_stale_temp(mine, max_age_s=7200) is False
    dead = tmp_path / f"{TEMP_PREFIX}{2**22 + 12345}-abcd-{final.name}"  # above any pid_max: no such process
    dead.write_bytes(b"x")
    assert is_stale_temp(dead)
    for name in (f"{TEMP_PREFIX}notapid-{final.name}", f"{TEMP_PREFIX}{'9' * 40}-x-{final.name}", f"{TEMP_PREFIX}0-x-{final.name}"):
        (tmp_path / name).write_bytes(b"x")
        assert is_stale_temp(tmp_path / name), name
    assert is_stale_temp(tmp_path / f"{TEMP_PREFIX}{os.getpid()}-gone-{final.name}"), "a temp file that is gone is nothing to wait for"
