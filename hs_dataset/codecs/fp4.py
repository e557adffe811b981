"""The 4-bit state encodings: two codes a byte, one shared scale per group of 32 values.

``mxfp4_e2m1_g32`` (MX-style): each value is an e2m1 float code (sign, 2 exponent
bits, 1 mantissa bit: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6) times its group's scale
``2**(e - 127)``, ``e`` one uint8 per 32 values. The scale is the smallest power of
two with ``amax <= 6 * scale`` (the OCP MX rule ``floor(log2 amax) - 2`` clips the
group's largest values, which in hidden states are the outlier channels that matter),
so no value is clipped. 4.25 bits a value: 0.266 of bf16's bytes.

``nf4_g32``: each value is one of the 16 NormalFloat levels (quantiles of a normal
distribution, QLoRA's NF4) times its group's absmax, stored as one bfloat16 per 32
values. 4.5 bits a value: 0.281 of bf16's bytes.

Codes are packed two per byte along the hidden dimension, the even index in the low
nibble: a state ``[..., H]`` is stored as uint8 codes ``[..., H/2]`` and scales
``[..., H/32]``. Every step is exact, an IEEE-rounded operation or a table lookup,
so the GPU and the host produce the same bytes. stdlib + torch only: the SGLang
server can run the quantizer on the GPU before its device-to-host copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported lazily: this module stays importable with the stdlib alone
    import torch

__all__ = [
    "E2M1_LEVELS",
    "GROUP_SIZE",
    "MXFP4_ENCODING",
    "MX_EXPONENT_BIAS",
    "MX_MAX_EXPONENT_BYTE",
    "MX_NONFINITE_BYTE",
    "NF4_ENCODING",
    "NF4_LEVELS",
    "bad_mx_exponents",
    "bad_nf4_scales",
    "code_table",
    "dequantize_mxfp4",
    "dequantize_nf4",
    "quantize_mxfp4",
    "quantize_nf4",
]

MXFP4_ENCODING = "mxfp4_e2m1_g32"
NF4_ENCODING = "nf4_g32"
GROUP_SIZE = 32  # values sharing one scale
E2M1_LEVELS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of code c (bit 3 is the sign)
MX_EXPONENT_BIAS = 127
# Largest stored exponent byte: 6 * 2**(252 - 127) is finite in float32 (and bfloat16),
# 6 * 2**126 is not. Smallest: 0 (2**-127), below which values round to 0.
MX_MAX_EXPONENT_BYTE = MX_EXPONENT_BIAS + 125
# The exponent byte of a group that held inf or NaN: invalid (> MX_MAX_EXPONENT_BYTE), so
# such a group is refused wherever scales are checked instead of being stored clipped.
MX_NONFINITE_BYTE = 255
# NormalFloat4 levels (QLoRA, Dettmers et al. 2023): code c decodes to bf16(NF4_LEVELS[c]) * absmax.
NF4_LEVELS = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)


def _groups(x: torch.Tensor) -> torch.Tensor:
    """``x [..., H]`` as ``[..., H/32, 32]`` (H must be a multiple of 32), in x's dtype (a view)."""
    if x.shape[-1] % GROUP_SIZE:
        raise ValueError(f"4-bit encodings need a hidden size that is a multiple of {GROUP_SIZE}, got {x.shape[-1]}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // GROUP_SIZE, GROUP_SIZE)


# Per device, built once: bf16 bit pattern -> code (65536 uint8), and byte -> its two decoded values (256 x 2 bf16).
_TABLES: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _tables(name: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(code of every bfloat16 value, the two bfloat16 values of every byte) for encoding ``name`` on ``device``.

    Why tables: the nearest level is then one gather per value (a binary search over
    the levels, ``torch.bucketize``, was the quantizer's bottleneck), and decoding one
    gather per byte, the same on every device. The code table is built by that search
    once: the nearest level, ties to the lower one.
    """
    import torch

    key = (name, str(device))
    if key not in _TABLES:
        if name == MXFP4_ENCODING:
            magnitudes = torch.tensor(E2M1_LEVELS, dtype=torch.float32)
            decoded = torch.cat((magnitudes, -magnitudes))  # code = sign << 3 | magnitude index
        else:
            decoded = torch.tensor(NF4_LEVELS, dtype=torch.float32).to(torch.bfloat16).float()
        levels = torch.unique(decoded)  # ascending; -0 and +0 are one level, coded 0
        code_of_level = torch.tensor([int((decoded == v).nonzero()[0]) for v in levels.tolist()], dtype=torch.uint8)
        patterns = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32)
        every = torch.nan_to_num(patterns.to(torch.int16).view(torch.bfloat16).float(), nan=0.0)  # NaN never reaches a shard
        nearest = torch.bucketize(every, (levels[1:] + levels[:-1]) * 0.5)  # beyond the last level: the last level
        codes = torch.empty(1 << 16, dtype=torch.uint8)
        codes[patterns.bitwise_and(0xFFFF).long()] = code_of_level[nearest]
        values = decoded.to(torch.bfloat16)
        pairs = torch.stack((values.repeat(16), values.repeat_interleave(16)), dim=1)  # byte b: (value of b & 15, of b >> 4)
        _TABLES[key] = (codes.to(device), pairs.to(device))
    return _TABLES[key]


def code_table(name: str, device: torch.device) -> torch.Tensor:
    """The code of every bfloat16 bit pattern (65536 uint8, indexed by the pattern as unsigned) on ``device``.

    Public for the server's fused GPU quantizer, which must pick codes from the same
    table to give the same bytes.
    """
    return _tables(name, device)[0]


def _codes(name: str, scaled: torch.Tensor) -> torch.Tensor:
    """uint8 codes of bfloat16 values (any shape): the nearest level of each, from the table."""
    import torch

    table = code_table(name, scaled.device)
    bits = scaled.contiguous().view(torch.int16).to(torch.int32).bitwise_and_(0xFFFF)
    return table.index_select(0, bits.reshape(-1)).view(scaled.shape)


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes ``[..., H]`` (values < 16) -> bytes ``[..., H/2]``, even index in the low nibble."""
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).contiguous()


def _decode_pairs(name: str, packed: torch.Tensor, group_shape: tuple[int, ...]) -> torch.Tensor:
    """bfloat16 levels ``[..., H/32, 32]`` of packed codes ``[..., H/2]``: one gather per byte."""
    import torch

    _, pairs = _tables(name, packed.device)
    return pairs.index_select(0, packed.reshape(-1).to(torch.int32)).view(*group_shape, GROUP_SIZE)


def _mx_exponents(amax: torch.Tensor) -> torch.Tensor:
    """The smallest power-of-two exponent ``j`` with ``amax <= 6 * 2**j``, exactly, clamped to the stored range.

    With ``amax = m * 2**k`` (``m`` in [0.5, 1), frexp), ``6 * 2**(k-3) = 0.75 * 2**k``:
    ``j = k - 3`` when ``m <= 0.75``, else ``k - 2``. Integer arithmetic only, so it
    is the same on every device.
    """
    import torch

    mantissa, exponent = torch.frexp(amax)
    j = exponent.to(torch.int32) - 3 + (mantissa > 0.75).to(torch.int32)
    return j.clamp_(-MX_EXPONENT_BIAS, MX_MAX_EXPONENT_BYTE - MX_EXPONENT_BIAS)


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., H]`` -> (uint8 codes ``[..., H/2]``, uint8 exponents ``[..., H/32]``), on x's device.

    The one implementation of ``mxfp4_e2m1_g32`` (the server can call it on the GPU).
    Each value is scaled by ``2**-j`` (exact) and rounded to bfloat16 (exact for
    bfloat16 states), then takes the code of its nearest e2m1 level. A group holding
    inf or NaN gets the invalid exponent byte :data:`MX_NONFINITE_BYTE` (so it is
    refused, never stored clipped) and the codes of its values unscaled.
    """
    import torch

    groups = _groups(x)
    low, high = torch.aminmax(groups, dim=-1)
    amax = torch.maximum(-low, high).float()
    finite = torch.isfinite(amax)
    j = torch.where(finite, _mx_exponents(torch.where(finite, amax, 0.0)), 0)  # a non-finite group: scale 1, marked below
    factor = torch.ldexp(torch.ones_like(j, dtype=torch.float32), -j).unsqueeze(-1)
    # bfloat16 times a power of two in range: exact, and half the bytes of float32
    scaled = groups * factor.to(torch.bfloat16) if x.dtype == torch.bfloat16 else (groups.float() * factor).to(torch.bfloat16)
    exponents = torch.where(finite, j + MX_EXPONENT_BIAS, MX_NONFINITE_BYTE).to(torch.uint8)
    return _pack(_codes(MXFP4_ENCODING, scaled).reshape(x.shape)), exponents.contiguous()


def dequantize_mxfp4(codes: torch.Tensor, exponents: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`quantize_mxfp4`, back to ``dtype``: ``level[code] * 2**(e - 127)`` per group.

    Computed in bfloat16, exactly: a level (at most 2 significant bits) times a power of
    two within bfloat16's range.
    """
    import torch

    levels = _decode_pairs(MXFP4_ENCODING, codes, tuple(exponents.shape))
    scale = torch.ldexp(torch.ones_like(exponents, dtype=torch.float32), exponents.to(torch.int32) - MX_EXPONENT_BIAS)
    out = (levels * scale.to(torch.bfloat16).unsqueeze(-1)).view(*codes.shape[:-1], codes.shape[-1] * 2)
    return out if dtype == torch.bfloat16 else out.to(dtype)


def quantize_nf4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., H]`` -> (uint8 codes ``[..., H/2]``, bfloat16 absmax ``[..., H/32]``), on x's device.

    The scale ``s`` is the group's absmax rounded to bfloat16 (the value that decodes).
    Each value takes the code of the level nearest to ``bf16(clamp(x / s, -1, 1))``
    (IEEE float32 division): a scale that rounded down costs at most its rounding
    (2**-9 relative), never an overflow. A group holding inf or NaN keeps an inf or
    NaN scale, which every scale check refuses.
    """
    import torch

    groups = _groups(x)
    low, high = torch.aminmax(groups, dim=-1)
    amax = torch.maximum(-low, high).float()
    # A finite float32 amax beyond bfloat16's range clamps (bfloat16 inputs never do); inf or NaN
    # stays, an invalid scale, so the group is refused instead of stored clipped.
    scale = torch.where(torch.isfinite(amax), amax.clamp(max=torch.finfo(torch.bfloat16).max), amax).to(torch.bfloat16)
    safe = torch.where(scale > 0, scale.float(), torch.ones_like(amax))
    normed = torch.div(groups.float(), safe.unsqueeze(-1)).clamp_(-1.0, 1.0).to(torch.bfloat16)
    return _pack(_codes(NF4_ENCODING, normed).reshape(x.shape)), scale.contiguous()


def dequantize_nf4(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`quantize_nf4`, back to ``dtype``: ``bf16(NF4_LEVELS[code]) * absmax``, rounded once to bfloat16."""
    import torch

    levels = _decode_pairs(NF4_ENCODING, codes, tuple(scale.shape))
    out = (levels * scale.unsqueeze(-1)).view(*codes.shape[:-1], codes.shape[-1] * 2)
    return out if dtype == torch.bfloat16 else out.to(dtype)


def bad_mx_exponents(exponents: torch.Tensor) -> torch.Tensor:
    """Mask of the exponent bytes no finite group has: above :data:`MX_MAX_EXPONENT_BYTE` (a non-finite group's mark)."""
    return exponents > MX_MAX_EXPONENT_BYTE


def bad_nf4_scales(scale: torch.Tensor) -> torch.Tensor:
    """Mask of the absmax scales that cannot decode: negative, inf or NaN."""
    import torch

    return ~(torch.isfinite(scale) & (scale >= 0))
