"""The advisory lock that says "a process is writing this dataset directory" (``<dir>/.lock``).

Writers and merges take it, so two of them never interleave manifests in one
directory. The lock file is opened with ``O_NOFOLLOW``: a ``.lock`` planted as a
symlink must not make us create or open a file elsewhere.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from hs_dataset.errors import ForeignDatasetError, ReadOnlyError, UnsafePathError
from hs_dataset.formats.writable import open_for_writing

__all__ = ["LOCK_NAME", "acquire_dir_lock", "release_dir_lock"]

LOCK_NAME = ".lock"


def acquire_dir_lock(root: str | os.PathLike) -> int:
    """Take ``root/.lock`` exclusively without waiting; returns the fd to pass to :func:`release_dir_lock`."""
    path = Path(root) / LOCK_NAME
    try:
        fd = open_for_writing(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o644)
    except ReadOnlyError:
        raise
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafePathError(f"{path}: is a symbolic link; remove it (the lock file must be a plain file)") from None
        raise exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ForeignDatasetError(
            f"{root} is being written by another process; wait for it, or give each process its own "
            "output directory (shard_prefix / --rank) and merge afterwards"
        ) from None
    return fd


def release_dir_lock(fd: int) -> None:
    """Drop the lock (closing the fd releases it)."""
    os.close(fd)
