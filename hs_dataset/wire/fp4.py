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
``[..., H/32]``. Every step is exact or an exact comparison against fixed
thresholds, so the GPU and the host produce the same bytes. stdlib + torch only:
the SGLang server can run the quantizer on the GPU before its device-to-host copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported lazily: this module stays importable with the stdlib alone
    import torch

__all__ = [
    "MXFP4_ENCODING",
    "NF4_ENCODING",
    "GROUP_SIZE",
    "E2M1_LEVELS",
    "NF4_LEVELS",
    "MX_EXPONENT_BIAS",
    "MX_MAX_EXPONENT_BYTE",
    "quantize_mxfp4",
    "dequantize_mxfp4",
    "quantize_nf4",
    "dequantize_nf4",
]

MXFP4_ENCODING = "mxfp4_e2m1_g32"
NF4_ENCODING = "nf4_g32"
GROUP_SIZE = 32  # values sharing one scale
E2M1_LEVELS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of code c (bit 3 is the sign)
E2M1_MAX = 6.0
MX_EXPONENT_BIAS = 127
# Largest stored exponent byte: 6 * 2**(252 - 127) is finite in float32 (and bfloat16),
# 6 * 2**126 is not. Smallest: 0 (2**-127), below which values round to 0.
MX_MAX_EXPONENT_BYTE = MX_EXPONENT_BIAS + 125
# NormalFloat4 levels (QLoRA, Dettmers et al. 2023): code c decodes to NF4_LEVELS[c] * absmax.
NF4_LEVELS = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
)


def _groups(x: "torch.Tensor") -> "torch.Tensor":
    """``x [..., H]`` as float32 ``[..., H/32, 32]`` (H must be a multiple of 32)."""
    if x.shape[-1] % GROUP_SIZE:
        raise ValueError(f"4-bit encodings need a hidden size that is a multiple of {GROUP_SIZE}, got {x.shape[-1]}")
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // GROUP_SIZE, GROUP_SIZE)


def _nearest(values: "torch.Tensor", levels: "torch.Tensor") -> "torch.Tensor":
    """Index of the nearest of the sorted ``levels`` for each value (ties go to the lower level), as uint8."""
    import torch

    midpoints = (levels[1:] + levels[:-1]) * 0.5
    return torch.bucketize(values, midpoints).to(torch.uint8)


def _pack(codes: "torch.Tensor") -> "torch.Tensor":
    """uint8 codes ``[..., H]`` (values < 16) -> bytes ``[..., H/2]``, even index in the low nibble."""
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).contiguous()


def _unpack(packed: "torch.Tensor") -> "torch.Tensor":
    """Inverse of :func:`_pack`: int64 codes ``[..., 2 * W]`` (int64: ready to index a table)."""
    import torch

    low, high = (packed & 0x0F).long(), (packed >> 4).long()
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _mx_exponents(amax: "torch.Tensor") -> "torch.Tensor":
    """The smallest power-of-two exponent ``j`` with ``amax <= 6 * 2**j``, exactly, clamped to the stored range.

    With ``amax = m * 2**k`` (``m`` in [0.5, 1), frexp), ``6 * 2**(k-3) = 0.75 * 2**k``:
    ``j = k - 3`` when ``m <= 0.75``, else ``k - 2``. Integer arithmetic only, so it
    is the same on every device.
    """
    import torch

    mantissa, exponent = torch.frexp(amax)
    j = exponent.to(torch.int32) - 3 + (mantissa > 0.75).to(torch.int32)
    return j.clamp_(-MX_EXPONENT_BIAS, MX_MAX_EXPONENT_BYTE - MX_EXPONENT_BIAS)


def quantize_mxfp4(x: "torch.Tensor") -> "tuple[torch.Tensor, torch.Tensor]":
    """``x [..., H]`` -> (uint8 codes ``[..., H/2]``, uint8 exponents ``[..., H/32]``), on x's device.

    The one implementation of ``mxfp4_e2m1_g32`` (the server can call it on the GPU).
    """
    import torch

    groups = _groups(x)
    low, high = torch.aminmax(groups, dim=-1)
    j = _mx_exponents(torch.maximum(-low, high))
    # x * 2**-j is exact (a power of two, results within float32's normal range)
    scaled = groups * torch.ldexp(torch.ones_like(j, dtype=torch.float32), -j).unsqueeze(-1)
    levels = torch.tensor(E2M1_LEVELS, dtype=torch.float32, device=x.device)
    codes = _nearest(scaled.abs().clamp_(max=E2M1_MAX), levels) | ((scaled < 0).to(torch.uint8) << 3)
    return _pack(codes.reshape(x.shape)), (j + MX_EXPONENT_BIAS).to(torch.uint8).contiguous()


def dequantize_mxfp4(codes: "torch.Tensor", exponents: "torch.Tensor", dtype: "torch.dtype") -> "torch.Tensor":
    """Inverse of :func:`quantize_mxfp4`, back to ``dtype``: ``level[code] * 2**(e - 127)`` per group."""
    import torch

    magnitudes = torch.tensor(E2M1_LEVELS, dtype=torch.float32, device=codes.device)
    table = torch.cat((magnitudes, -magnitudes))  # code = sign << 3 | magnitude index
    values = table[_unpack(codes)]
    groups = values.reshape(*exponents.shape, GROUP_SIZE)
    scale = torch.ldexp(torch.ones_like(exponents, dtype=torch.float32), exponents.to(torch.int32) - MX_EXPONENT_BIAS)
    return (groups * scale.unsqueeze(-1)).reshape(values.shape).to(dtype)


def quantize_nf4(x: "torch.Tensor") -> "tuple[torch.Tensor, torch.Tensor]":
    """``x [..., H]`` -> (uint8 codes ``[..., H/2]``, bfloat16 absmax ``[..., H/32]``), on x's device.

    The scale is the group's absmax rounded to bfloat16 (the value that decodes);
    values are divided by that rounded scale and clamped to [-1, 1], so a scale that
    rounded down costs at most its rounding (2**-9 relative), never an overflow.
    """
    import torch

    groups = _groups(x)
    low, high = torch.aminmax(groups, dim=-1)
    amax = torch.maximum(-low, high).clamp_(max=torch.finfo(torch.bfloat16).max)  # bfloat16 inputs never clamp
    scale = amax.to(torch.bfloat16)
    safe = torch.where(scale > 0, scale.float(), torch.ones_like(scale, dtype=torch.float32))
    normed = torch.div(groups, safe.unsqueeze(-1)).clamp_(-1.0, 1.0)
    levels = torch.tensor(NF4_LEVELS, dtype=torch.float32, device=x.device)
    return _pack(_nearest(normed, levels).reshape(x.shape)), scale.contiguous()


def dequantize_nf4(codes: "torch.Tensor", scale: "torch.Tensor", dtype: "torch.dtype") -> "torch.Tensor":
    """Inverse of :func:`quantize_nf4`, back to ``dtype``: ``NF4_LEVELS[code] * absmax`` per group."""
    import torch

    table = torch.tensor(NF4_LEVELS, dtype=torch.float32, device=codes.device)
    values = table[_unpack(codes)]
    groups = values.reshape(*scale.shape, GROUP_SIZE)
    return (groups * scale.float().unsqueeze(-1)).reshape(values.shape).to(dtype)
