"""The flagship job rehearsed on one GPU: Kimi-K2.5's shape and lengths through ``serve``, ``build --server`` and ``verify``.

The model is Kimi-K2.5's text model as one GPU can hold it: 61 layers, hidden 7168, Kimi's MLA dims (q_lora 1536,
kv_lora 512, rope 64, nope 128, v 128, 64 heads), vocab 163840, the first layer dense and the rest MoE with as many
routed experts as fit the GPU beside the KV cache, one shared expert; SGLang's ``--load-format dummy`` fills the
weights (throughput does not depend on their values). The card captures the flagship's aux ids [2, 30, 58] and the
pre-norm final state. Prompts follow the seeds' run: ``--samples`` lengths drawn lognormal around a mean of ~1.7k
tokens, plus a tail of ``--long`` samples of ``--long-tokens`` (32k) tokens, written once as pre-tokenized rows so
the plain client and the build send the same ids.

Two phases, each its own server (one GPU holds one such model), run in one call or in two (``--phase``):

* ``plain``: the same SGLang command line without ``--forward-hooks``, driven by a plain client (``/generate``,
  ``max_new_tokens`` 1, the same ids and concurrency); also the disk's raw sequential write rate;
* ``hooks``: ``hs-dataset serve --config CARD``, ``hs-dataset build --config CARD --server URL``, ``hs-dataset
  verify``; the server's status file gives the staging and pinned high-water marks.

Printed against the plain phase of the same run: build tokens/s (target >= 0.95 of the plain client's), SGLang's own
prefill throughput with and without the hooks (the median "input throughput" of its prefill log lines; target
overhead <= 3%), state bytes/s against the disk's raw rate, peak RSS of server and client, the bounds, and the
verified sample count. Results: ``OUT/bench_flagship_gpu.json``.

    python benchmarks/bench_flagship_gpu.py --out DIR [--phase both|plain|hooks] [--storage nf4]
    python benchmarks/bench_flagship_gpu.py --out DIR --cpu-smoke .sglang-venv/bin/python   # the same paths, tiny, on CPU
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from scripts.gpu.check_server import stop as stop_server  # noqa: E402  (the GPU check's: SIGTERM to the group, then SIGKILL)

# Kimi-K2.5's text model (config.json's text_config), routed experts aside.
KIMI_TEXT = {
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "vocab_size": 163840,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.827,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 50000.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
}
AUX = [2, 30, 58]
SEED = 20261201
_GB = 1e9


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------- the model
def experts_that_fit(gpu_bytes: int, top_k: int, weights_share: float) -> int:
    """Routed experts per MoE layer such that the bf16 weights take about ``weights_share`` of the GPU."""
    k = KIMI_TEXT
    h, layers = k["hidden_size"], k["num_hidden_layers"]
    attention = h * k["q_lora_rank"] + k["q_lora_rank"] * k["num_attention_heads"] * (k["qk_nope_head_dim"] + k["qk_rope_head_dim"])
    attention += h * (k["kv_lora_rank"] + k["qk_rope_head_dim"]) + k["kv_lora_rank"] * k["num_attention_heads"] * (
        k["qk_nope_head_dim"] + k["v_head_dim"]
    )
    attention += k["num_attention_heads"] * k["v_head_dim"] * h
    expert = 3 * h * k["moe_intermediate_size"]
    fixed = 2 * k["vocab_size"] * h + layers * attention + 3 * h * k["intermediate_size"] + (layers - 1) * expert * k["n_shared_experts"]
    per_expert = (layers - 1) * expert
    return max(top_k, int((gpu_bytes * weights_share / 2 - fixed) // per_expert))


def write_model(directory: Path, experts: int, top_k: int) -> Path:
    """config.json, the demo tokenizer and the final norm weight alone: the server runs with ``--load-format dummy``,
    and the client reads only the norm (for the manifest) from the snapshot."""
    import torch
    from safetensors.torch import save_file

    from hs_dataset.demo.tiny_model import TINY_DEEPSEEK_CONFIG
    from hs_dataset.demo.tiny_tokenizer import write_tiny_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    config = {
        **TINY_DEEPSEEK_CONFIG,
        **KIMI_TEXT,
        "n_routed_experts": experts,
        "num_experts_per_tok": top_k,
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "torch_dtype": "bfloat16",
    }
    rope = dict(config.pop("rope_parameters"))  # written the way DeepSeek's own config.json spells it
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = {**rope, "type": rope["rope_type"]}
    (directory / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    write_tiny_tokenizer(directory)
    save_file({"model.norm.weight": torch.ones(config["hidden_size"], dtype=torch.bfloat16)}, str(directory / "model.safetensors"))
    return directory


def write_prompts(path: Path, args: argparse.Namespace, vocab: int) -> tuple[int, int]:
    """Pre-tokenized rows: lognormal lengths around ``--mean-tokens`` plus the long tail; returns (rows, tokens)."""
    rng = random.Random(SEED)
    sigma = args.sigma
    mu = math.log(args.mean_tokens) - sigma * sigma / 2  # so the lognormal's mean is --mean-tokens
    lengths = [min(args.long_tokens - 1, max(16, int(rng.lognormvariate(mu, sigma)))) for _ in range(args.samples - args.long)]
    lengths += [args.long_tokens] * args.long
    rng.shuffle(lengths)
    with open(path, "w") as f:
        for i, n in enumerate(lengths):
            ids = [rng.randrange(10, vocab) for _ in range(n)]
            f.write(json.dumps({"id": f"r{i}", "input_ids": ids, "loss_mask": [1] * n}) + "\n")
    return len(lengths), sum(lengths)


def read_prompts(path: Path) -> list[list[int]]:
    with open(path) as f:
        return [json.loads(line)["input_ids"] for line in f if line.strip()]


# ---------------------------------------------------------------------------- the card and the servers
def card_dict(model: Path, args: argparse.Namespace, staging: Path) -> dict:
    if args.cpu_smoke:
        python, device, dtype = args.cpu_smoke, "cpu", "float32"
        server_args = [
            "--attention-backend",
            "torch_native",
            "--mem-fraction-static",
            "0.1",
            "--max-total-tokens",
            str(4 * args.long_tokens),
        ]
        env = {"SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1"}
        aux = [2, 3, 4]
    else:
        python, device, dtype = sys.executable, "cuda", "bfloat16"
        server_args = ["--attention-backend", "triton", "--mem-fraction-static", str(args.mem_fraction), "--load-format", "dummy"]
        env, aux = {}, AUX
    return {
        "name": "flagship-rehearsal",
        "description": "benchmarks/bench_flagship_gpu.py: Kimi-K2.5's shape on one GPU",
        "model": {"path": str(model)},
        "layers": {"aux": aux},
        "dtype": dtype,
        "max_length": args.long_tokens,
        "source": {"path": str(args.out / "prompts.jsonl")},
        "backend": {"name": "sglang", "concurrency": args.in_flight, "request_timeout_s": 900, "dump_timeout_s": 300},
        "shards": {"bytes": 1 << 30, "storage": args.storage},
        "sglang": {
            "python": python,
            "device": device,
            "port": args.port,
            "startup_timeout_s": 1200,
            "env": env,
            "chunked_prefill_size": args.chunk,
            "args": [
                *server_args,
                "--sampling-backend",
                "pytorch",
                "--grammar-backend",
                "none",
                "--max-running-requests",
                str(args.in_flight),
            ],
            "staging": {
                "dir": str(staging),
                "max_bytes": args.staging_bytes,
                "max_files": 8192,
                "writer_threads": 8,
                "pinned_pool_bytes": args.pinned_bytes,
                "max_wait_s": 10.0,
            },
        },
    }


def plain_plan(card_path: Path):
    """``hs-dataset serve``'s own plan for the card, minus the capture hooks (the CPU MLA handler stays)."""
    import dataclasses

    from hs_dataset.capture.serve import plan_server
    from hs_dataset.config import load_card

    hooked = plan_server(load_card(str(card_path)))
    argv = list(hooked.argv)
    i = argv.index("--forward-hooks")
    others = [s for s in json.loads(argv[i + 1]) if not s["name"].startswith("hs_capture")]
    return dataclasses.replace(hooked, argv=argv[:i] + (["--forward-hooks", json.dumps(others)] if others else []) + argv[i + 2 :])


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (``hs-dataset serve`` starts SGLang in a session of its own), from /proc."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total


