"""A remote shard's header and sample offsets by ranged reads: what merge and a packing sampler need, without the states.

Two or three small reads per shard (the 8-byte length, the JSON header, the offsets
tensor), each of exactly the bytes it needs (:mod:`.reads`), parsed by the one header
parser; the full checks happen when the shard itself is downloaded and opened.
"""

from __future__ import annotations

import json
import struct

import torch

from hs_dataset.codecs.safetensors_layout import MAX_HEADER_BYTES, TensorSpec, parse_header
from hs_dataset.errors import IntegrityError
from hs_dataset.formats.manifest import ShardRecord
from hs_dataset.formats.shard_layout import OFFSETS_KEY
from hs_dataset.remote.location import RemoteLocation, storage_errors
from hs_dataset.remote.reads import read_range

__all__ = ["read_header", "read_offsets", "read_sample_ids"]


def read_header(loc: RemoteLocation, record: ShardRecord) -> tuple[dict[str, TensorSpec], dict[str, str], int]:
    """(tensor specs, metadata, data start) of ``record``'s shard, checked against the size its record gives."""
    where = f"{loc.url}/{record.file}"
    key = loc.key(record.file)
    with storage_errors(where):
        first = read_range(loc.fs, key, 0, 8, budget=loc.budget, where=where, expect=8)
        (n,) = struct.unpack("<Q", first) if len(first) == 8 else (MAX_HEADER_BYTES + 1,)
        if n > MAX_HEADER_BYTES or 8 + n > record.bytes:
            raise IntegrityError(f"{where}: header length {n} does not fit the {record.bytes} bytes the manifest records")
        header = read_range(loc.fs, key, 0, 8 + n, budget=loc.budget, where=where, expect=8 + n)
    return parse_header(bytes(header), record.bytes, where)


def read_sample_ids(loc: RemoteLocation, record: ShardRecord) -> list[str]:
    _specs, meta, _start = read_header(loc, record)
    ids = json.loads(meta.get("sample_ids", "[]"))
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise IntegrityError(f"{loc.url}/{record.file}: sample_ids must be a list of strings")
    return ids


def read_offsets(loc: RemoteLocation, record: ShardRecord) -> torch.Tensor:
    """The shard's ``sample_offsets`` (int64, samples + 1), checked to span its record's tokens."""
    specs, _meta, start = read_header(loc, record)
    spec = specs.get(OFFSETS_KEY)
    where = f"{loc.url}/{record.file}"
    if spec is None or spec.dtype != "I64" or spec.shape != (record.samples + 1,):
        raise IntegrityError(f"{where}: sample_offsets missing or not int64 [{record.samples + 1}] as its record says")
    size = spec.end - spec.begin
    with storage_errors(where):
        data = read_range(loc.fs, loc.key(record.file), start + spec.begin, start + spec.end, budget=loc.budget, where=where, expect=size)
    if len(data) != size:
        raise IntegrityError(f"{where}: {len(data)} bytes of sample_offsets where the header says {size} (object cut or replaced)")
    offsets = torch.frombuffer(bytearray(data), dtype=torch.int64)
    if int(offsets[0]) != 0 or int(offsets[-1]) != record.tokens or bool((offsets[1:] <= offsets[:-1]).any()):
        raise IntegrityError(f"{where}: sample_offsets do not span the {record.tokens} tokens its record gives")
    return offsets
