"""Crash-safe file publication: a file is either absent or complete, never partial.

Pattern: write to a hidden temp file in the *same* directory, fsync it, rename it
over the final name, then fsync the directory so the rename itself is durable.
Temp names start with :data:`TEMP_PREFIX` so a resumed writer can find and remove
the leftovers of a crash; whether one is still being written is told by a lock its
writer holds (``formats/held_temps.py``), never by its times.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from hs_dataset.faults import crash_point
from hs_dataset.formats.writable import open_for_writing

__all__ = [
    "TEMP_PREFIX",
    "atomic_write_bytes",
    "atomic_write_chunks",
    "fsync_dir",
    "is_temp_name",
    "publish",
    "remove_quietly",
    "temp_path_for",
    "temp_writer_pid",
    "write_all",
]

TEMP_PREFIX = ".hs-tmp-"


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
    """Unlink ``path`` (a temp or a file of ours) if it is there.

    A directory under the name is left alone: hs_dataset never makes one under a temp or
    file name it removes, so it is someone else's, and unlinking it raised a bare
    ``IsADirectoryError`` that stopped every reader of a cache holding one.
    """
    try:
        os.unlink(path)
    except (FileNotFoundError, IsADirectoryError):
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