class PeakRss:
    """The largest resident set of a process tree, polled every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, tree_rss(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def prefill_rate(log_path: Path, start: int) -> float:
    from bench_server_gpu import prefill_rate as median_rate

    return median_rate(str(log_path), start)


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float, what: str) -> float:
    import urllib.request

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited ({proc.returncode}) before it was healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"{what} was not healthy within {timeout:.0f} s")


# ---------------------------------------------------------------------------- the phases
def raw_disk_rate(directory: Path, nbytes: int) -> float:
    """Sequential buffered writes of ``nbytes`` in 16 MiB blocks, then fsync: GB/s of the disk the dataset goes to."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "raw-rate.bin"
    block = os.urandom(16 << 20)
    t0 = time.monotonic()
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes // len(block))):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    took = time.monotonic() - t0
    size = path.stat().st_size
    path.unlink()
    return size / took / _GB


def run_plain_client(url: str, prompts: list[list[int]], in_flight: int) -> float:
    import aiohttp

    async def go() -> float:
        sem = asyncio.Semaphore(in_flight)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:

            async def one(ids: list[int]) -> None:
                async with sem:
                    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
                    async with session.post(url + "/generate", json=body) as resp:
                        resp.raise_for_status()
                        await resp.read()

            t0 = time.monotonic()
            await asyncio.gather(*(one(p) for p in prompts))
            return sum(len(p) for p in prompts) / (time.monotonic() - t0)

    return asyncio.run(go())


