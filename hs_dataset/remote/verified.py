"""The cached shards this process checked itself: what a cache hit may trust without hashing again.

Why not the cache's index, or a stat against it: the index is a file in the cache
directory, and whoever may write the cache may rewrite a shard in place, put its size
and mtime back (``os.utime``) and edit the index to match. What a writer without
privileges cannot put back is a file's ctime: every write, chmod, utime or rename sets it
to the clock's now (only root, by setting the clock, could forge it). So a process hashes
a cached shard the first time it serves it (BLAKE3 against the hash its name records, the
manifest's), unless it downloaded and hashed the bytes itself, and remembers the file here,
in its own memory, which no other process can edit: inode, size, mtime_ns and ctime_ns.
A later open in the process serves the file only while all four are unchanged; any edit
moves the ctime and sends the file back to the hash. A forked child (DataLoader workers)
inherits what its parent checked, still unforgeable. Hence the cache never changes the
times of a shard it serves (its use order lives in the index), so one process's hit
never costs another a hash. Cost of the first check: docs/LIMITS.md, "Cached shards".

Not covered: a file edited while a reader already has it open (mapped); the cache holds
only the reader's own processes' files, and such an edit is a concurrent write to a file
in use, which no check before the read can see.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["Signature", "forget", "is_verified", "remember", "signature"]

Signature = tuple[int, int, int, int]  # inode, size, mtime_ns, ctime_ns

_checked: dict[str, Signature] = {}  # path -> the file's signature when this process last checked its bytes


def signature(st: os.stat_result) -> Signature:
    """What identifies a file's bytes as checked: a change to the bytes, times or name moves the ctime at least."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def remember(path: Path, st: os.stat_result) -> None:
    """``path`` holds the bytes its name records, checked by this process while the file had ``st``."""
    _checked[os.fspath(path)] = signature(st)


def is_verified(path: Path, st: os.stat_result) -> bool:
    """This process checked ``path``'s bytes and the file has not changed since (same inode, size, mtime and ctime)."""
    return _checked.get(os.fspath(path)) == signature(st)


def forget(path: Path) -> None:
    """The file under ``path`` is gone or changed: the next open checks it again."""
    _checked.pop(os.fspath(path), None)
