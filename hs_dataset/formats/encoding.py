"""Host-side work on encoded tensors: encode, decode, check what a server sent, find non-finite values.

Which encodings exist, and everything each one is, lives in the one codec registry
(:mod:`hs_dataset.codecs.registry`); this module applies it to tensors on the host
for the writer, the readers, ``verify`` and the SGLang client. A reader that meets
an encoding the registry lacks refuses instead of misreading.
"""

from __future__ import annotations

import math
import weakref

import numpy
import torch

from hs_dataset.codecs.fp8 import FP8_ENCODING, FP8_MAX, SCALE_SUFFIX
from hs_dataset.codecs.registry import Encoding, get_encoding
from hs_dataset.dtypes import DTYPES, from_torch
from hs_dataset.errors import FormatError, SampleError, UnsupportedFormatError

__all__ = [
    "SAFETENSORS_DTYPES",
    "BadScaleError",
    "accept_encoded_state",
    "all_finite",
    "bad_scales",
    "check_tensor_table",
    "decode_state",
    "encode_state",
    "scale_rule",
    "tensor_bytes",
]

# safetensors dtype code -> torch dtype (the ones this format uses), from the one table in hs_dataset.dtypes.
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {d.safetensors: d.torch for d in DTYPES}


class BadScaleError(SampleError):
    """A pre-encoded state's scales cannot decode (NaN, inf, or outside the encoding's rule): the sample's values are lost."""


def safetensors_dtype(dtype: torch.dtype) -> str:
    row = from_torch(dtype)
    if row is None:
        raise UnsupportedFormatError(f"dtype {dtype} cannot be stored; use one of {sorted(d.name for d in DTYPES)}")
    return row.safetensors


def check_tensor_table(tensors: dict[str, dict], where: str) -> Encoding:
    """Refuse unknown encodings and states stored two ways; returns the state encoding (readers decode with it).

    A dataset of the final state only lists no aux tensor (the manifest checks that against its layer ids).
    """
    for entry in tensors.values():
        get_encoding(entry["encoding"])
    final = tensors["final_hidden_state"]["encoding"]
    aux = tensors.get("aux_hidden_states", {}).get("encoding", final)
    if aux != final:
        raise FormatError(
            f"{where}: aux states are {aux!r} but the final state {final!r}; a dataset stores both one way (restore the manifest)"
        )
    return get_encoding(final)


def encode_state(tensor: torch.Tensor, encoding: Encoding) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Encode a state tensor ``[..., H]`` for storage; returns (data, scale or None)."""
    if not encoding.scaled:
        same = tensor.dtype == encoding.storage_torch_dtype  # no call into torch when there is nothing to do: see _scales_valid
        return (tensor if same else tensor.to(encoding.storage_torch_dtype)).contiguous(), None
    # The one quantizer per encoding, shared with the server, which runs it on the GPU (the registry's).
    return encoding.quantize(tensor)


def bad_scales(scale: torch.Tensor, encoding: Encoding) -> torch.Tensor:
    """Boolean mask of the scales that would decode to inf/NaN (or are otherwise impossible), same shape as ``scale``."""
    return encoding.bad_scales(scale)


def scale_rule(encoding: Encoding) -> str:
    """What a valid scale of ``encoding`` is, in words (for error messages)."""
    return encoding.scale_rule


def accept_encoded_state(
    data: torch.Tensor, scale: torch.Tensor | None, encoding: Encoding, where: str
) -> tuple[torch.Tensor, torch.Tensor]:
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
        raise BadScaleError(f"{where}: {encoding.name} scales must be {scale_rule(encoding)}, and some are not (NaN/inf once decoded)")
    return data.contiguous(), scale.contiguous()


def _scales_valid(scale: torch.Tensor) -> bool:
    """Every scale finite and > 0 (and finite once multiplied by FP8_MAX, as decoding does).

    Host scales are checked by Python's own ``sum``/``min``/``max`` over the float32
    values (a few thousand a sample): torch ops, and numpy ufuncs over more than a few
    hundred values, hand the GIL back, and on the writer's adding thread, which shares
    it with the client's loaders, each hand-back can wait a switch interval: with ten
    such calls a sample, that thread was busy through the whole fp8 ramp
    (``bench_node.py --trace`` shows its time). A NaN or inf makes the float64 sum non-finite;
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
    return encoding.dequantize(data, scale, encoding.decoded_dtype)


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
    """Exponent-bits test on the integer view: faster than torch.isfinite, which could not keep up with the disk.

    A True answer is remembered for this tensor object until it is written in place
    (its version counter moves) or freed, so a check made where the data was just
    read (the SGLang client's loader threads, in parallel, while the bytes are in
    cache) is not paid again by the shard writer's one adding thread, the one that
    loaded samples queue behind (``bench_node.py --trace`` shows its time; the
    writer's cost of the check: docs/FORMAT.md, "Shard hashes").
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
    client's loader threads scan while the writer's threads run): under such
    contention the per-piece scan was many times slower, and on a quiet machine this
    one is no slower.
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
