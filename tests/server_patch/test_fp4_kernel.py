"""The server's fused 4-bit quantizer gives the reference quantizer's bytes (codecs/fp4.py), edge values included.

The kernel runs only on CUDA with Triton; the CPU installs take the reference, which
is what the first test checks. On a GPU, every bfloat16 bit pattern goes through both
(zeros, subnormals, the largest values, inf, NaN, -0 in groups of their own and mixed),
then Kimi-shaped states with outlier channels, odd group counts and a strided input.
"""

from __future__ import annotations

import pytest
import torch

from hs_dataset.codecs import fp4_kernel
from hs_dataset.codecs.fp4 import MXFP4_ENCODING, NF4_ENCODING, quantize_mxfp4, quantize_nf4
from hs_dataset.codecs.registry import get_encoding
from hs_dataset.formats.encoding import bad_scales
from hs_dataset.server_patch.states import QUANTIZERS

REFERENCE = {MXFP4_ENCODING: quantize_mxfp4, NF4_ENCODING: quantize_nf4}
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() or fp4_kernel.triton is None,
    reason="the fused kernel needs CUDA and Triton (CPU installs use the reference)",
)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor, so NaN compares equal to itself."""
    return t.contiguous().view(torch.uint8)


def _assert_same_bytes(name: str, x: torch.Tensor) -> None:
    codes, scales = QUANTIZERS[name](x)
    ref_codes, ref_scales = REFERENCE[name](x)
    assert codes.dtype == ref_codes.dtype and scales.dtype == ref_scales.dtype
    assert codes.shape == ref_codes.shape and scales.shape == ref_scales.shape
    differ_codes = int((_bits(codes) != _bits(ref_codes)).sum())
    differ_scales = int((_bits(scales) != _bits(ref_scales)).sum())
    assert (differ_codes, differ_scales) == (0, 0), f"{name}: {differ_codes} code bytes and {differ_scales} scale bytes differ"


@pytest.mark.parametrize("name", [MXFP4_ENCODING, NF4_ENCODING])
def test_the_server_quantizer_off_cuda_is_the_reference(name):
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))
    _assert_same_bytes(name, x)


def _every_bf16_pattern(seed: int) -> torch.Tensor:
    """All 65536 bfloat16 bit patterns, shuffled into groups of 32 (so NaN and inf share groups with finite values)."""
    patterns = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    order = torch.randperm(1 << 16, generator=torch.Generator().manual_seed(seed))
    return patterns[order].view(torch.bfloat16).reshape(-1, 1024)


def _finite_groups() -> torch.Tensor:
    """Every finite bfloat16 pattern, sorted by magnitude, so each group of 32 spans a narrow range (every exponent as amax)."""
    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    finite = every[torch.isfinite(every)]
    finite = finite[torch.argsort(finite.float().abs(), stable=True)]
    return finite[: finite.numel() // 32 * 32].reshape(-1, 32)


def _edge_groups() -> torch.Tensor:
    big = torch.finfo(torch.bfloat16).max
    rows = [
        torch.zeros(32),
        -torch.zeros(32),
        torch.full((32,), torch.finfo(torch.bfloat16).tiny / 4),  # subnormal amax
        torch.full((32,), big),
        torch.cat([torch.tensor([big, -big]), torch.zeros(30)]),
        torch.cat([torch.tensor([float("inf")]), torch.ones(31)]),
        torch.cat([torch.tensor([float("-inf")]), torch.ones(31)]),
        torch.cat([torch.tensor([float("nan")]), torch.ones(31)]),
        torch.full((32,), float("nan")),
        torch.linspace(-6, 6, 32),  # e2m1 levels and their midpoints at scale 1
        torch.linspace(-1, 1, 32),
    ]
    return torch.stack(rows).to(torch.bfloat16)


@needs_kernel
@pytest.mark.parametrize("name", [MXFP4_ENCODING, NF4_ENCODING])
def test_fused_kernel_matches_the_reference_on_every_bf16_pattern_and_edge(name):
    for x in (_every_bf16_pattern(0), _every_bf16_pattern(1), _finite_groups(), _edge_groups()):
        _assert_same_bytes(name, x.cuda())
    # the non-finite groups are marked invalid, as the reference marks them
    _, scales = QUANTIZERS[name](_edge_groups().cuda())
    bad = bad_scales(scales.cpu(), get_encoding(name)).flatten().tolist()
    assert bad[5:9] == [True] * 4 and not any(bad[:5]) and not any(bad[9:])


@needs_kernel
@pytest.mark.parametrize("name", [MXFP4_ENCODING, NF4_ENCODING])
def test_fused_kernel_matches_the_reference_on_kimi_shaped_states(name):
    g = torch.Generator(device="cuda").manual_seed(3)
    tokens, layers, hidden = 1031, 3, 7168  # a token count whose group count is not a multiple of the kernel's block
    x = torch.randn(tokens, layers, hidden, device="cuda", generator=g) * torch.logspace(-2, 1, tokens, device="cuda")[:, None, None]
    x[:, :, :4] *= 300.0  # massive-activation channels
    x = x.to(torch.bfloat16)
    _assert_same_bytes(name, x)
    _assert_same_bytes(name, x[:, 1])  # a strided view: copied contiguous first
    _assert_same_bytes(name, x[:0])  # an empty pass


@needs_kernel
def test_prepare_quantizer_compiles_the_kernel_before_the_first_pass():
    """The hooks call it at server start: the first pass must not stall for a compile (a second or more)."""
    import time

    from hs_dataset.server_patch.states import prepare_quantizer

    prepare_quantizer(NF4_ENCODING, torch.device("cuda"))
    x = torch.randn(4096, 3, 7168, device="cuda").to(torch.bfloat16)
    torch.cuda.synchronize()
    started = time.perf_counter()
    QUANTIZERS[NF4_ENCODING](x)
    torch.cuda.synchronize()
    assert time.perf_counter() - started < 0.05
