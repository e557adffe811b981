"""Open a file for writing, turning "this file system is read-only" into one clear error.

Only commands that write (build, merge, import, export into a directory) come here;
read-only commands (verify, info, export *from* a dataset, push) never create a file
in the dataset directory, not even a lock, so they work on read-only media.
"""

from __future__ import annotations

import errno
import os
import stat

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
            f"{where}: cannot create {os.path.basename(os.fspath(path))} ({_WHY[exc.errno]}, {errno.errorcode[exc.errno]}{_owner(path, where)}); "
            "write to a directory on a writable file system (reading this dataset needs no writes)"
        ) from None


def _owner(path: str | os.PathLike, where: str) -> str:
    """``, the directory belongs to uid N (mode 2755)`` where another user's file or directory refused: a directory shared by users."""
    for name, what in ((path, "the file"), (where, "the directory")):
        try:
            st = os.lstat(name)
        except OSError:
            continue
        if st.st_uid != os.geteuid():
            return f"; {what} belongs to uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}: users who share it need a common group and umask 002"
        return ""
    return ""