def phase_plain(args: argparse.Namespace, card_path: Path, prompts: list[list[int]]) -> dict:
    plan = plain_plan(card_path)
    log_path = args.out / "server-plain.log"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [plan.python, *plan.argv],
            env={**os.environ, **plan.env},
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    rss = PeakRss(proc.pid)
    try:
        started = wait_healthy(plan.url, proc, 1200, "the plain server")
        log(f"plain server healthy in {started:.0f} s")
        run_plain_client(plan.url, prompts[:8], args.in_flight)  # warm-up: the first kernels
        mark = log_path.stat().st_size
        rate = run_plain_client(plan.url, prompts, args.in_flight)
        result = {"start_s": started, "client_tok_s": rate, "sglang_prefill_tok_s": prefill_rate(log_path, mark)}
    finally:
        stop_server(proc)
        result_rss = rss.stop()
    result["server_peak_rss_bytes"] = result_rss
    log(f"plain: {result['client_tok_s']:.0f} tok/s through the client, SGLang prefill {result['sglang_prefill_tok_s']:.0f} tok/s")
    return result


def _cli(argv: list[str], log_path: Path, timeout: float) -> tuple[int, float, int]:
    """(exit status, seconds, peak RSS) of one ``hs-dataset`` command."""
    with open(log_path, "ab") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "hs_dataset.cli.main", *argv], cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        rss = PeakRss(proc.pid)
        try:
            rc = proc.wait(timeout)
        finally:
            peak = rss.stop()
        return rc, time.monotonic() - t0, peak


def server_status(staging: Path) -> dict:
    from hs_dataset.server_patch.contract.status import read_statuses

    merged: dict = {"counts": {}}
    for status in read_statuses(str(staging)):
        for key in ("max_staging_bytes", "pinned_pool_bytes"):
            merged[key] = status.get(key)
        for key, value in (status.get("counts") or {}).items():
            merged["counts"][key] = (
                max(merged["counts"].get(key, 0), value) if key.endswith("peak_bytes") else merged["counts"].get(key, 0) + value
            )
    return merged


