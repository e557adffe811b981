"""The real server's own cost of capture: prefill throughput of one GPU SGLang server with our hooks and a client
consuming the dumps, against the same server and model without hooks, in one run.

Two Kimi-wide models (hidden 7168, Kimi-K2.5's MLA dims, dense layers, bf16, random weights, fixed seed):
``--stress-layers`` (4) prefills as fast as the GPU allows, far above a Kimi-K2.5 node's state rate;
``--kimi-layers`` (16) prefills at about a Kimi node's rate (~26-30k tokens/s, 1.5-1.7 GB/s of aux + final
states). For each model both servers start side by side on the GPU (``hs-dataset serve``'s own plan; the plain
one is the same command line without ``--forward-hooks``), then each gets ``--prompts`` random prompts of
``--tokens`` tokens with ``--in-flight`` requests in flight, ``--repeats`` times:

* with hooks: :class:`~hs_dataset.capture.sglang.backend.SGLangBackend` (reads, checks and hands back every dump);
* without: plain ``/generate`` requests, the same ids and concurrency.

Printed per model, best run of each side: SGLang's own prefill throughput (the median "input throughput" of its
"Prefill batch" log lines during the run) and end-to-end tokens/s, and the capture overhead on each
(``1 - hooks / plain``). The target is at most 3% at both rates. GPU only.

    python benchmarks/bench_server_gpu.py --out DIR [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _capture_counters import capture_counters  # noqa: E402

KIMI_WIDE = {
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "vocab_size": 32768,
    "max_position_embeddings": 8192,
    "initializer_range": 0.02,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "n_group": 1,
    "topk_group": 1,
}
SEED = 7168
_THROUGHPUT = re.compile(r"Prefill batch.*#new-token: (\d+).*input throughput \(token/s\): ([0-9.]+)")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_model(directory: Path, layers: int) -> Path:
    """A Kimi-wide dense DeepseekV3 with ``layers`` layers, initialised on the GPU (minutes on a CPU at this size)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from hs_dataset.demo.tiny_model import TINY_DEEPSEEK_CONFIG

    if (directory / "config.json").is_file():
        return directory
    raw = {**TINY_DEEPSEEK_CONFIG, **KIMI_WIDE, "num_hidden_layers": layers, "first_k_dense_replace": layers}
    config = DeepseekV3Config(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(SEED)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialised in bf16: a float32 copy of the larger model would not fit twice
    try:
        with torch.device("cuda"):
            model = DeepseekV3ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(directory, safe_serialization=True)
    del model
    torch.cuda.empty_cache()
    saved = json.loads((directory / "config.json").read_text())
    rope = dict(raw["rope_parameters"])
    saved.update({k: raw[k] for k in ("topk_method", "scoring_func", "moe_layer_freq", "ep_size")})
    saved["rope_theta"] = rope.pop("rope_theta")
    saved["rope_scaling"] = {**rope, "type": "yarn"}
    saved["architectures"] = ["DeepseekV3ForCausalLM"]
    saved["torch_dtype"] = "bfloat16"
    (directory / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True))
    return directory


