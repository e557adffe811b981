"""Open a file for writing, turning "this file system is read-only" into one clear error.

Only commands that write (build, merge, import, export into a directory) come here;
read-only commands (verify, info, export *from* a dataset, push) never create a file
in the dataset directory, not even a lock, so they work on read-only media.
"""

from __future__ import annotations

import errno
import os

from hs_dataset.errors import ReadOnlyError

__all__ = ["open_for_writing"]

_WHY = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EPERM: "operation not permitted"}


def open_for_writing(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags, mode)``; :class:`ReadOnlyError` naming the directory when it cannot be written."""
    try:
        return os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno not in _WHY:
            raise
        where = os.path.dirname(os.fspath(path)) or "."
        raise ReadOnlyError(
            f"{where}: cannot create {os.path.basename(os.fspath(path))} ({_WHY[exc.errno]}, {errno.errorcode[exc.errno]}); "
            "write to a directory on a writable file system (reading this dataset needs no writes)"
        ) from None
