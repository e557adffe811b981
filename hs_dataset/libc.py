"""The few libc calls Python's ``os`` lacks, each bound once with exact C signatures.

Why one module: the SGLang side (kept file mappings, thread names) and the client
side (early writeback of shards) both need libc, and a signature set on a shared
``CDLL`` attribute by one caller would silently change it for another. Each call here
gets its own function object. Stdlib only, so the server side (``server_patch``) may import it inside
the server. Where there is no libc or no such call (Windows, macOS for
``sync_file_range``), the binding is ``None`` and callers take their portable path.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["libc_function", "name_os_thread", "start_writeback"]

_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writeback of the dirty pages in the range, do not wait for it
_PR_SET_NAME = 15  # <linux/prctl.h>: name the calling thread


def _load() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except (OSError, TypeError):  # no C library to load (Windows passes None as a name)
        return None


_LIBC = _load()


def libc_function(name: str, restype: Any, *argtypes: Any) -> Callable[..., Any] | None:
    """``name`` from libc as its own function object with these C types (errno kept), or None where absent."""
    if _LIBC is None:
        return None
    try:
        return ctypes.CFUNCTYPE(restype, *argtypes, use_errno=True)((name, _LIBC))
    except AttributeError:
        return None


_sync_file_range = (
    libc_function("sync_file_range", ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    if sys.platform.startswith("linux")
    else None
)
_prctl = (
    libc_function("prctl", ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
    if sys.platform.startswith("linux")
    else None
)


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Ask the kernel to start writing ``[offset, offset+length)`` of ``fd`` to disk now, without waiting.

    Why: a buffered file is otherwise written back only at ``fsync`` (or after
    ``dirty_expire``), so one file's bytes reach the disk as one late burst. Started
    while the writer goes on, one file alone reaches the disk faster and several at
    once lose nothing by it (docs/BENCHMARKS.md: early writeback,
    ``benchmarks/bench_writeback.py``). Durability is still ``fsync``'s job.
    Returns False where the call is missing or refused (then the caller simply stops
    asking for that file).
    """
    if _sync_file_range is None:
        return False
    return bool(_sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE) == 0)


def name_os_thread(name: str) -> None:
    """Give the calling thread an OS-visible name (Linux; at most 15 bytes; elsewhere a no-op).

    Why: ``top -H``, ``ps -L`` and /proc then tell our threads from the host process's
    own, so their CPU can be read per thread (benchmarks/bench_transport.py does).
    Python names its threads only for itself.
    """
    if _prctl is not None:
        _prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
