"""The 4-bit quantizers fused into one GPU kernel: the same bytes as ``codecs/fp4.py``, in one pass over the states.

Why: the reference quantizers (:func:`~hs_dataset.codecs.fp4.quantize_nf4`,
:func:`~hs_dataset.codecs.fp4.quantize_mxfp4`) are a dozen torch operations, each a
full pass over the states in memory, and at a Kimi node's prefill rate they cost the
forward thread more than the capture's 3% target on prefill (docs/BENCHMARKS.md: the
node path with nf4 states, ``benchmarks/bench_node.py``). This Triton kernel reads each bfloat16 value once and writes its nibble and its group's
scale, with the same IEEE-rounded steps (float32 division rounded to nearest, the
round to bfloat16, the exact power-of-two exponent from the float's bits) and the
same code table, so its bytes equal the reference's (``tests/server_patch/test_fp4_kernel.py``
runs both on CUDA, edge cases included).

Used only for contiguous bfloat16 states on a CUDA device with Triton importable
(every SGLang GPU install has it); anything else takes the reference quantizer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hs_dataset.codecs.fp4 import (
    GROUP_SIZE,
    MX_EXPONENT_BIAS,
    MX_MAX_EXPONENT_BYTE,
    MX_NONFINITE_BYTE,
    MXFP4_ENCODING,
    NF4_ENCODING,
    code_table,
)

__all__ = ["fused_quantizer"]

_GROUPS_PER_PROGRAM = 64  # 2048 values (4 KiB of bfloat16) per program


try:  # every SGLang GPU install has Triton; the CPU installs do not, and take the reference quantizers
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:

    @triton.jit
    def quantize_groups(
        x_ptr,
        codes_ptr,
        scales_ptr,
        table_ptr,
        n_groups,
        MX: tl.constexpr,
        BLOCK: tl.constexpr,
        MX_BIAS: tl.constexpr,
        MX_TOP: tl.constexpr,
        MX_BAD: tl.constexpr,
        BF16_MAX: tl.constexpr,
        F32_MAX: tl.constexpr,
    ):
        g = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = (g < n_groups)[:, None]
        pair = g[:, None] * 16 + tl.arange(0, 16)[None, :]  # byte index: values 2*pair and 2*pair + 1
        even = tl.load(x_ptr + 2 * pair, mask=live, other=0.0).to(tl.float32)
        odd = tl.load(x_ptr + 2 * pair + 1, mask=live, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(even), axis=1), tl.max(tl.abs(odd), axis=1))
        has_nan = tl.max(((even != even) | (odd != odd)).to(tl.int32), axis=1) > 0
        nan = tl.full([BLOCK], 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)
        amax = tl.where(has_nan, nan, amax)  # a NaN anywhere makes the group's amax NaN, as torch.aminmax does
        finite = amax <= F32_MAX  # false for inf and NaN
        if MX:
            bits = amax.to(tl.int32, bitcast=True)
            biased = (bits >> 23) & 0xFF
            # frexp(amax) = m * 2**k: k = biased - 126 for a normal float, and m > 0.75 <=> mantissa > 0x400000
            j = biased - 126 - 3 + ((bits & 0x7FFFFF) > 0x400000).to(tl.int32)
            # frexp(0) = (0, 0) gives -3; a subnormal has k <= -126, which clamps to -127 below
            j = tl.where(biased == 0, tl.where(amax == 0.0, -3, -MX_BIAS), j)
            j = tl.minimum(tl.maximum(j, -MX_BIAS), MX_TOP - MX_BIAS)
            j = tl.where(finite, j, 0)
            factor = ((MX_BIAS - j) << 23).to(tl.float32, bitcast=True)[:, None]  # 2**-j, a normal float32
            scale_out = tl.where(finite, j + MX_BIAS, MX_BAD).to(tl.uint8)
            u_even = (even * factor).to(tl.bfloat16)
            u_odd = (odd * factor).to(tl.bfloat16)
        else:
            scale_out = tl.where(finite, tl.minimum(amax, BF16_MAX), amax).to(tl.bfloat16)
            s = scale_out.to(tl.float32)
            safe = tl.where(s > 0.0, s, 1.0)[:, None]
            n_even = tl.math.div_rn(even, safe)  # IEEE division, as torch's
            n_odd = tl.math.div_rn(odd, safe)
            n_even = tl.where(n_even > 1.0, 1.0, tl.where(n_even < -1.0, -1.0, n_even))  # NaN stays NaN, as torch's clamp
            n_odd = tl.where(n_odd > 1.0, 1.0, tl.where(n_odd < -1.0, -1.0, n_odd))
            u_even = n_even.to(tl.bfloat16)
            u_odd = n_odd.to(tl.bfloat16)
        c_even = tl.load(table_ptr + (u_even.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF), mask=live, other=0)
        c_odd = tl.load(table_ptr + (u_odd.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF), mask=live, other=0)
        tl.store(codes_ptr + pair, c_even | (c_odd << 4), mask=live)
        tl.store(scales_ptr + g, scale_out, mask=g < n_groups)


def _run(name: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes ``[..., H/2]`` and scales ``[..., H/32]`` of contiguous bfloat16 CUDA states ``x [..., H]``."""
    if x.shape[-1] % GROUP_SIZE:
        raise ValueError(f"4-bit encodings need a hidden size that is a multiple of {GROUP_SIZE}, got {x.shape[-1]}")
    mx = name == MXFP4_ENCODING
    codes = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(*x.shape[:-1], x.shape[-1] // GROUP_SIZE, dtype=torch.uint8 if mx else torch.bfloat16, device=x.device)
    n_groups = x.numel() // GROUP_SIZE
    if n_groups:
        grid = (-(-n_groups // _GROUPS_PER_PROGRAM),)
        quantize_groups[grid](
            x,
            codes,
            scales,
            code_table(name, x.device),
            n_groups,
            MX=mx,
            BLOCK=_GROUPS_PER_PROGRAM,
            MX_BIAS=MX_EXPONENT_BIAS,
            MX_TOP=MX_MAX_EXPONENT_BYTE,
            MX_BAD=MX_NONFINITE_BYTE,
            BF16_MAX=float(torch.finfo(torch.bfloat16).max),
            F32_MAX=float(torch.finfo(torch.float32).max),
        )
    return codes, scales


def fused_quantizer(
    name: str, reference: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The quantizer for 4-bit encoding ``name``: the fused kernel where it applies, else ``reference`` (the registry's)."""
    if name not in (MXFP4_ENCODING, NF4_ENCODING):
        raise ValueError(f"no fused kernel for {name!r}")

    def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.device.type != "cuda" or x.dtype != torch.bfloat16 or triton is None:
            return reference(x)
        return _run(name, x.contiguous())

    quantize.__name__ = f"quantize_{name}_fused"
    return quantize
