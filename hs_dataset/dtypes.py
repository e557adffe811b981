"""The one dtype table: name <-> torch dtype <-> safetensors code <-> bytes per element.

Cards, manifests, shard headers and capture backends all spell dtypes; they read
this table instead of keeping their own. torch is imported only when a torch dtype
is asked for, so the card schema (:mod:`hs_dataset.config`) can name dtypes without
importing torch. Stdlib only besides that, so the server side
(:mod:`hs_dataset.server_patch`, inside SGLang) reads it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "DTYPES",
    "STATE_DTYPES",
    "DType",
    "dtype_info",
    "from_safetensors",
    "from_torch",
    "state_dtype",
    "state_dtype_name",
]


@dataclass(frozen=True)
class DType:
    """One dtype under every name it goes by."""

    name: str  # torch attribute and manifest/card spelling, e.g. "bfloat16"
    safetensors: str  # safetensors header code, e.g. "BF16"
    itemsize: int  # bytes per element
    encoding: str | None = None  # plain tensor encoding in the manifest ("bf16"); None: never stored plain

    @property
    def torch(self) -> torch.dtype:
        import torch

        return getattr(torch, self.name)


DTYPES: tuple[DType, ...] = (
    DType("int64", "I64", 8, "int64"),
    DType("int32", "I32", 4),
    DType("bool", "BOOL", 1, "bool"),
    DType("uint8", "U8", 1),
    DType("bfloat16", "BF16", 2, "bf16"),
    DType("float16", "F16", 2, "f16"),
    DType("float32", "F32", 4, "f32"),
    DType("float64", "F64", 8),
    DType("float8_e4m3fn", "F8_E4M3", 1),
)

# Hidden states are captured and stored in one of these (a card's ``dtype``).
STATE_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")

_BY_NAME = {d.name: d for d in DTYPES}
_BY_CODE = {d.safetensors: d for d in DTYPES}


def dtype_info(name: str) -> DType:
    """The table row for a dtype name (``"bfloat16"``); ValueError names the known ones."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(_BY_NAME)}") from None


def from_safetensors(code: str) -> DType | None:
    """The row for a safetensors dtype code (``"BF16"``), or None for a code this format never uses."""
    return _BY_CODE.get(code)


def from_torch(dtype: torch.dtype) -> DType | None:
    """The row for a torch dtype, or None for one this format never uses."""
    return _BY_NAME.get(str(dtype).removeprefix("torch."))


def state_dtype(name: str) -> torch.dtype:
    """A hidden-state dtype name -> torch dtype; ValueError unless it is one of :data:`STATE_DTYPES`."""
    if name not in STATE_DTYPES:
        raise ValueError(f"unsupported state dtype {name!r}; use one of {', '.join(STATE_DTYPES)}")
    return _BY_NAME[name].torch


def state_dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype -> its hidden-state name; ValueError unless it is one of :data:`STATE_DTYPES`."""
    row = from_torch(dtype)
    if row is None or row.name not in STATE_DTYPES:
        raise ValueError(f"hidden states must be {', '.join(STATE_DTYPES)}, got {dtype}")
    return row.name