def phase_hooks(args: argparse.Namespace, card_path: Path, staging: Path, tokens: int) -> dict:
    from hs_dataset.config import load_card

    card = load_card(str(card_path))
    url = f"http://127.0.0.1:{args.port}"
    log_path = args.out / "server-hooks.log"
    with open(args.out / "serve.out", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hs_dataset.cli.main", "serve", "--config", str(card_path), "--log", str(log_path)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    rss = PeakRss(proc.pid)
    dataset = args.dataset_dir
    try:
        started = wait_healthy(url, proc, 1200, "hs-dataset serve")
        log(f"hs-dataset serve healthy in {started:.0f} s ({card.shards.storage})")
        mark = log_path.stat().st_size
        rc, took, client_rss = _cli(
            ["build", "--config", str(card_path), "--server", url, "--out", str(dataset), "--no-progress"], args.out / "build.log", 3600
        )
        result = {
            "start_s": started,
            "build_rc": rc,
            "build_s": took,
            "client_peak_rss_bytes": client_rss,
            "sglang_prefill_tok_s": prefill_rate(log_path, mark),
        }
        time.sleep(1.0)  # the status file is rewritten every 0.25 s
        result["status"] = server_status(staging)
    finally:
        stop_server(proc)
        result["server_peak_rss_bytes"] = rss.stop()
    rc, took, verify_rss = _cli(["verify", str(dataset), "--json"], args.out / "verify.log", 3600)
    result.update(verify_rc=rc, verify_s=took, verify_peak_rss_bytes=verify_rss)
    from hs_dataset.formats.reader import open_dataset

    if result["build_rc"] == 0:
        ds = open_dataset(dataset)
        result["samples"], result["tokens"] = len(ds), int(ds.manifest.num_tokens)
        result["state_bytes"] = sum(int(s.bytes) for s in ds.manifest.shards)
    result["build_tok_s"] = result.get("tokens", 0) / result["build_s"] if result["build_s"] else 0.0
    result["expected_tokens"] = tokens
    log(
        f"hooks: build {result['build_tok_s']:.0f} tok/s ({result.get('samples')} samples), SGLang prefill "
        f"{result['sglang_prefill_tok_s']:.0f} tok/s, verify exit {result['verify_rc']} in {result['verify_s']:.0f} s"
    )
    return result


def summary(report: dict) -> list[str]:
    plain, hooks = report.get("plain"), report.get("hooks")
    if not (plain and hooks):
        return []
    status = hooks.get("status", {})
    counts = status.get("counts", {})
    state_rate = hooks.get("state_bytes", 0) / hooks["build_s"] / _GB if hooks["build_s"] else 0.0
    lines = [
        f"samples {hooks.get('samples')} of {report['prompts']['rows']} ({hooks.get('tokens')} tokens of {report['prompts']['tokens']}), "
        f"verify exit {hooks['verify_rc']}",
        f"build {hooks['build_tok_s']:.0f} tok/s vs plain client {plain['client_tok_s']:.0f}: "
        f"{hooks['build_tok_s'] / plain['client_tok_s']:.3f} (target >= 0.95)",
        f"SGLang prefill {hooks['sglang_prefill_tok_s']:.0f} vs {plain['sglang_prefill_tok_s']:.0f} tok/s: overhead "
        f"{1 - hooks['sglang_prefill_tok_s'] / plain['sglang_prefill_tok_s']:+.1%} (target <= 3%)",
        f"state bytes {state_rate:.2f} GB/s vs the disk's raw {report['disk_raw_GB_s']:.2f} GB/s: {state_rate / report['disk_raw_GB_s']:.2f}",
        f"peak RSS: server {hooks['server_peak_rss_bytes'] / _GB:.1f} GB (plain {plain['server_peak_rss_bytes'] / _GB:.1f}), "
        f"client {hooks['client_peak_rss_bytes'] / _GB:.1f} GB, verify {hooks['verify_peak_rss_bytes'] / _GB:.1f} GB",
        f"bounds: staging peak {counts.get('staging_peak_bytes', 0) / _GB:.2f} of {(status.get('max_staging_bytes') or 0) / _GB:.2f} GB, "
        f"pinned peak {counts.get('pinned_peak_bytes', 0) / _GB:.2f} of {(status.get('pinned_pool_bytes') or 0) / _GB:.2f} GB, "
        f"refused {counts.get('refused', 0)}",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--phase", choices=["both", "plain", "hooks"], default="both")
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--mean-tokens", type=int, default=1700)
    p.add_argument("--sigma", type=float, default=0.9, help="lognormal sigma of the lengths")
    p.add_argument("--long", type=int, default=4, help="samples of --long-tokens tokens (the tail)")
    p.add_argument("--long-tokens", type=int, default=32768)
    p.add_argument("--storage", default="nf4")
    p.add_argument("--in-flight", type=int, default=64)
    p.add_argument("--chunk", type=int, default=16384)
    p.add_argument(
        "--top-k",
        type=int,
        default=2,
        help="routed experts per token (Kimi-K2.5: 8; fewer make one GPU's run fit a device call, and a higher "
        "token rate is a harder test of capture)",
    )
    p.add_argument("--weights-share", type=float, default=0.6, help="of the GPU's memory, for the weights")
    p.add_argument("--mem-fraction", type=float, default=0.88)
    p.add_argument("--pinned-bytes", type=int, default=8 << 30)
    p.add_argument("--staging-bytes", type=int, default=32 << 30)
    p.add_argument("--disk-bytes", type=int, default=8 << 30, help="written once to measure the disk's raw rate")
    p.add_argument("--port", type=int, default=33000)
    p.add_argument("--dataset-dir", type=Path, default=None, help="where the dataset goes (default OUT/ds: local disk)")
    p.add_argument("--cpu-smoke", default=None, metavar="SERVER_PYTHON", help="try every step on the CPU server with the tiny model")
    p.add_argument(
        "--seed-report",
        type=Path,
        default=None,
        help="start from this report (an earlier call's plain phase, when the phases ran on two hosts)",
    )
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("bench_flagship_gpu: needs a CUDA GPU (or --cpu-smoke)", file=sys.stderr)
        return 2
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.dataset_dir = (args.dataset_dir or args.out / "ds").resolve()
    report_path = args.out / "bench_flagship_gpu.json"
    seed = args.seed_report if args.seed_report and args.seed_report.exists() else report_path
    report = json.loads(seed.read_text()) if seed.exists() else {}
    gpu = torch.cuda.get_device_properties(0) if not args.cpu_smoke else None
    experts = experts_that_fit(gpu.total_memory, args.top_k, args.weights_share) if gpu else 0
    if args.cpu_smoke:  # the demo's tiny DeepseekV3 with its real (random) weights: the CPU server is tried as it runs in the tests
        from hs_dataset.demo.tiny_model import build_tiny_deepseek

        model = build_tiny_deepseek()
    else:
        model = write_model(args.out / "model", experts, args.top_k)
    vocab = 100000  # within the demo tokenizer's vocabulary (DeepSeek-V3's; the pre-tokenized rows are checked against it)
    prompts_path = args.out / "prompts.jsonl"
    if "prompts" not in report or not prompts_path.exists():  # the same seed writes the same rows on any host
        rows, tokens = write_prompts(prompts_path, args, vocab)
        report.update(
            prompts={"rows": rows, "tokens": tokens},
            device=gpu.name if gpu else "cpu",
            experts=experts,
            top_k=args.top_k,
            storage=args.storage,
            args={k: str(v) for k, v in vars(args).items()},
        )
    log(f"model: {experts} routed experts, top {args.top_k}; prompts {report['prompts']}")
    staging = Path("/dev/shm") / f"hs-flagship-{args.port}"
    card_path = args.out / "card.yaml"
    import yaml

    card_path.write_text(yaml.safe_dump(card_dict(model, args, staging), sort_keys=False))
    if args.phase in ("both", "plain"):
        report["disk_raw_GB_s"] = raw_disk_rate(args.dataset_dir.parent / "raw-rate", args.disk_bytes)
        log(f"disk raw write {report['disk_raw_GB_s']:.2f} GB/s")
        report["plain"] = phase_plain(args, card_path, read_prompts(prompts_path))
        report_path.write_text(json.dumps(report, indent=1))
    if args.phase in ("both", "hooks"):
        report["hooks"] = phase_hooks(args, card_path, staging, report["prompts"]["tokens"])
        report_path.write_text(json.dumps(report, indent=1))
    for line in summary(report):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
