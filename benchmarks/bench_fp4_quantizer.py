"""The server's 4-bit quantizers per 4096-token pass of Kimi-K2.5 states: the fused kernel against the reference.

The reference (``hs_dataset/codecs/fp4.py``: the encodings' one definition, run by the
writer on the host) is a dozen torch operations, each a pass over the states; the
server runs ``codecs/fp4_kernel.py`` on CUDA, one Triton kernel with the same
bytes (checked here on the timed tensors). Both are timed in the same run on the same
tensors. States: 3 aux [4096, 3, 7168] + final [4096, 7168], bf16. Without CUDA (or
Triton) the server takes the reference too, so the figure is 1 by construction and the
benchmark says so. Last line: ``fused_speedup_<encoding>=X`` per encoding (reference
time / fused time).

    python benchmarks/bench_fp4_quantizer.py [--tokens 4096] [--repeats 3] [--iters 50]
"""

from __future__ import annotations

import os
import sys
import time

import torch

from hs_dataset.codecs import fp4_kernel
from hs_dataset.codecs.fp4 import MXFP4_ENCODING, NF4_ENCODING, quantize_mxfp4, quantize_nf4
from hs_dataset.server_patch.states import QUANTIZERS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fp8_quantizer import pass_arguments, sync


def _ms_per_pass(fn, tensors: tuple[torch.Tensor, ...], iters: int, device: torch.device) -> float:
    for x in tensors:
        fn(x)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        for x in tensors:
            fn(x)
    sync(device)
    return (time.perf_counter() - t0) / iters * 1e3


def main() -> None:
    args = pass_arguments(__doc__)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    fused_runs = device.type == "cuda" and fp4_kernel.triton is not None
    iters = args.iters if device.type == "cuda" else 1
    g = torch.Generator(device=device).manual_seed(0)
    scale = torch.logspace(-2, 1, args.tokens, device=device)  # per-token magnitudes over 3 decades
    aux = (torch.randn(args.tokens, 3, args.hidden, device=device, generator=g) * scale[:, None, None]).bfloat16()
    final = (torch.randn(args.tokens, args.hidden, device=device, generator=g) * scale[:, None]).bfloat16()
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(
        f"{where}: {args.tokens} tokens x (3 aux + final) x {args.hidden}, bf16; fused kernel {'on' if fused_runs else 'off (the server takes the reference here)'}"
    )
    figures = []
    for name, reference in ((NF4_ENCODING, quantize_nf4), (MXFP4_ENCODING, quantize_mxfp4)):
        fused = QUANTIZERS[name]
        for x in (aux, final):
            (a, s), (b, t) = reference(x), fused(x)
            assert torch.equal(a, b) and torch.equal(s.view(torch.uint8), t.view(torch.uint8)), (
                f"{name}: the fused bytes differ from the reference's"
            )
        times: dict[str, list[float]] = {"reference": [], "fused": []}
        for _ in range(args.repeats):
            times["reference"].append(_ms_per_pass(reference, (aux, final), iters, device))
            times["fused"].append(_ms_per_pass(fused, (aux, final), iters, device))
        for label, ms in times.items():
            print(f"  {name} {label:<10} {min(ms):8.3f} ms per pass (repeats {', '.join(f'{m:.3f}' for m in ms)}); same bytes")
        figures.append(f"fused_speedup_{name}={min(times['reference']) / min(times['fused']):.2f}")
    print(" ".join(figures))


if __name__ == "__main__":
    main()
