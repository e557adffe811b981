"""The OS's refusals to write the remote cache's directory, as one named line with the fix.

Why: a cache directory on a read-only mount (or one the user may not write), or on a full
disk, surfaced as a raw ``OSError`` from ``open_dataset(URL)`` and ``follow_dataset``
(``[Errno 30] Read-only file system: '...'``), saying neither that the *cache* was the
problem nor that another ``cache_dir`` (or freeing space) fixes it. Every write the
cache makes (creating the directory, its lock and index, reserving and receiving a
download, placing it) runs under :func:`cache_writes`.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hs_dataset.errors import DiskFullError, HsDatasetError, ReadOnlyError

__all__ = ["cache_writes"]

_READ_ONLY = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EPERM: "operation not permitted"}
_FULL = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded"}


@contextmanager
def cache_writes(directory: Path) -> Iterator[None]:
    """Run the cache's writes to ``directory``: a read-only or full directory is a ReadOnlyError or DiskFullError naming it."""
    try:
        yield
    except ReadOnlyError as exc:  # open_for_writing's, worded for a dataset directory: say the cache's fix instead
        cause = exc.__context__
        raise read_only(directory, cause.errno if isinstance(cause, OSError) and cause.errno else errno.EROFS) from None
    except HsDatasetError:
        raise
    except OSError as exc:
        if exc.errno in _READ_ONLY:
            raise read_only(directory, exc.errno) from None
        if exc.errno in _FULL:
            raise DiskFullError(
                f"{directory}: cannot write the remote cache ({_FULL[exc.errno]}, {errno.errorcode[exc.errno]}); "
                "free space there, lower max_cache_bytes (HS_DATASET_CACHE_BYTES), or give another cache_dir (HS_DATASET_CACHE_DIR)"
            ) from None
        raise


def read_only(directory: Path, code: int) -> ReadOnlyError:
    """The one line for a cache directory that cannot be written."""
    why = _READ_ONLY.get(code, "cannot be written")
    return ReadOnlyError(
        f"{directory}: cannot write the remote cache ({why}, {errno.errorcode.get(code, code)}); "
        "give a cache_dir on a writable file system (or set HS_DATASET_CACHE_DIR)"
    )
