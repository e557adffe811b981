"""Opening a file of the staging directory as the untrusted input it is: a regular file, never waited on.

Dumps, refusal markers and status files appear in a directory both sides share, and
the client reads each one as soon as its name shows up. Whatever sits at that name
(a FIFO, a symlink, a socket, a device, a file far larger than its kind ever is) must
cost a one-line refusal, not a read that blocks until a writer comes (a FIFO opened
for reading without ``O_NONBLOCK`` does) or a buffer as large as the file says.
Stdlib only: both sides import it.
"""

from __future__ import annotations

import os
import stat

from hs_dataset.errors import HsDatasetError

__all__ = ["StagedFileError", "open_staged", "read_staged"]

_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class StagedFileError(HsDatasetError, OSError):
    """A staging file is not a regular file, or larger than its kind can be."""


def open_staged(path: str, *, max_bytes: int | None = None) -> tuple[int, os.stat_result]:
    """A descriptor of ``path`` (and its ``fstat``), only if it is a regular file of at most ``max_bytes``.

    ``O_NONBLOCK`` makes opening a FIFO return at once (instead of waiting for a writer);
    ``O_NOFOLLOW`` refuses a symlink as the last component. Raises FileNotFoundError when
    the name is gone (callers treat that as "not there yet"), :class:`StagedFileError`
    for anything else at the name.
    """
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: a symlink; ENXIO: a socket
        raise StagedFileError(f"{path}: cannot be opened as a plain file ({exc.strerror or exc}); only regular files are read") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StagedFileError(f"{path}: not a regular file (a FIFO, socket, device or directory); only regular files are read")
        if max_bytes is not None and st.st_size > max_bytes:
            raise StagedFileError(f"{path}: {st.st_size} bytes, over the {max_bytes}-byte bound for this kind of file")
        os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def read_staged(path: str, max_bytes: int) -> bytes:
    """The whole of a regular file of at most ``max_bytes`` (read capped too: a file that grew is refused)."""
    fd, _st = open_staged(path, max_bytes=max_bytes)
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise StagedFileError(f"{path}: over the {max_bytes}-byte bound for this kind of file")
    return data
