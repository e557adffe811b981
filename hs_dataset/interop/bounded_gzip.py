"""Decompress an untrusted ``.gz`` with a size cap, to a temporary file, never into memory whole.

A 20 MB ``.ckpt.gz`` can expand to terabytes (a gzip bomb). ``gzip.open(...).read()``
would try to hold all of it; here the stream is copied in bounded chunks into a
temporary file and refused, with the cap in the message, as soon as it grows past
:func:`decompressed_cap` (absolute :data:`MAX_DECOMPRESSED_BYTES`, and at most
:data:`MAX_RATIO` times the compressed size, with a floor of :data:`MIN_CAP_BYTES`:
hidden states barely compress, so a real checkpoint is far below both). Memory stays
at one chunk whatever the file holds.
"""

from __future__ import annotations

import gzip
import os
import tempfile
import zlib
from pathlib import Path
from typing import IO

from hs_dataset.errors import HsDatasetError

__all__ = [
    "CHUNK_BYTES",
    "MAX_DECOMPRESSED_BYTES",
    "MAX_RATIO",
    "MIN_CAP_BYTES",
    "CompressedInputError",
    "decompressed_cap",
    "gunzip_to_temp",
]

CHUNK_BYTES = 1 << 20
MAX_DECOMPRESSED_BYTES = 16 << 30  # far above one sample (Kimi-K2.5, 8k tokens, bf16: ~0.5 GB)
MAX_RATIO = 16
MIN_CAP_BYTES = 256 << 20


class CompressedInputError(HsDatasetError, ValueError):
    """A compressed input is unreadable or expands past its cap (a possible gzip bomb); nothing of it was used."""


def decompressed_cap(compressed_bytes: int) -> int:
    """The most bytes a ``.gz`` of ``compressed_bytes`` may expand to."""
    return min(MAX_DECOMPRESSED_BYTES, max(MIN_CAP_BYTES, MAX_RATIO * compressed_bytes))


def _copy_capped(src: IO[bytes], dst: IO[bytes], cap: int, path: Path) -> None:
    total = 0
    while chunk := src.read(CHUNK_BYTES):
        total += len(chunk)
        if total > cap:
            raise CompressedInputError(
                f"{path}: decompresses to more than {cap} bytes ({MAX_RATIO}x its compressed size, at least "
                f"{MIN_CAP_BYTES >> 20} MiB, at most {MAX_DECOMPRESSED_BYTES >> 30} GiB); refused as a possible "
                "gzip bomb. If it is genuine, gunzip it yourself and import the plain .ckpt"
            )
        dst.write(chunk)


def gunzip_to_temp(path: Path) -> IO[bytes]:
    """An open temporary file (deleted on close) holding ``path`` decompressed; :class:`CompressedInputError` past the cap."""
    cap = decompressed_cap(os.path.getsize(path))
    out = tempfile.NamedTemporaryFile(prefix="hs_dataset-gunzip-", suffix=".ckpt")
    try:
        with gzip.open(path, "rb") as src:
            _copy_capped(src, out, cap, path)
        out.flush()
    except (OSError, EOFError, zlib.error) as exc:  # not gzip, truncated, or the disk filled
        out.close()
        raise CompressedInputError(f"{path}: cannot be decompressed ({type(exc).__name__}: {exc})") from None
    except BaseException:
        out.close()
        raise
    return out
