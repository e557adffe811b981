"""Byte layout of a safetensors file, written and parsed without going through pickle.

We write shards ourselves (instead of ``safetensors.torch.save_file``) so that the
bytes can be streamed straight from each sample's tensor into the file while the
sha256 is computed, with no concatenated copy of a 2 GiB shard in memory. The
result is a standard safetensors file: ``safetensors.safe_open`` reads it.

Layout: 8-byte little-endian header length N, N bytes of JSON (space padded so the
data starts 8-byte aligned), then the tensors' bytes back to back, no holes.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

from hs_dataset.errors import FormatError

__all__ = ["TensorSpec", "build_header", "parse_header", "read_header", "MAX_HEADER_BYTES"]

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
_ALIGN = 8


@dataclass(frozen=True)
class TensorSpec:
    """One tensor entry of a header: name, safetensors dtype, shape, byte range in the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def build_header(tensors: list[tuple[str, str, tuple[int, ...], int]], metadata: dict[str, str]) -> tuple[bytes, list[TensorSpec]]:
    """Serialise a header for ``(name, dtype, shape, nbytes)`` entries laid out in the given order.

    Returns the full prefix (length + JSON + padding) and the resulting specs.
    """
    header: dict[str, object] = {"__metadata__": metadata}
    specs: list[TensorSpec] = []
    offset = 0
    for name, dtype, shape, nbytes in tensors:
        specs.append(TensorSpec(name, dtype, tuple(shape), offset, offset + nbytes))
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    body = json.dumps(header, separators=(",", ":")).encode("utf-8")
    body += b" " * ((-len(body) - 8) % _ALIGN)
    return struct.pack("<Q", len(body)) + body, specs


def parse_header(prefix: bytes, file_size: int, where: str) -> tuple[dict[str, TensorSpec], dict[str, str], int]:
    """Validate and parse a header; ``prefix`` must hold at least the 8 + N header bytes.

    Returns (specs by name, metadata, absolute offset of the data section). Every
    range is checked against ``file_size`` so a truncated file is caught here.
    """
    if len(prefix) < 8 or file_size < 8:
        raise FormatError(f"{where}: file is too short to be safetensors ({file_size} bytes)")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES or 8 + n > file_size:
        raise FormatError(f"{where}: header length {n} does not fit in a {file_size}-byte file (truncated or not safetensors)")
    try:
        raw = json.loads(prefix[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{where}: header is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise FormatError(f"{where}: header is not a JSON object")
    metadata = raw.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError(f"{where}: __metadata__ must map strings to strings")
    data_start = 8 + n
    specs: dict[str, TensorSpec] = {}
    for name, entry in raw.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"{where}: tensor {name!r} has a malformed header entry") from None
        if not (0 <= begin <= end) or data_start + end > file_size:
            raise FormatError(f"{where}: tensor {name!r} bytes [{begin}, {end}) lie outside the file (truncated?)")
        specs[name] = TensorSpec(name, dtype, shape, int(begin), int(end))
    return specs, metadata, data_start


def read_header(f: BinaryIO, where: str) -> tuple[dict[str, TensorSpec], dict[str, str], int]:
    """Read and parse the header of an open binary file."""
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    first = f.read(8)
    if len(first) < 8:
        raise FormatError(f"{where}: file is too short to be safetensors ({size} bytes)")
    (n,) = struct.unpack("<Q", first)
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise FormatError(f"{where}: header length {n} does not fit in a {size}-byte file (truncated or not safetensors)")
    return parse_header(first + f.read(n), size, where)
