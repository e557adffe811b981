"""How each stored tensor is encoded, so readers never guess.

Every tensor the format stores has an *encoding* recorded in the manifest. Plain
encodings map one-to-one to a safetensors dtype. ``fp8_e4m3_per_token`` stores the
state as float8 (e4m3) plus one float32 scale per token (and per aux layer), halving
the bytes of a bf16 capture; ``mxfp4_e2m1_g32`` and ``nf4_g32`` store 4-bit codes two
a byte plus one scale per 32 values (0.266 and 0.281 of bf16's bytes, ``wire/fp4.py``).
Readers decode them back to bf16. A reader that meets an encoding it does not know
refuses instead of misreading.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy
import torch

from hs_dataset.dtypes import DTYPES, STATE_DTYPES, dtype_info, from_torch
from hs_dataset.errors import FormatError, UnsupportedFormatError
from hs_dataset.codecs.fp4 import (
    GROUP_SIZE,
    MX_MAX_EXPONENT_BYTE,
    MXFP4_ENCODING,
    NF4_ENCODING,
    dequantize_mxfp4,
    dequantize_nf4,
    quantize_mxfp4,
    quantize_nf4,
)
from hs_dataset.codecs.fp8 import FP8_ENCODING, FP8_MAX, SCALE_SUFFIX, dequantize_fp8_per_token, quantize_fp8_per_token
from hs_dataset.codecs.storage import STORAGE_NAMES

__all__ = [
    "Encoding",
    "ENCODINGS",
    "SAFETENSORS_DTYPES",
    "get_encoding",
    "check_tensor_table",
    "state_encoding_for",
    "encode_state",
    "accept_encoded_state",
    "decode_state",
    "bad_scales",
    "scale_rule",
    "SCALE_SUFFIX",
    "tensor_bytes",
    "all_finite",
    "FP8_MAX",
]

# safetensors dtype code -> torch dtype (the ones this format uses), from the one table in hs_dataset.dtypes.
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {d.safetensors: d.torch for d in DTYPES}


def safetensors_dtype(dtype: torch.dtype) -> str:
    row = from_torch(dtype)
    if row is None:
        raise UnsupportedFormatError(f"dtype {dtype} cannot be stored; use one of {sorted(d.name for d in DTYPES)}")
    return row.safetensors


@dataclass(frozen=True)
class Encoding:
    """A named storage encoding of one logical tensor.

    A scaled encoding stores a state ``[..., H]`` as data ``[..., H / pack]`` plus a
    companion ``<key>.scale`` tensor: one scale per row ``[...]`` (``group`` 0) or one
    per ``group`` values ``[..., H / group]``.
    """

    name: str
    storage_dtype: str  # safetensors dtype code of the main data
    decoded_dtype: torch.dtype  # what readers hand out
    scaled: bool = False  # a companion ``<key>.scale`` tensor exists
    scale_dtype: str = "F32"  # safetensors dtype code of the scales
    group: int = 0  # values per scale along the last dimension; 0: one scale per row
    pack: int = 1  # values per stored element along the last dimension

    @property
    def storage_torch_dtype(self) -> torch.dtype:
        return SAFETENSORS_DTYPES[self.storage_dtype]

    @property
    def scale_torch_dtype(self) -> torch.dtype:
        return SAFETENSORS_DTYPES[self.scale_dtype]

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The stored data's shape for a state of logical ``shape`` ``[..., H]``."""
        return (*shape[:-1], shape[-1] // self.pack)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The scale tensor's shape for a state of logical ``shape`` ``[..., H]``."""
        return tuple(shape[:-1]) if not self.group else (*shape[:-1], shape[-1] // self.group)

    def row_bytes(self, hidden_size: int) -> int:
        """Stored bytes of one ``[H]`` row, scales included."""
        data = hidden_size // self.pack * self.storage_torch_dtype.itemsize
        if not self.scaled:
            return data
        return data + (hidden_size // self.group if self.group else 1) * self.scale_torch_dtype.itemsize

    def hidden_size_problem(self, hidden_size: int) -> str:
        """Why states of this hidden size cannot be stored this way; empty when they can."""
        step = max(self.group, self.pack)
        if hidden_size % step:
            return f"{self.name} stores groups of {step} values; hidden size {hidden_size} is not a multiple of {step}: use --storage fp8 or native"
        return ""


@dataclass(frozen=True)
class _Codec:
    """A scaled encoding's quantizer, dequantizer and scale check (bad-scale mask, same shape as the scales)."""

    quantize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    dequantize: Callable[[torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]
    bad_scales: Callable[[torch.Tensor], torch.Tensor]
    rule: str  # what a valid scale is, in words


_U8, _BF16 = dtype_info("uint8").safetensors, dtype_info("bfloat16").safetensors

ENCODINGS: dict[str, Encoding] = {
    # plain: one per dtype the table gives an encoding name (int64, bool, bf16, f16, f32)
    **{d.encoding: Encoding(d.encoding, d.safetensors, d.torch) for d in DTYPES if d.encoding},
    # decoded dtype is bf16: the scaled encodings are opt-in storage reductions of bf16 captures.
    FP8_ENCODING: Encoding(FP8_ENCODING, dtype_info("float8_e4m3fn").safetensors, torch.bfloat16, scaled=True),
    MXFP4_ENCODING: Encoding(MXFP4_ENCODING, _U8, torch.bfloat16, scaled=True, scale_dtype=_U8, group=GROUP_SIZE, pack=2),
    NF4_ENCODING: Encoding(NF4_ENCODING, _U8, torch.bfloat16, scaled=True, scale_dtype=_BF16, group=GROUP_SIZE, pack=2),
}

_CODECS: dict[str, _Codec] = {
    FP8_ENCODING: _Codec(
        quantize_fp8_per_token, dequantize_fp8_per_token, lambda s: ~(torch.isfinite(s * FP8_MAX) & (s > 0)), "finite and > 0"
    ),
    MXFP4_ENCODING: _Codec(quantize_mxfp4, dequantize_mxfp4, lambda s: s > MX_MAX_EXPONENT_BYTE, f"exponent bytes <= {MX_MAX_EXPONENT_BYTE}"),
    NF4_ENCODING: _Codec(quantize_nf4, dequantize_nf4, lambda s: ~(torch.isfinite(s) & (s >= 0)), "finite and >= 0"),
}

# ``storage:`` card values -> encoding names
_PLAIN_STATE_ENCODINGS = {dtype_info(name).torch: dtype_info(name).encoding for name in STATE_DTYPES}


def get_encoding(name: str) -> Encoding:
    try:
        return ENCODINGS[name]
    except KeyError:
        raise UnsupportedFormatError(
            f"unknown tensor encoding {name!r}: this data was written by a newer hs_dataset; "
            f"upgrade hs_dataset (known encodings: {sorted(ENCODINGS)})"
        ) from None


def check_tensor_table(tensors: dict[str, dict], where: str) -> Encoding:
    """Refuse unknown encodings and states stored two ways; returns the state encoding (readers decode with it)."""
    for entry in tensors.values():
        get_encoding(entry["encoding"])
    aux, final = tensors["aux_hidden_states"]["encoding"], tensors["final_hidden_state"]["encoding"]
    if aux != final:
        raise FormatError(f"{where}: aux states are {aux!r} but the final state {final!r}; a dataset stores both one way (restore the manifest)")
    return get_encoding(aux)


def state_encoding_for(dtype: torch.dtype, storage: str | None = None) -> str:
    """The encoding name for hidden states captured in ``dtype`` (``storage='fp8'``, ``'mxfp4'``, ``'nf4'`` opt in)."""
    if storage in (None, "", "native"):
        try:
            return _PLAIN_STATE_ENCODINGS[dtype]
        except KeyError:
            raise ValueError(f"hidden states must be bf16, f16 or f32, got {dtype}") from None
    if storage in STORAGE_NAMES.values():
        return storage
    if storage in STORAGE_NAMES:
        return STORAGE_NAMES[storage]
    raise ValueError(f"unknown storage encoding {storage!r}; use 'native', {', '.join(repr(n) for n in STORAGE_NAMES)}")


def encode_state(tensor: torch.Tensor, encoding: Encoding) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Encode a state tensor ``[..., H]`` for storage; returns (data, scale or None)."""
    if not encoding.scaled:
        same = tensor.dtype == encoding.storage_torch_dtype  # no call into torch when there is nothing to do: see _scales_valid
        return (tensor if same else tensor.to(encoding.storage_torch_dtype)).contiguous(), None
    # The one quantizer per encoding, shared with the server, which runs it on the GPU (``wire/``).
    return _CODECS[encoding.name].quantize(tensor)


def bad_scales(scale: torch.Tensor, encoding: Encoding) -> torch.Tensor:
    """Boolean mask of the scales that would decode to inf/NaN (or are otherwise impossible), same shape as ``scale``."""
    return _CODECS[encoding.name].bad_scales(scale)


def scale_rule(encoding: Encoding) -> str:
    """What a valid scale of ``encoding`` is, in words (for error messages)."""
    return _CODECS[encoding.name].rule


def accept_encoded_state(data: torch.Tensor, scale: torch.Tensor | None, encoding: Encoding, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """States the server already encoded (fp8 on its GPU): checked, then stored as they are.

    Why: quantizing again on the host would cost a decode and a second rounding for
    nothing (the server ran the same :func:`quantize_fp8_per_token`). Raises
    ``ValueError`` naming the problem; the writer turns it into a ``SampleError``.
    """
    if not encoding.scaled:
        raise ValueError(
            f"{where}: the server sent states already encoded but this dataset stores {encoding.name}: "
            "build with the --storage the server encodes (the card's shards.storage), or serve with native staging"
        )
    if data.dtype != encoding.storage_torch_dtype:
        raise ValueError(f"{where}: pre-encoded states are {data.dtype}, {encoding.name} stores {encoding.storage_torch_dtype}")
    logical = (*data.shape[:-1], data.shape[-1] * encoding.pack)
    want = encoding.scale_shape(logical)
    if scale is None or scale.dtype != encoding.scale_torch_dtype or tuple(scale.shape) != want:
        got = "none" if scale is None else f"{scale.dtype} {tuple(scale.shape)}"
        raise ValueError(f"{where}: {encoding.name} needs {encoding.scale_torch_dtype} scales of shape {want}, got {got}")
    valid = _scales_valid(scale) if encoding.name == FP8_ENCODING else not bool(bad_scales(scale, encoding).any())
    if scale.numel() and not valid:
        raise ValueError(f"{where}: {encoding.name} scales must be {scale_rule(encoding)}")
    return data.contiguous(), scale.contiguous()


def _scales_valid(scale: torch.Tensor) -> bool:
    """Every scale finite and > 0 (and finite once multiplied by FP8_MAX, as decoding does).

    Host scales are checked by Python's own ``sum``/``min``/``max`` over the float32
    values (a few thousand a sample): torch ops, and numpy ufuncs over more than a few
    hundred values, hand the GIL back, and on the writer's adding thread, which shares
    it with the client's loaders, each hand-back can wait a switch interval: with ten
    such calls a sample, that thread was busy through the whole fp8 ramp on the H200
    host (``bench_node.py --trace``). A NaN or inf makes the float64 sum non-finite;
    finite float32 values cannot.
    """
    if scale.device.type == "cpu" and not scale.requires_grad and scale.dtype == torch.float32 and scale.is_contiguous():
        values = memoryview(scale.numpy()).cast("B").cast("f")
        return math.isfinite(sum(values)) and min(values) > 0 and max(values) * FP8_MAX <= _FLOAT32_MAX
    return bool(((scale > 0) & torch.isfinite(scale * FP8_MAX)).all())


def decode_state(data: torch.Tensor, scale: torch.Tensor | None, encoding: Encoding) -> torch.Tensor:
    """Inverse of :func:`encode_state`; plain encodings come back as the same (zero-copy) tensor."""
    if not encoding.scaled:
        return data
    if scale is None:
        raise UnsupportedFormatError(f"encoding {encoding.name} needs a '{SCALE_SUFFIX}' tensor but none is stored")
    return _CODECS[encoding.name].dequantize(data, scale, encoding.decoded_dtype)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor (made contiguous), as a flat memoryview; no copy when already contiguous."""
    flat = t.contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


# A float is inf/NaN exactly when its exponent bits are all ones. Read as integers, those
# patterns are the largest ones: with the sign bit clear, the largest *signed* values (from
# the first one given here up); with it set, the largest *unsigned* values (the same
# pattern with the sign bit). Per float dtype: (signed integer view, its unsigned numpy
# twin, the sign bit, the first non-finite pattern with the sign clear).
_NONFINITE_BITS = {
    torch.bfloat16: (torch.int16, numpy.uint16, 0x8000, 0x7F80),
    torch.float16: (torch.int16, numpy.uint16, 0x8000, 0x7C00),
    torch.float32: (torch.int32, numpy.uint32, 0x80000000, 0x7F800000),
    torch.float8_e4m3fn: (torch.int8, numpy.uint8, 0x80, 0x7F),  # no inf in e4m3fn; NaN is S.1111.111
}
_CHECK_CHUNK = 1 << 18  # elements per piece off the host (see _scan_finite_in_pieces): keeps the temporary in cache


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)

# Tensors found finite, by id: a weak reference (the entry goes when the tensor does) and
# what the tensor was then. Not a WeakKeyDictionary: it compares keys with ==, which a
# tensor answers element-wise.
_FOUND_FINITE: dict[int, tuple[weakref.ref, tuple]] = {}


def _as_checked(state: torch.Tensor) -> tuple:
    """What must be unchanged for an earlier check to still hold: torch bumps ``_version`` on every in-place write."""
    return (state._version, state.data_ptr(), tuple(state.shape), state.stride(), state.dtype)


def all_finite(state: torch.Tensor) -> bool:
    """Exponent-bits test on the integer view: ~3x faster than torch.isfinite, which was slower than disk.

    A True answer is remembered for this tensor object until it is written in place
    (its version counter moves) or freed, so a check made where the data was just
    read (the SGLang client's loader threads, in parallel, while the bytes are in
    cache) is not paid again by the shard writer's one adding thread, which
    ``bench_node.py --trace`` showed busy the whole ramp with loaded samples queuing
    behind it.
    """
    if state.is_inference():  # no version counter to tell an in-place write: always scanned
        return _scan_finite(state)
    known = _FOUND_FINITE.get(id(state))
    if known is not None and known[0]() is state and known[1] == _as_checked(state):
        return True
    finite = _scan_finite(state)
    if finite:
        _remember_finite(state)
    return finite


def _remember_finite(state: torch.Tensor) -> None:
    key = id(state)
    known = _FOUND_FINITE.get(key)
    ref = known[0] if known is not None and known[0]() is state else weakref.ref(state, lambda _ref, key=key: _FOUND_FINITE.pop(key, None))
    _FOUND_FINITE[key] = (ref, _as_checked(state))


def _scan_finite(state: torch.Tensor) -> bool:
    """No inf/NaN in ``state``: on the host, two ``max`` reductions over integer views of its memory.

    Why this shape: each is one numpy call that reads the memory once, needs no
    temporary and runs with the GIL released, so a scan hands the GIL back twice per
    state. The masked scan it replaced did so twice per 256K-value piece, and each
    hand-back can wait a switch interval while other threads want the GIL (the SGLang
    client's loader threads scan while the writer's threads run): with 4 threads
    spinning in Python on this 2-core machine a bf16 state of 11M values took 1.4 s
    that way, against 0.05 s now; quiet, it is as fast (27 GB/s; fp8 47 against 31).
    """
    spec = _NONFINITE_BITS.get(state.dtype)
    if spec is None:
        return bool(torch.isfinite(state.float() if state.dtype == torch.float8_e4m3fn else state).all())
    if state.numel() == 0:
        return True
    if state.device.type != "cpu":
        return _scan_finite_in_pieces(state, spec)
    signed_dtype, unsigned_dtype, sign, first_nonfinite = spec
    signed = (state.detach() if state.requires_grad else state).view(signed_dtype).numpy()
    return bool(signed.max() < first_nonfinite and signed.view(unsigned_dtype).max() < (first_nonfinite | sign))


def _scan_finite_in_pieces(state: torch.Tensor, spec: tuple) -> bool:
    """The same test off the host (torch has no unsigned views there): mask the sign, compare, per piece."""
    signed_dtype, _unsigned, sign, first_nonfinite = spec
    flat = state.detach().reshape(-1).view(signed_dtype)
    buf = torch.empty(min(_CHECK_CHUNK, flat.numel()), dtype=signed_dtype, device=flat.device)
    for start in range(0, flat.shape[0], _CHECK_CHUNK):
        chunk = flat[start : start + _CHECK_CHUNK]
        out = buf[: chunk.shape[0]]
        torch.bitwise_and(chunk, sign - 1, out=out)
        if int(out.max()) >= first_nonfinite:
            return False
    return True
