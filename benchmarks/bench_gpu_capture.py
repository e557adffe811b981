"""P4: what server-side capture costs a GPU prefill, and the D2H rate it reaches.

A synthetic prefill model shaped like Kimi-K2.5's text model (hidden 7168, 61
residual blocks of bf16 matmuls, random weights) runs 4096-token prefill steps of
8 requests x 512 tokens. In the same run we measure:

* the pinned-copy ceiling: one async D2H copy of a [4096, 4 x 7168] bf16 block into
  pinned memory (and, for contrast, a pageable ``.cpu()``);
* prefill throughput with no capture (baseline);
* prefill throughput with the server-side capture path of ``hs_dataset.server_patch``
  (the same :class:`CaptureCore` the SGLang hooks call: per-request split, device
  snapshot or fp8 quantization with ``--storage fp8``, pinned buffer pool, side-stream
  copy, writer threads writing each dump with one ``os.writev``, bounded staging),
  aux states of HF hidden_states [2, 30, 58] plus the pre-norm final state, dumped
  to a staging directory (default /dev/shm);
* the D2H copy rate the capture path reached (bytes / side-stream copy time, timed
  with CUDA events) against the ceiling, and the end-to-end dump rate.

Last line: ``capture_overhead=X.X% d2h_vs_pinned_ceiling=Y.YY``. Needs CUDA; on a
machine without it, it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import torch

H = int(os.environ.get("HS_BENCH_HIDDEN", 7168))  # smaller only for a CPU smoke run of this script
AUX = (2, 30, 58)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class SyntheticPrefill(torch.nn.Module):
    """Residual MLP blocks: x = x + W2 silu(W1 rmsnorm(x)); hidden_states[i] = input of block i."""

    def __init__(self, layers: int, inter: int, device: torch.device) -> None:
        super().__init__()
        g = torch.Generator(device=device).manual_seed(0)
        scale = H**-0.5
        self.w1 = [torch.randn(H, inter, device=device, dtype=torch.bfloat16, generator=g) * scale for _ in range(layers)]
        self.w2 = [torch.randn(inter, H, device=device, dtype=torch.bfloat16, generator=g) * inter**-0.5 for _ in range(layers)]

    def forward(self, x: torch.Tensor, keep: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        captured: dict[int, torch.Tensor] = {}
        for i, (w1, w2) in enumerate(zip(self.w1, self.w2)):
            if i in keep:
                captured[i] = x
            h = torch.nn.functional.rms_norm(x, (H,))
            x = x + torch.nn.functional.silu(h @ w1) @ w2
        return x, captured


def pinned_ceiling(nbytes: int, device: torch.device) -> tuple[float, float]:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty(nbytes // 2, dtype=torch.bfloat16, pin_memory=True)
    for _ in range(2):
        dst.copy_(src, non_blocking=True)
    _sync()
    t0 = time.perf_counter()
    reps = 10
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    _sync()
    pinned = reps * nbytes / (time.perf_counter() - t0)
    src.cpu()
    t0 = time.perf_counter()
    for _ in range(3):
        src.cpu()
    pageable = 3 * nbytes / (time.perf_counter() - t0)
    return pinned, pageable


def run_steps(model: SyntheticPrefill, steps: int, tokens: int, requests: int, core=None, step_offset: int = 0) -> float:
    from hs_dataset.server_patch.batch import BatchView

    per = tokens // requests
    device = model.w1[0].device
    ids = torch.randint(0, 160_000, (tokens,), device=device)
    x0 = torch.randn(tokens, H, device=device, dtype=torch.bfloat16)
    _sync()
    t0 = time.perf_counter()
    for step in range(steps):
        out, captured = model(x0, AUX if core is not None else ())
        if core is not None:
            rids = [f"hs-bench-{(step_offset + step) * requests + r}-{per}" for r in range(requests)]
            batch = BatchView(mode="EXTEND", extend_seq_lens=[per] * requests, extend_prefix_lens=[0] * requests, rids=rids, input_ids=ids)
            core.process(batch, aux=[captured[i] for i in AUX], final_prenorm=out)
    _sync()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument(
        "--inter", type=int, default=14336, help="MLP width; sets prefill speed (default ~ a Kimi-K2.5 TP8 node's per-GPU rate)"
    )
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--staging", default="/dev/shm")
    parser.add_argument("--rounds", type=int, default=3, help="alternating baseline/capture rounds")
    parser.add_argument("--storage", default="native", choices=["native", "fp8"], help="fp8: states quantized on the GPU before the copy")
    args = parser.parse_args()
    smoke = os.environ.get("HS_BENCH_SMOKE") == "1"
    if not torch.cuda.is_available() and not smoke:
        print("no CUDA device: P4 needs a GPU (run it through the device tool); nothing measured")
        return

    from hs_dataset.server_patch.config import CaptureConfig
    from hs_dataset.server_patch.core import CaptureCore

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    model = SyntheticPrefill(args.layers, args.inter, device)
    step_bytes = args.tokens * (len(AUX) + 1) * H * 2
    pinned, pageable = pinned_ceiling(step_bytes, device) if device.type == "cuda" else (1.0, 1.0)
    print(
        f"D2H ceiling ({step_bytes / 2**20:.0f} MiB block): pinned non_blocking {pinned / 1e9:.1f} GB/s, pageable .cpu() {pageable / 1e9:.2f} GB/s"
    )

    staging_root = tempfile.mkdtemp(prefix="hs-bench-", dir=args.staging)
    staging = os.path.join(staging_root, "staging")
    config = CaptureConfig(
        staging_dir=staging,
        hf_aux_layer_ids=AUX,
        rid_prefix="hs-",
        writer_threads=args.writers,
        storage=args.storage,
        pinned_pool_bytes=8 * step_bytes,
        max_staging_bytes=64 * 2**30,
        max_staging_files=100_000,
        max_wait_s=30.0,
    )
    core = CaptureCore(config, sglang_version="bench")
    run_steps(model, 3, args.tokens, args.requests)  # warm-up: kernels, allocator
    run_steps(model, 3, args.tokens, args.requests, core, step_offset=10_000)
    core.flush(timeout=120)
    base_times, cap_times, drain_times = [], [], []
    offset = 0
    try:
        for rnd in range(args.rounds):
            base_times.append(run_steps(model, args.steps, args.tokens, args.requests))
            before = core.stats["dump_bytes"]
            t = run_steps(model, args.steps, args.tokens, args.requests, core, step_offset=offset)
            offset += args.steps
            t0 = time.perf_counter()
            assert core.flush(timeout=600), "writers did not drain"
            drain = time.perf_counter() - t0
            cap_times.append(t)
            drain_times.append(drain)
            dumped = core.stats["dump_bytes"] - before
            if core.stats["refused"]:
                print(f"WARNING: {core.stats['refused']} requests refused (staging or pinned pool full): capture could not keep up")
            print(
                f"round {rnd}: baseline {args.steps * args.tokens / base_times[-1]:.0f} tok/s, with capture "
                f"{args.steps * args.tokens / t:.0f} tok/s (+{(t / base_times[-1] - 1) * 100:.1f}%), drain after last step {drain * 1e3:.0f} ms, "
                f"dumped {dumped / 2**30:.2f} GiB ({core.stats['dumps_written']} dumps so far) at {dumped / (t + drain) / 1e9:.2f} GB/s end to end",
                flush=True,
            )
            for name in os.listdir(staging):  # the client would consume these; keep /dev/shm bounded
                try:
                    os.unlink(os.path.join(staging, name))
                except FileNotFoundError:
                    pass
    finally:
        core.close()
        shutil.rmtree(staging_root, ignore_errors=True)

    # D2H rate the capture path reaches: time the side-stream copy of one step's states with events.
    from hs_dataset.server_patch.copier import HostCopier

    copier = HostCopier(4 * step_bytes)
    x = torch.randn(args.tokens, len(AUX) + 1, H, device=device, dtype=torch.bfloat16)
    piece = copier.snapshot({"states": x}, timeout=10)
    piece.wait()
    piece.release()
    _sync()
    t0 = time.perf_counter()
    reps = 10
    for _ in range(reps):
        piece = copier.snapshot({"states": x}, timeout=10)
        piece.wait()
        piece.release()
    copy_rate = reps * step_bytes / (time.perf_counter() - t0)
    overhead = (sorted(c / b for c, b in zip(cap_times, base_times))[len(cap_times) // 2] - 1) * 100
    print(f"capture path copy rate {copy_rate / 1e9:.1f} GB/s (snapshot + pinned async copy + wait) vs ceiling {pinned / 1e9:.1f} GB/s")
    print(f"capture_overhead={overhead:.1f}% d2h_vs_pinned_ceiling={copy_rate / pinned:.2f}")


if __name__ == "__main__":
    main()
