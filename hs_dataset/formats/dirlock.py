"""The advisory lock that says "a process is writing this dataset directory" (``<dir>/.lock``).

Writers and merges take it, so two of them never interleave manifests in one
directory. The lock file is opened with ``O_NOFOLLOW``: a ``.lock`` planted as a
symlink must not make us create or open a file elsewhere.

Shared directories (a group's cache, ``remote/cache.py``): the lock file is created with
mode 0o666 less the umask, like any file a program creates, and an existing one that
this user may not write (another user's, umask 022) is opened read-only: ``flock`` needs
no write access, so two users still exclude each other through the same file. Never
replaced: a new file would be a second lock beside the one another process holds.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from hs_dataset.errors import ForeignDatasetError, ReadOnlyError, UnsafePathError
from hs_dataset.formats.writable import open_for_writing

__all__ = ["LOCK_NAME", "acquire_dir_lock", "open_lock_file", "release_dir_lock"]

LOCK_NAME = ".lock"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def open_lock_file(path: Path) -> int:
    """A descriptor of the lock file ``path`` to ``flock``: created if absent, opened read-only if it is another user's.

    ReadOnlyError where it can be neither created nor opened (the directory or the file
    refuses this user); UnsafePathError for a symbolic link.
    """
    try:
        return open_for_writing(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o666)
    except ReadOnlyError:
        if not os.path.isfile(path) or os.path.islink(path):
            raise
        try:
            return os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)  # someone else's lock file: flock needs no write access
        except PermissionError:
            raise ReadOnlyError(_unreadable(path)) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise UnsafePathError(f"{path}: is a symbolic link; remove it (the lock file must be a plain file)") from None
        raise


def _unreadable(path: Path) -> str:
    st = os.stat(path)
    return (
        f"{path}: the lock file belongs to uid {st.st_uid} (mode {st.st_mode & 0o777:04o}) and this user (uid {os.geteuid()}) may "
        "neither write nor read it; users who share a directory need a common group and umask 002 (or 022: files group-readable)"
    )


def acquire_dir_lock(root: str | os.PathLike) -> int:
    """Take ``root/.lock`` exclusively without waiting; returns the fd to pass to :func:`release_dir_lock`."""
    fd = open_lock_file(Path(root) / LOCK_NAME)
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
