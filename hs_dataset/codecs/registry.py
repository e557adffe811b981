"""The one codec registry: every encoding a tensor may be stored in, named once.

A card's ``shards.storage``, the CLI's ``--storage`` choices, the writer, the reader,
``verify``, the SGLang client's dump check and the server's device quantizer all read
:data:`ENCODINGS`; adding an encoding is one :class:`Encoding` here plus its tests.
Plain encodings come from the dtype table (:mod:`hs_dataset.dtypes`); the scaled ones
store a state ``[..., H]`` as data ``[..., H / pack]`` plus a companion ``<key>.scale``
tensor, one scale per row (``group`` 0) or per ``group`` values.

stdlib only at import (torch is imported by the quantizers when they run), so the card
schema can name storages without torch and the server side can read it inside SGLang.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hs_dataset.codecs import fp4, fp8
from hs_dataset.dtypes import DTYPES, STATE_DTYPES, dtype_info, from_torch
from hs_dataset.errors import UnsupportedFormatError

if TYPE_CHECKING:
    import torch

__all__ = [
    "ENCODED_STORAGES",
    "ENCODINGS",
    "NATIVE",
    "STORAGE_CHOICES",
    "STORAGE_NAMES",
    "STORAGE_VALUES",
    "Encoding",
    "device_quantizer",
    "encoding_of_storage",
    "get_encoding",
    "state_encoding_for",
]

Quantize = Callable[["torch.Tensor"], "tuple[torch.Tensor, torch.Tensor]"]
Dequantize = Callable[["torch.Tensor", "torch.Tensor", "torch.dtype"], "torch.Tensor"]

NATIVE = "native"  # ``shards.storage``: the capture dtype's own plain encoding


@dataclass(frozen=True)
class Encoding:
    """One named storage encoding of a logical tensor, with everything that reads or writes it."""

    name: str  # the manifest's and the dump's name for it
    storage_dtype: str  # safetensors dtype code of the stored data
    decoded: str  # dtype name readers hand out
    storage: str | None = None  # the short name a card's ``shards.storage`` gives; None: chosen by the capture dtype
    summary: str = ""  # one line for the card schema's docs: what it stores and its bytes against bf16
    scale_dtype: str = "F32"  # safetensors dtype code of the scales (scaled encodings)
    group: int = 0  # values per scale along the last dimension; 0: one scale per row
    pack: int = 1  # values per stored element along the last dimension
    quantize: Quantize | None = None  # host (and reference device) encoder; None: a plain cast
    dequantize: Dequantize | None = None
    bad_scales: Callable[[torch.Tensor], torch.Tensor] | None = None  # mask of scales that cannot decode
    scale_rule: str = ""  # what a valid scale is, in words
    device_quantizer: Callable[[], Quantize] | None = None  # the server's quantizer (same bytes), made once per process

    @property
    def scaled(self) -> bool:
        return self.quantize is not None

    @property
    def decoded_dtype(self) -> torch.dtype:
        return dtype_info(self.decoded).torch

    @property
    def storage_torch_dtype(self) -> torch.dtype:
        return _torch_dtype(self.storage_dtype)

    @property
    def scale_torch_dtype(self) -> torch.dtype:
        return _torch_dtype(self.scale_dtype)

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The stored data's shape for a state of logical ``shape`` ``[..., H]``."""
        return (*shape[:-1], shape[-1] // self.pack)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The scale tensor's shape for a state of logical ``shape`` ``[..., H]``."""
        return tuple(shape[:-1]) if not self.group else (*shape[:-1], shape[-1] // self.group)

    def row_bytes(self, hidden_size: int) -> int:
        """Stored bytes of one ``[H]`` row, scales included."""
        data = hidden_size // self.pack * _itemsize(self.storage_dtype)
        if not self.scaled:
            return data
        return data + (hidden_size // self.group if self.group else 1) * _itemsize(self.scale_dtype)

    def bytes_per_value(self, hidden_size: int) -> float:
        """Stored bytes per state value at this hidden size, scales included."""
        return self.row_bytes(hidden_size) / hidden_size

    def hidden_size_problem(self, hidden_size: int) -> str:
        """Why states of this hidden size cannot be stored this way; empty when they can."""
        step = max(self.group, self.pack)
        if hidden_size % step:
            return f"{self.name} stores groups of {step} values; hidden size {hidden_size} is not a multiple of {step}: use --storage fp8 or native"
        return ""


def _torch_dtype(code: str) -> torch.dtype:
    return _BY_CODE[code].torch


def _itemsize(code: str) -> int:
    return _BY_CODE[code].itemsize


_BY_CODE = {d.safetensors: d for d in DTYPES}
_U8, _BF16, _F8 = (dtype_info(n).safetensors for n in ("uint8", "bfloat16", "float8_e4m3fn"))

ENCODINGS: dict[str, Encoding] = {
    # plain: one per dtype the table gives an encoding name (int64, bool, bf16, f16, f32)
    **{d.encoding: Encoding(d.encoding, d.safetensors, d.name) for d in DTYPES if d.encoding},
    # the scaled ones decode to bf16: opt-in storage reductions of bf16 captures
    fp8.FP8_ENCODING: Encoding(
        fp8.FP8_ENCODING,
        _F8,
        "bfloat16",
        storage="fp8",
        summary="float8 e4m3 plus a float32 scale per token, half the bytes of bf16",
        quantize=fp8.quantize_fp8_per_token,
        dequantize=fp8.dequantize_fp8_per_token,
        bad_scales=fp8.bad_scales,
        scale_rule="finite and > 0",
        device_quantizer=lambda: fp8.quantize_fp8_per_token,
    ),
    fp4.MXFP4_ENCODING: Encoding(
        fp4.MXFP4_ENCODING,
        _U8,
        "bfloat16",
        storage="mxfp4",
        summary="4-bit e2m1 codes plus a power-of-two scale per 32 values, 0.266 of bf16",
        scale_dtype=_U8,
        group=fp4.GROUP_SIZE,
        pack=2,
        quantize=fp4.quantize_mxfp4,
        dequantize=fp4.dequantize_mxfp4,
        bad_scales=fp4.bad_mx_exponents,
        scale_rule=f"exponent bytes <= {fp4.MX_MAX_EXPONENT_BYTE}",
        device_quantizer=lambda: _fused(fp4.MXFP4_ENCODING, fp4.quantize_mxfp4),
    ),
    fp4.NF4_ENCODING: Encoding(
        fp4.NF4_ENCODING,
        _U8,
        "bfloat16",
        storage="nf4",
        summary="4-bit NormalFloat codes plus a bf16 absmax per 32 values, 0.281 of bf16",
        scale_dtype=_BF16,
        group=fp4.GROUP_SIZE,
        pack=2,
        quantize=fp4.quantize_nf4,
        dequantize=fp4.dequantize_nf4,
        bad_scales=fp4.bad_nf4_scales,
        scale_rule="finite and >= 0",
        device_quantizer=lambda: _fused(fp4.NF4_ENCODING, fp4.quantize_nf4),
    ),
}


def _fused(name: str, reference: Quantize) -> Quantize:
    from hs_dataset.codecs.fp4_kernel import fused_quantizer  # torch (and triton, where present) only when asked

    return fused_quantizer(name, reference)


STORAGE_NAMES: dict[str, str] = {e.storage: e.name for e in ENCODINGS.values() if e.storage}  # short name -> encoding
ENCODED_STORAGES: tuple[str, ...] = (*STORAGE_NAMES, *STORAGE_NAMES.values())  # every name that stores encoded states
STORAGE_CHOICES: tuple[str, ...] = (NATIVE, *STORAGE_NAMES)  # what the CLIs offer
STORAGE_VALUES: tuple[str, ...] = (NATIVE, *ENCODED_STORAGES)  # what a card may give


def get_encoding(name: str) -> Encoding:
    """The registry's entry for ``name``; an unknown one means newer data than this reader."""
    try:
        return ENCODINGS[name]
    except KeyError:
        raise UnsupportedFormatError(
            f"unknown tensor encoding {name!r}: this data was written by a newer hs_dataset; "
            f"upgrade hs_dataset (known encodings: {sorted(ENCODINGS)})"
        ) from None


def encoding_of_storage(storage: str) -> str | None:
    """The encoding a storage name (short or full) stands for; ``None`` for ``native`` or a name this table lacks."""
    return STORAGE_NAMES.get(storage, storage if storage in STORAGE_NAMES.values() else None)


def state_encoding_for(dtype: torch.dtype, storage: str | None = None) -> str:
    """The encoding name for hidden states captured in ``dtype`` and stored as ``storage`` (``native`` by default)."""
    if storage in (None, "", NATIVE):
        row = from_torch(dtype)
        if row is None or row.encoding is None or row.name not in STATE_DTYPES:
            raise ValueError(f"hidden states must be one of {', '.join(STATE_DTYPES)}, got {dtype}")
        return row.encoding
    encoding = encoding_of_storage(storage)
    if encoding is None:
        raise ValueError(f"unknown storage encoding {storage!r}; use {', '.join(repr(n) for n in STORAGE_CHOICES)}")
    return encoding


def device_quantizer(name: str) -> Quantize:
    """The quantizer the server runs on its device for encoding ``name`` (the host's bytes, exactly)."""
    encoding = get_encoding(name)
    if encoding.device_quantizer is None:
        raise ValueError(f"{name} is a plain encoding: the server stores it as captured")
    return encoding.device_quantizer()
