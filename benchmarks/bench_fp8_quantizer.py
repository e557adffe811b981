"""The fp8 quantizer's cost per 4096-token pass of Kimi-K2.5 states, against the encoding's defining formula.

``quantize_fp8_per_token`` (the one implementation, run by the server on the GPU and by
the writer on the host) finds max |x| per token in one read of the states and divides
in one mixed-dtype kernel. The baseline, timed in the same run on the same tensors, is
the formula that defines the encoding (a float32 copy, abs, amax, divide, clamp, cast),
which produces the same bytes (checked here, and in tests/formats/test_roundtrip.py).
States: 3 aux [4096, 3, 7168] + final [4096, 7168], bf16, on CUDA when there is one.
Last line: ``quantizer_speedup=X`` (baseline time / quantizer time; above 1 is faster).

    python benchmarks/bench_fp8_quantizer.py [--tokens 4096] [--repeats 3] [--iters 50]
"""

from __future__ import annotations

import argparse
import time

import torch

from hs_dataset.codecs.fp8 import FP8_MAX, quantize_fp8_per_token


def defining_formula(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    as_float = x.float()
    amax = as_float.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    return (as_float / scale.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def pass_arguments(doc: str) -> argparse.Namespace:
    """The quantizer benchmarks' shared options: pass shape and timing repeats."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iters", type=int, default=50)
    return parser.parse_args()


def main() -> None:
    args = pass_arguments(__doc__)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    iters = args.iters if device.type == "cuda" else max(1, args.iters // 25)
    g = torch.Generator(device=device).manual_seed(0)
    aux = torch.randn(args.tokens, 3, args.hidden, device=device, generator=g).bfloat16()
    final = torch.randn(args.tokens, args.hidden, device=device, generator=g).bfloat16()
    for x in (aux, final):
        (a, s), (b, t) = defining_formula(x), quantize_fp8_per_token(x)
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) and torch.equal(s, t), (
            "the quantizer's bytes differ from the formula's"
        )
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, fn in (("defining formula", defining_formula), ("quantize_fp8_per_token", quantize_fp8_per_token)):
            fn(aux)
            sync(device)
            t0 = time.perf_counter()
            for _ in range(iters):
                fn(aux)
                fn(final)
            sync(device)
            times.setdefault(name, []).append((time.perf_counter() - t0) / iters * 1e3)
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"{where}: {args.tokens} tokens x (3 aux + final) x {args.hidden}, bf16; same bytes from both")
    for name, ms in times.items():
        print(f"  {name:<24} {min(ms):.3f} ms per pass (repeats {', '.join(f'{m:.3f}' for m in ms)})")
    print(f"quantizer_speedup={min(times['defining formula']) / min(times['quantize_fp8_per_token']):.2f}")


if __name__ == "__main__":
    main()
