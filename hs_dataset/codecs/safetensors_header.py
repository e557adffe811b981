"""The one safetensors header builder: the server's dumps, the client's shards and the export files.

Stdlib only, so the server side (inside SGLang) uses the same builder as the writer.
The parser lives in :mod:`hs_dataset.codecs.safetensors_layout`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

__all__ = ["dump_header"]

# safetensors dtype codes, ranked the way safetensors orders tensors in a file (its
# Dtype enum, descending; ties by name) -- so that :func:`dump_header` lays out the
# bytes exactly as ``safetensors.torch.save`` does. Descending rank is descending item
# size, so every tensor starts aligned to its item size.
_DTYPE_RANK = {
    "BOOL": 0,
    "U8": 4,
    "I8": 5,
    "F8_E5M2": 6,
    "F8_E4M3": 7,
    "I16": 9,
    "U16": 10,
    "F16": 11,
    "BF16": 12,
    "I32": 13,
    "U32": 14,
    "F32": 15,
    "F64": 17,
    "I64": 18,
    "U64": 19,
}
_ALIGN = 8  # the data section starts 8-byte aligned


def dump_header(tensors: Sequence[tuple[str, str, Sequence[int], int]], metadata: dict[str, str]) -> tuple[bytes, list[str]]:
    """The safetensors prefix (length + JSON header + padding) for ``(name, dtype code, shape, nbytes)``.

    Returns the prefix and the tensor names in the order their bytes must follow it
    (safetensors' order: dtype rank descending, then name). The JSON is what
    ``safetensors.torch.save`` writes for the same metadata (in the dict's order; left
    out when empty) and tensors, byte for byte, so a file written as prefix + raw
    tensor bytes needs no serialization copy and is read by any safetensors reader.
    """
    order = sorted(tensors, key=lambda t: (-_DTYPE_RANK[t[1]], t[0]))
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, dtype, shape, nbytes in order:
        header[name] = {"dtype": dtype, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + int(nbytes)]}
        offset += int(nbytes)
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    body += b" " * (-len(body) % _ALIGN)
    return struct.pack("<Q", len(body)) + body, [t[0] for t in order]
