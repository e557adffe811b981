"""The one place files and shards are hashed (shards are GiBs: bounded chunks, never read whole).

Shards are hashed with BLAKE3 (manifest format 2): one core hashes it at several
times the speed of sha256, so hashing keeps up with the write (docs/FORMAT.md,
"Shard hashes", has the rates). sha256 remains for the files
the Hub addresses by sha256 (LFS oids) and for shards of format-1 manifests.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from typing import BinaryIO, Protocol

import blake3

__all__ = [
    "HASH_ALGORITHMS",
    "SHARD_HASH",
    "Hasher",
    "file_digests",
    "new_hasher",
    "sha256_bytes",
    "sha256_file",
    "sha256_fileobj",
]

SHARD_HASH = "blake3"  # what new shards are recorded with (ShardRecord.blake3)
HASH_ALGORITHMS = ("blake3", "sha256")  # what a manifest may record, preferred first
_CHUNK = 8 * 1024 * 1024


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def new_hasher(algorithm: str) -> Hasher:
    """A streaming hasher on the calling thread.

    BLAKE3 stays on one thread (``max_threads=1``): its multi-threaded mode starts a
    Rayon pool that deadlocks in a forked child (DataLoader and ``datasets`` workers
    fork), and parallelism comes from several shards in flight instead.
    """
    if algorithm == "blake3":
        return blake3.blake3(max_threads=1)
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown hash algorithm {algorithm!r}; known: {HASH_ALGORITHMS}")


def file_digests(f: BinaryIO, algorithms: Iterable[str]) -> dict[str, str]:
    """Hex digests of an open binary file from its start, every algorithm in one pass."""
    hashers = {name: new_hasher(name) for name in algorithms}
    f.seek(0)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while n := f.readinto(buf):
        for hasher in hashers.values():
            hasher.update(view[:n])
    return {name: hasher.hexdigest() for name, hasher in hashers.items()}


def sha256_fileobj(f: BinaryIO) -> str:
    """sha256 of an open binary file from its start."""
    return file_digests(f, ("sha256",))["sha256"]


def sha256_bytes(data: bytes | memoryview) -> str:
    """sha256 of bytes already in memory (small files: the norm weight)."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return sha256_fileobj(f)
