"""Crash-safe file publication: a file is either absent or complete, never partial.

Pattern: write to a hidden temp file in the *same* directory, fsync it, rename it
over the final name, then fsync the directory so the rename itself is durable.
Temp names start with :data:`TEMP_PREFIX` so a resumed writer can find and remove
the leftovers of a crash.
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path

from hs_dataset.faults import crash_point
from hs_dataset.formats.writable import open_for_writing

__all__ = [
    "STALE_TEMP_S",
    "TEMP_PREFIX",
    "atomic_write_bytes",
    "atomic_write_chunks",
    "fsync_dir",
    "is_stale_temp",
    "is_temp_name",
    "publish",
    "remove_quietly",
    "temp_path_for",
    "temp_writer_pid",
    "write_all",
]

TEMP_PREFIX = ".hs-tmp-"
STALE_TEMP_S = 120.0  # a temp file nobody wrote to for this long has no working writer behind it, whatever its pid says


def temp_path_for(final: Path) -> Path:
    """A unique hidden temp path next to ``final`` (same filesystem, so rename is atomic)."""
    return final.parent / f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{final.name}"


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def temp_writer_pid(name: str) -> int | None:
    """The pid a temp name says wrote it (:func:`temp_path_for`), or None when the name carries none."""
    if not is_temp_name(name):
        return None
    pid = name[len(TEMP_PREFIX) :].partition("-")[0]
    return int(pid) if pid.isdigit() and len(pid) <= 10 else None


def is_stale_temp(path: Path, *, max_age_s: float = STALE_TEMP_S, now: float | None = None) -> bool:
    """Whether a temp file is a leftover that nobody should wait for.

    A temp file is stale when its name names no live writer (no pid, or a pid no process
    has now) or when it was last written more than ``max_age_s`` ago: a pid can be reused
    by an unrelated process, and a file planted under a live pid's name would otherwise
    be waited on for ever. A missing file is stale too (there is nothing to wait for).
    """
    path = Path(path)
    pid = temp_writer_pid(path.name)
    if pid is None or not _pid_alive(pid):
        return True
    try:
        mtime = os.stat(path, follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return True
    return (time.time() if now is None else now) - mtime > max_age_s


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process; a pid no process can have
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def fsync_dir(directory: Path) -> None:
    """Make a rename/unlink in ``directory`` durable (no-op where directories can't be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems refuse fsync on directories
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def publish(temp: Path, final: Path) -> None:
    """Rename a fully written, fsynced temp file into place and persist the rename."""
    os.replace(temp, final)
    fsync_dir(final.parent)


def remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_all(fd: int, view: memoryview) -> None:
    """os.write until every byte is out (os.write may write less than asked)."""
    while view:
        view = view[os.write(fd, view) :]


def atomic_write_chunks(final: Path, chunks: Iterable[bytes | memoryview], *, crash_at: str, temp: Path | None = None) -> int:
    """Write ``chunks`` to ``final`` atomically and durably; returns the bytes written.

    The crash point ``crash_at`` fires once half of the bytes are in the temp file, so
    fault-injection tests can kill a writer mid-file.
    """
    final = Path(final)
    views = [memoryview(c).cast("B") if not isinstance(c, memoryview) or c.format != "B" else c for c in chunks]
    total = sum(v.nbytes for v in views)
    half = total // 2
    temp = temp or temp_path_for(final)
    fd = open_for_writing(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    written, crashed = 0, False
    try:
        for view in views:
            if not crashed and written + view.nbytes > half:
                cut = half - written
                write_all(fd, view[:cut])
                written += cut
                crash_point(crash_at)
                crashed = True
                view = view[cut:]
            write_all(fd, view)
            written += view.nbytes
        if not crashed:
            crash_point(crash_at)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        remove_quietly(temp)
        raise
    os.close(fd)
    publish(temp, final)
    return total


def atomic_write_bytes(final: Path, data: bytes) -> None:
    """Write ``data`` to ``final`` atomically and durably (the manifest's path)."""
    atomic_write_chunks(final, [data], crash_at="manifest.mid_write")