def card_for(model: Path, port: int, staging: Path, args: argparse.Namespace):
    from hs_dataset.config import card_from_dict

    if args.cpu_smoke:  # the same code paths on the CPU server and the tiny model, to try the script before a GPU run
        device, dtype, python, backend_args = (
            "cpu",
            "float32",
            args.cpu_smoke,
            ["--attention-backend", "torch_native", "--mem-fraction-static", "0.1", "--max-total-tokens", "8192"],
        )
        env = {"SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1"}
    else:
        device, dtype, python, backend_args = (
            "cuda",
            "bfloat16",
            sys.executable,
            ["--attention-backend", "triton", "--mem-fraction-static", str(args.mem_fraction)],
        )
        env = {}
    return card_from_dict(
        {
            "name": "bench-server-gpu",
            "model": {"path": str(model)},
            "layers": {"aux": [1, 2, 3]},
            "dtype": dtype,
            "max_length": args.tokens,
            "backend": {"name": "sglang", "concurrency": args.in_flight, "request_timeout_s": 600, "dump_timeout_s": 120},
            "sglang": {
                "python": python,
                "device": device,
                "port": port,
                "startup_timeout_s": 900,
                "env": env,
                "args": [
                    *backend_args,
                    "--sampling-backend",
                    "pytorch",
                    "--grammar-backend",
                    "none",
                    "--max-running-requests",
                    str(args.in_flight),
                    "--chunked-prefill-size",
                    str(args.chunk),
                ],
                "staging": {
                    "dir": str(staging),
                    "max_bytes": 24 << 30,
                    "max_files": 8192,
                    "writer_threads": 8,
                    "pinned_pool_bytes": 16 << 30,
                    "max_wait_s": 10.0,
                },
            },
        },
        "benchmarks/bench_server_gpu.py",
    )


def start_pair(model: Path, args: argparse.Namespace, out: Path, tag: str):
    """The hooked server and the plain one (same argv without --forward-hooks), started side by side."""
    import dataclasses

    from hs_dataset.capture.serve import launch, plan_server

    staging = Path("/dev/shm") / f"hs-bench-{tag}"
    hooked = plan_server(card_for(model, args.port, staging, args))
    argv = list(hooked.argv)
    i = argv.index("--forward-hooks")
    others = [s for s in json.loads(argv[i + 1]) if not s["name"].startswith("hs_capture")]  # the CPU MLA handler stays
    plain_argv = argv[:i] + (["--forward-hooks", json.dumps(others)] if others else []) + argv[i + 2 :]
    plain_argv[plain_argv.index("--port") + 1] = str(args.port + 1)
    plain = dataclasses.replace(
        hooked, argv=plain_argv, port=args.port + 1, url=f"http://127.0.0.1:{args.port + 1}", staging_dir=str(staging) + "-plain"
    )
    t0 = time.monotonic()
    servers = {}
    try:  # one after the other: SGLang sizes its KV cache from the GPU memory free when it starts
        for name, plan in (("hooks", hooked), ("plain", plain)):
            servers[name] = launch(plan, log_path=str(out / f"{tag}-{name}.log"), timeout=900)
    except BaseException:
        for s in servers.values():
            s.stop(timeout=10)
        raise
    log(f"{tag}: both servers healthy after {time.monotonic() - t0:.0f} s ({hooked.mechanism}, {hooked.support_status})")
    return servers, card_for(model, args.port, staging, args)


def prompts(args: argparse.Namespace, seed: int):
    import torch

    from hs_dataset.sample import TokenizedSample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(args.prompts):
        ids = torch.randint(10, 30000, (args.tokens,), generator=g)  # within both the Kimi-wide and the tiny vocab
        out.append(TokenizedSample(f"p{seed}-{i}", ids, torch.ones(args.tokens, dtype=torch.bool)))
    return out


def run_hooked(card, server, samples, args) -> float:
    from hs_dataset.capture.sglang.backend import SGLangBackend

    be = SGLangBackend.from_card(card, servers=[server.url])
    try:
        be.validate()
        t0 = time.monotonic()
        got = sum(r.num_tokens for r in be.capture_stream(samples, args.in_flight) if hasattr(r, "aux_hidden_states"))
        took = time.monotonic() - t0
    finally:
        be.close()
    if got != sum(s.num_tokens for s in samples):
        raise SystemExit(f"the hooked server captured {got} of {sum(s.num_tokens for s in samples)} tokens")
    return got / took


