"""The one safetensors header parser: every shard, dump and export file we read goes through it.

The files are written with :func:`hs_dataset.codecs.safetensors_header.dump_header` (the one
builder) followed by the tensors' own bytes, so the bytes can be streamed straight from
each sample's tensor into the file while it is hashed, with no concatenated copy of a
2 GiB shard in memory. The result is a standard safetensors file: ``safetensors.safe_open``
reads it.

Layout: 8-byte little-endian header length N, N bytes of JSON (space padded so the
data starts 8-byte aligned), then the tensors' bytes back to back, no holes. Any
tensor order is read (shards written before the one builder put ``sample_offsets``
first); the ranges must tile the data section.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

from hs_dataset import strict_json
from hs_dataset.errors import FormatError, UnsupportedFormatError

__all__ = ["DTYPE_SIZES", "MAX_HEADER_BYTES", "TensorSpec", "parse_header", "read_header"]

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
_MAX_DIMS = 16
# Item size of every safetensors dtype code, so a header is checked without torch.
DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


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


def parse_header(
    prefix: bytes, file_size: int, where: str, max_header_bytes: int = MAX_HEADER_BYTES
) -> tuple[dict[str, TensorSpec], dict[str, str], int]:
    """Validate and parse a header; ``prefix`` must hold at least the 8 + N header bytes.

    Returns (specs by name, metadata, absolute offset of the data section). Every
    range is checked against ``file_size`` so a truncated file is caught here.
    ``max_header_bytes``: the largest header the caller's kind of file can have.
    """
    if len(prefix) < 8 or file_size < 8:
        raise FormatError(f"{where}: file is too short to be safetensors ({file_size} bytes)")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > max_header_bytes:
        raise FormatError(f"{where}: header length {n} is over the {max_header_bytes}-byte bound for this kind of file")
    if 8 + n > file_size:
        raise FormatError(f"{where}: header length {n} does not fit in a {file_size}-byte file (truncated or not safetensors)")
    try:
        raw = strict_json.loads(prefix[8 : 8 + n].decode("utf-8"))  # a key twice: one tensor to us, another to other readers
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise FormatError(f"{where}: header is not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(raw, dict):
        raise FormatError(f"{where}: header is not a JSON object")
    metadata = raw.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError(f"{where}: __metadata__ must map strings to strings")
    data_start = 8 + n
    specs: dict[str, TensorSpec] = {}
    for name, entry in raw.items():
        specs[name] = _parse_entry(name, entry, where)
    _check_layout(specs, file_size - data_start, where)
    return specs, metadata, data_start


def _parse_entry(name: str, entry: object, where: str) -> TensorSpec:
    """One tensor entry: a known dtype, non-negative integer dims, integer offsets whose span fits dtype * shape."""
    try:
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]  # type: ignore[index]
        if not isinstance(dtype, str) or not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2:
            raise TypeError
    except (KeyError, TypeError):
        raise FormatError(f"{where}: tensor {name!r} has a malformed header entry") from None
    if not all(_is_count(v) for v in (*shape, *offsets)) or len(shape) > _MAX_DIMS:
        raise FormatError(
            f"{where}: tensor {name!r} has a shape {str(shape)[:80]} or data_offsets {str(offsets)[:80]} that are not non-negative integers"
        )
    itemsize = DTYPE_SIZES.get(dtype)
    if itemsize is None:
        raise UnsupportedFormatError(f"{where}: tensor {name!r} has dtype {dtype[:40]!r}, unknown to this reader; upgrade hs_dataset")
    begin, end = offsets
    count = 1
    for d in shape:
        count *= d
    if end < begin or count * itemsize != end - begin:
        raise FormatError(
            f"{where}: tensor {name!r} ({dtype} {shape}) needs {count * itemsize} bytes but data_offsets span [{begin}, {end}) "
            "(damaged or hand-edited header)"
        )
    return TensorSpec(name, dtype, tuple(shape), begin, end)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_layout(specs: dict[str, TensorSpec], data_bytes: int, where: str) -> None:
    """Byte ranges tile the data section exactly: no overlap (two tensors sharing bytes), no hole, nothing past the end.

    safetensors' own loader refuses the same files; without this, a header could make
    two tensors alias each other and still pass a hash check.
    """
    position, previous = 0, None
    for spec in sorted(specs.values(), key=lambda s: (s.begin, s.end)):
        if spec.begin != position:
            kind = (
                f"overlap {previous.name!r}'s [{previous.begin}, {previous.end})"
                if spec.begin < position and previous
                else "leave a hole before them"
            )
            raise FormatError(f"{where}: tensor {spec.name!r} bytes [{spec.begin}, {spec.end}) {kind} (damaged or hand-edited header)")
        position, previous = spec.end, spec
    if position != data_bytes:
        raise FormatError(
            f"{where}: tensors cover {position} data bytes but the file holds {data_bytes} after the header (truncated or extended file)"
        )


def read_header(f: BinaryIO, where: str, max_header_bytes: int = MAX_HEADER_BYTES) -> tuple[dict[str, TensorSpec], dict[str, str], int]:
    """Read and parse the header of an open binary file (no more than ``max_header_bytes`` of it)."""
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    first = f.read(8)
    if len(first) < 8:
        raise FormatError(f"{where}: file is too short to be safetensors ({size} bytes)")
    (n,) = struct.unpack("<Q", first)
    if n > max_header_bytes:
        raise FormatError(f"{where}: header length {n} is over the {max_header_bytes}-byte bound for this kind of file")
    if 8 + n > size:
        raise FormatError(f"{where}: header length {n} does not fit in a {size}-byte file (truncated or not safetensors)")
    return parse_header(first + f.read(n), size, where, max_header_bytes)
