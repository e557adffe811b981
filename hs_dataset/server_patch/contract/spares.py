"""Dumps the client has read go back to the server as spares, instead of being deleted.

``{staging}/.spares/<size hex>-<32 hex>``: a dump the client has read, handed back with
:func:`hand_back_dump`. The server claims one (rename), truncates it to the next dump's
size and writes over its pages: a dump's round trip through pages tmpfs already holds
is cheaper than one through fresh pages, allocated, zeroed and later freed
(docs/BENCHMARKS.md: staging with kept mappings and spares, benchmarks/bench_staging_pool.py).
The pool has its own directory, so neither side
scans the dumps waiting beside it; it is capped by :data:`SPARE_MAX_FILES` /
:data:`SPARE_MAX_BYTES`, and the server's sweeper deletes spares nobody claimed within
a sweep interval. The name carries the size (:func:`spare_name`), so neither side stats
the spares to weigh the pool; a name without it (an older client) is weighed by stat.
"""

from __future__ import annotations

import os
import stat
import uuid

from hs_dataset.server_patch.contract.private_dir import StagingError, check_private_dir

__all__ = ["SPARE_DIR", "SPARE_MAX_BYTES", "SPARE_MAX_FILES", "hand_back_dump", "spare_name", "spare_size"]

SPARE_DIR = ".spares"  # inside the staging dir; made by the first client that hands a dump back
SPARE_MAX_FILES = 32  # spare dumps a client leaves for the server to write over (per staging dir)
SPARE_MAX_BYTES = 1 << 30  # ... and their bytes: memory tmpfs keeps holding for the next dumps


def hand_back_dump(path: str) -> None:
    """The client is done with a dump: move it into the spare pool, or delete it if the pool is full.

    The caller has copied what it needs (the client reads each dump into its own
    memory), so the server may overwrite the file from now on. A missing file is fine
    (swept, or never written).
    """
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return
    size = st.st_size
    if not stat.S_ISREG(st.st_mode):  # a link, FIFO or directory at a dump's name is nobody's dump: never a spare
        try:
            os.unlink(path)
        except OSError:
            pass  # a directory: left where it is (the sweeper's to judge), never moved into the pool
        return
    pool = os.path.join(os.path.dirname(path) or ".", SPARE_DIR)
    if _pool_has_room(pool, size):
        try:
            os.rename(path, os.path.join(pool, spare_name(size)))
            return
        except OSError:
            pass
    _unlink_quietly(path)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def spare_name(size: int) -> str:
    """A spare's name in the pool: its size in hex, ``-``, 32 random hex digits.

    Why the size: both sides weigh the pool on every dump (the client against its caps,
    the server for the spare closest in size), and a stat per spare hands the GIL back
    once per file -- on the server, next to the forward thread. The name is a hint
    only: the server sizes what it claims by ``fstat`` and ``ftruncate``, and the
    pool is private to one user.
    """
    return f"{size:x}-{uuid.uuid4().hex}"


def spare_size(entry: os.DirEntry) -> int:
    """A spare's size from its name (:func:`spare_name`), or by stat where the name does not say it (older clients)."""
    head, sep, tail = entry.name.partition("-")
    if sep and len(tail) == 32 and 0 < len(head) <= 16:
        try:
            return int(head, 16)
        except ValueError:
            pass
    return entry.stat(follow_symlinks=False).st_size


def _pool_has_room(pool: str, size: int) -> bool:
    """Whether ``pool`` is (or now is) a private directory of ours with room for ``size`` more bytes."""
    try:
        os.mkdir(pool, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        check_private_dir(pool)
        files = held = 0
        with os.scandir(pool) as entries:
            for entry in entries:
                files += 1
                held += spare_size(entry)
    except (OSError, StagingError):
        return False
    return files < SPARE_MAX_FILES and held + size <= SPARE_MAX_BYTES