def run_plain(server, samples, args) -> float:
    import aiohttp

    async def go() -> float:
        sem = asyncio.Semaphore(args.in_flight)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

            async def one(s):
                async with sem:
                    body = {"input_ids": s.input_ids.tolist(), "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
                    async with session.post(server.url + "/generate", json=body) as resp:
                        resp.raise_for_status()
                        await resp.read()

            t0 = time.monotonic()
            await asyncio.gather(*(one(s) for s in samples))
            return sum(s.num_tokens for s in samples) / (time.monotonic() - t0)

    return asyncio.run(go())


def prefill_rate(log_path: str, start: int) -> float:
    """Median of SGLang's own "input throughput" over the full prefill batches logged since byte ``start``."""
    with open(log_path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    rates = [(int(n), float(r)) for n, r in _THROUGHPUT.findall(text)]
    big = [r for n, r in rates if n >= max(n for n, _ in rates) * 0.5] if rates else []
    return statistics.median(big) if big else float("nan")


def hook_counts(card) -> dict:
    """The hooked server's own counters (its status file): passes, and the forward-thread time its hooks took."""
    return capture_counters(str(card.sglang.staging.dir))


def hook_cost(before: dict, after: dict) -> dict:
    passes = max(after.get("extend_passes", 0) - before.get("extend_passes", 0), 1)
    return {
        "extend_passes": passes,
        "hook_ms_per_pass": (after.get("hook_wall_ns", 0) - before.get("hook_wall_ns", 0)) / passes / 1e6,
        "reserve_ms_per_pass": (after.get("reserve_ns", 0) - before.get("reserve_ns", 0)) / passes / 1e6,
        "copy_ms_per_pass": (after.get("copy_ns", 0) - before.get("copy_ns", 0)) / passes / 1e6,
    }


def run_once(name: str, server, card, samples, args) -> dict:
    start = os.path.getsize(server.log_path)
    before = hook_counts(card) if name == "hooks" else {}
    e2e = run_hooked(card, server, samples, args) if name == "hooks" else run_plain(server, samples, args)
    result = {"end_to_end_tok_s": e2e, "sglang_prefill_tok_s": prefill_rate(server.log_path, start)}
    if name == "hooks":
        time.sleep(1.5)  # the status file is rewritten every 0.25 s: let it catch the last pass
        result.update(hook_cost(before, hook_counts(card)))
    return result


def measure(tag: str, servers, card, args) -> dict:
    results: dict[str, list[dict]] = {"hooks": [], "plain": []}
    for rep in range(args.repeats):
        for name in ("plain", "hooks") if rep % 2 else ("hooks", "plain"):  # alternate who goes first
            r = run_once(name, servers[name], card, prompts(args, seed=1000 * rep + (name == "hooks")), args)
            results[name].append(r)
            extra = (
                f", hooks {r['hook_ms_per_pass']:.2f} ms/pass (reserving {r['reserve_ms_per_pass']:.2f}, copies "
                f"{r['copy_ms_per_pass']:.2f})"
                if name == "hooks"
                else ""
            )
            log(
                f"{tag} run {rep} {name:5}: SGLang prefill {r['sglang_prefill_tok_s']:9.0f} tok/s, end to end "
                f"{r['end_to_end_tok_s']:9.0f} tok/s{extra}"
            )
    keys = ("end_to_end_tok_s", "sglang_prefill_tok_s")
    best = {name: {k: max(r[k] for r in runs) for k in keys} for name, runs in results.items()}
    overhead = {k: 1 - best["hooks"][k] / best["plain"][k] for k in keys}
    state_gbs = best["hooks"]["sglang_prefill_tok_s"] * 4 * KIMI_WIDE["hidden_size"] * 2 / 1e9
    report = {"runs": results, "best": best, "overhead": overhead, "state_rate_GB_s": state_gbs}
    if args.profile_steps:
        report["profile"] = {}
        for name in ("plain", "hooks"):
            try:
                report["profile"][name] = profile_run(name, servers[name], card, args, tag)
            except Exception as exc:  # the measured runs above stand without it
                report["profile"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            log(f"{tag} {name} profile: {json.dumps(report['profile'][name])[:3000]}")
    return report


def profile_run(name: str, server, card, args, tag: str) -> dict:
    """One more run with SGLang's torch profiler on for ``--profile-steps`` steps; the trace summarised (trace_summary)."""
    import urllib.request

    from _trace_summary import summarize_trace

    trace_dir = args.out.resolve() / f"trace-{tag}-{name}"
    trace_dir.mkdir(parents=True, exist_ok=True)
    body = json.dumps(
        {
            "output_dir": str(trace_dir),
            "num_steps": args.profile_steps,
            "start_step": 4,
            "activities": ["CPU"] if args.cpu_smoke else ["CPU", "GPU"],
            "with_stack": False,
            "record_shapes": False,
        }
    ).encode()
    request = urllib.request.Request(server.url + "/start_profile", data=body, headers={"Content-Type": "application/json"})
    started = time.monotonic()
    starter = threading.Thread(target=lambda: urllib.request.urlopen(request, timeout=600).read(), daemon=True)
    starter.start()  # the call returns only once the profile is written
    time.sleep(0.5)
    run_once(name, server, card, prompts(args, seed=99), args)
    starter.join(timeout=300)
    traces = sorted(trace_dir.rglob("*.json*"))
    log(f"{tag} {name}: profiled in {time.monotonic() - started:.0f} s, traces {[t.name for t in traces]}")
    return summarize_trace(traces[0]) if traces else {"error": "no trace written"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--stress-layers", type=int, default=4)
    p.add_argument("--kimi-layers", type=int, default=16)
    p.add_argument("--prompts", type=int, default=160)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--in-flight", type=int, default=64)
    p.add_argument("--chunk", type=int, default=16384)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mem-fraction", type=float, default=0.4)
    p.add_argument("--port", type=int, default=32000)
    p.add_argument("--only", choices=["stress", "kimi"], default=None)
    p.add_argument("--profile-steps", type=int, default=0, help="then profile this many steps of one more run of each server")
    p.add_argument("--wait-for", type=Path, default=None, help="wait (up to 400 s) for this file before the first measurement")
    p.add_argument("--cpu-smoke", default=None, metavar="SERVER_PYTHON", help="try the script on the CPU server and the tiny model")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("bench_server_gpu: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = {"device": torch.cuda.get_device_name(0) if not args.cpu_smoke else "cpu", "args": {k: str(v) for k, v in vars(args).items()}}
    for tag, layers in (("stress", args.stress_layers), ("kimi", args.kimi_layers)):
        if args.only and tag != args.only:
            continue
        t0 = time.monotonic()
        if args.cpu_smoke:
            from hs_dataset.demo.tiny_model import build_tiny_deepseek

            model = build_tiny_deepseek()
        else:
            model = build_model(Path(f"/tmp/hs-bench-kimi-wide-{layers}"), layers)
        log(f"{tag}: model with {layers} layers ready in {time.monotonic() - t0:.0f} s")
        servers, card = start_pair(model, args, out, tag)
        if args.wait_for is not None:
            deadline = time.monotonic() + 400
            while not args.wait_for.exists() and time.monotonic() < deadline:
                time.sleep(1)
            args.wait_for = None
        try:
            report[tag] = measure(tag, servers, card, args)
        finally:
            for s in servers.values():
                s.stop(timeout=10)
        r = report[tag]
        print(
            f"{tag} ({layers} layers): best SGLang prefill {r['best']['hooks']['sglang_prefill_tok_s']:.0f} tok/s with hooks vs "
            f"{r['best']['plain']['sglang_prefill_tok_s']:.0f} without (overhead {r['overhead']['sglang_prefill_tok_s']:+.1%}); "
            f"end to end {r['best']['hooks']['end_to_end_tok_s']:.0f} vs {r['best']['plain']['end_to_end_tok_s']:.0f} "
            f"({r['overhead']['end_to_end_tok_s']:+.1%}); states {r['state_rate_GB_s']:.2f} GB/s",
            flush=True,
        )
        (out / "bench_server_gpu.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
