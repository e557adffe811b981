"""sha256 of files, in bounded chunks (shards are GiBs; never read one whole into memory)."""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO

__all__ = ["sha256_file", "sha256_fileobj"]

_CHUNK = 8 * 1024 * 1024


def sha256_fileobj(f: BinaryIO) -> str:
    """Hash an open binary file from its start."""
    digest = hashlib.sha256()
    f.seek(0)
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return sha256_fileobj(f)
