"""The remote cache's directory and the OS: its refusals as one named line, and the modes of what it creates.

Why the refusals: a cache directory on a read-only mount (or one the user may not write), or on a full
disk, surfaced as a raw ``OSError`` from ``open_dataset(URL)`` and ``follow_dataset``
(``[Errno 30] Read-only file system: '...'``), saying neither that the *cache* was the
problem nor that another ``cache_dir`` (or freeing space) fixes it. Every write the
cache makes (creating the directory, its lock and index, reserving and receiving a
download, placing it) runs under :func:`cache_writes`. Where the file refused is another
user's (a cache two users share), the line names its owner and mode, and the umask that fixes it.

Modes (a cache shared by a group, e.g. ``/data/cache`` of mode 2775): the cache honours
the umask of the process that creates a file. Files (lock, index, download temps, side
files) are created 0o666 less the umask; a placed shard loses its write bits only, so
it is never readable by more users than the umask allowed. Directories the cache
creates inside its root (``meta/<dataset id>``) get 0o777 less the umask, plus the
root's group bits where the root is group-writable: whoever made the root shared with a
group meant its parts for that group too (a setgid root passes its group down, the
kernel does that). Users of one cache need a common group and a umask that leaves the
group read (022) or read and write (002). With 022, another user's lock and index are
not writable: the lock is taken through a read-only descriptor and the index is replaced
by rename (``remote/cache.py``), both needing only the directory's write permission.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hs_dataset.errors import DiskFullError, HsDatasetError, ReadOnlyError

__all__ = ["cache_writes", "make_subdirs", "read_only", "without_write_bits"]

_READ_ONLY = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EPERM: "operation not permitted"}
_FULL = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded"}
_SHARE_FIX = (
    "users who share a cache_dir need a common group and umask 002 (022 lets them read but not remove each other's files); "
    "or give each user their own cache_dir (HS_DATASET_CACHE_DIR)"
)


@contextmanager
def cache_writes(directory: Path) -> Iterator[None]:
    """Run the cache's writes to ``directory``: a read-only or full directory is a ReadOnlyError or DiskFullError naming it."""
    try:
        yield
    except ReadOnlyError as exc:  # open_for_writing's, worded for a dataset directory: say the cache's fix instead
        cause = exc.__context__
        if not isinstance(cause, OSError):
            raise  # already worded for the cache (the lock file's, another user's unreadable file)
        raise read_only(directory, cause.errno or errno.EROFS, cause) from None
    except HsDatasetError:
        raise
    except OSError as exc:
        if exc.errno in _READ_ONLY:
            raise read_only(directory, exc.errno, exc) from None
        if exc.errno in _FULL:
            raise DiskFullError(
                f"{directory}: cannot write the remote cache ({_FULL[exc.errno]}, {errno.errorcode[exc.errno]}); "
                "free space there, lower max_cache_bytes (HS_DATASET_CACHE_BYTES), or give another cache_dir (HS_DATASET_CACHE_DIR)"
            ) from None
        raise


def read_only(directory: Path, code: int, exc: OSError | None = None) -> ReadOnlyError:
    """The one line for a cache directory that cannot be written (naming another user's file where one refused)."""
    why = _READ_ONLY.get(code, "cannot be written")
    owned = _another_users_file(exc)
    if owned is not None:
        path, st = owned
        return ReadOnlyError(
            f"{path}: the remote cache's file belongs to uid {st.st_uid} (mode {stat.S_IMODE(st.st_mode):04o}) and this user "
            f"(uid {os.geteuid()}) is refused ({why}, {errno.errorcode.get(code, code)}); {_SHARE_FIX}"
        )
    return ReadOnlyError(
        f"{directory}: cannot write the remote cache ({why}, {errno.errorcode.get(code, code)}); "
        "give a cache_dir on a writable file system (or set HS_DATASET_CACHE_DIR)"
    )


def _another_users_file(exc: OSError | None) -> tuple[str, os.stat_result] | None:
    """The file an OSError names that exists and belongs to another user (a shared cache), or None."""
    for name in (getattr(exc, "filename", None), getattr(exc, "filename2", None)):
        if not isinstance(name, (str, bytes, os.PathLike)):
            continue
        try:
            st = os.lstat(name)
        except OSError:
            continue
        if st.st_uid != os.geteuid():
            return os.fsdecode(name), st
    return None


def without_write_bits(path: Path, st: os.stat_result) -> None:
    """Make a placed file read-only, no more readable than it was (the umask's choice stays)."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o222:
        os.chmod(path, mode & ~0o222)


def make_subdirs(root: Path, path: Path) -> None:
    """``path`` and its missing parents below ``root``: umask modes, plus the root's group bits if the root is group-writable."""
    group = stat.S_IMODE(os.stat(root).st_mode) & 0o070
    missing = []
    for part in (path, *path.parents):
        if part == root or os.path.isdir(part):
            break
        missing.append(part)
    for part in reversed(missing):
        try:
            os.mkdir(part, 0o777)
        except FileExistsError:
            continue  # another process made it meanwhile
        if group & stat.S_IWGRP:
            mode = stat.S_IMODE(os.stat(part).st_mode)
            if mode & 0o070 != group:
                os.chmod(part, mode | group)
