"""The GPU check: a real SGLang server captured through hs_dataset, its states compared with transformers.

On a GPU node (docs/GPU.md: the offline bundle puts SGLang on the path)::

    python scripts/gpu/check_server.py --out DIR            # cuda, bf16, SGLang's default decode CUDA graphs
    python scripts/gpu/check_server.py --out DIR --device cpu --dtype float32 --python .sglang-venv/bin/python

Steps, each timed, all in one run (the server start dominates):

1. a Kimi-shaped tiny DeepseekV3 (real MLA dims: kv_lora 512, rope 64, nope 128, v 128; MoE), random weights,
   fixed seed, the demo tokenizer;
2. ``hs-dataset serve`` with the card this script writes (chunked prefill on, decode CUDA graphs left as SGLang
   sets them), ``hs-dataset build --server`` with many requests in flight, ``hs-dataset verify``;
3. every stored state against transformers on the same device in float32 and in the capture dtype: the per-token
   relative error ``|s - r| / |r|`` per layer, as median / p99 / max over all tokens of all samples. Passes when the
   server's error to float32 is no larger than transformers' own capture-dtype error (median and max, within
   ``--slack``), and when the neighbours a wrong convention would store (aux layer i-1 and i+1, the post-norm final
   instead of the pre-norm one) are at least 10x further than the server's states.

4. fail fast, with two more servers started beside the first: one by hand with the prefill CUDA graph left on
   must be refused at start by the hooks (its log names ``--disable-prefill-cuda-graph``); one with the graph on
   and the hooks told to allow it (``HS_CAPTURE_ALLOW_PREFILL_GRAPH=1``, diagnostics only) must make a build
   stop in under 30 s with the cause, instead of waiting out ``dump_timeout_s`` times the retries.

The result is ``DIR/check_server.json`` and a table on stdout; the exit status is 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# A Kimi-K2.5-shaped text model, scaled down: the real MLA head dims, MoE after one dense layer.
GPU_MODEL = {
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 6,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_shared_experts": 1,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "n_group": 4,
    "topk_group": 2,
    "kv_lora_rank": 512,
    "q_lora_rank": 768,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "initializer_range": 0.02,
    "max_position_embeddings": 8192,
}
AUX = [2, 3, 4]
SEED = 20261201


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_model(directory: Path, dtype: str) -> Path:
    from hs_dataset.demo.tiny_model import TINY_DEEPSEEK_CONFIG, write_random_deepseek
    from hs_dataset.demo.tiny_tokenizer import write_tiny_tokenizer

    if (directory / "config.json").is_file():
        return directory
    config = {**TINY_DEEPSEEK_CONFIG, **GPU_MODEL}
    write_random_deepseek(directory, config, seed=SEED, dtype=dtype)
    write_tiny_tokenizer(directory)
    return directory


def build_kimi_snapshot(directory: Path) -> Path:
    """The Kimi-K2.5-shaped remote-code snapshot of the tests (tiktoken tokenizer behind ``auto_map``,
    ``KimiK25ForConditionalGeneration`` wrapping a tiny DeepseekV3 at ``language_model.model``, a remote-code processor)."""
    from tests.fixtures.remote_code_snapshot import build_kimi_like_snapshot

    return build_kimi_like_snapshot(directory, GPU_MODEL)  # the real MLA dims: the triton kernels refuse the tiny ones


def text_model_dir(kimi: Path, directory: Path) -> Path:
    """transformers' own DeepseekV3 of the snapshot's text model (``text_config``, the wrapper prefix stripped):
    the reference the server's states are compared with, loaded by no hs_dataset code."""
    from safetensors.torch import load_file, save_file

    if (directory / "config.json").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((kimi / "config.json").read_text())["text_config"]
    cfg["model_type"] = "deepseek_v3"
    (directory / "config.json").write_text(json.dumps(cfg))
    weights = load_file(str(kimi / "model.safetensors"))
    save_file(
        {k[len("language_model.") :]: v for k, v in weights.items() if k.startswith("language_model.")},
        str(directory / "model.safetensors"),
    )
    return directory


def write_card(path: Path, model: Path, args: argparse.Namespace, port: int, staging: Path) -> Path:
    import yaml

    server_args = list(args.server_arg) + (["--trust-remote-code"] if args.model == "kimi" else [])
    if args.device == "cuda":
        server_args += [
            "--attention-backend",
            "triton",
            "--sampling-backend",
            "pytorch",
            "--grammar-backend",
            "none",
            "--mem-fraction-static",
            "0.3",
        ]
    else:
        server_args += [
            "--attention-backend",
            "torch_native",
            "--mem-fraction-static",
            "0.1",
            "--max-total-tokens",
            "8192",
            "--sampling-backend",
            "pytorch",
            "--grammar-backend",
            "none",
            "--sleep-on-idle",
        ]
    card = {
        "name": "gpu-check",
        "description": "hs_dataset GPU check (scripts/gpu/check_server.py)",
        "model": {
            "path": str(model),
            **({"text_module": "language_model.model", "trust_remote_code": True} if args.model == "kimi" else {}),
        },
        "layers": {"aux": AUX},
        "dtype": args.dtype,
        "max_length": 2048,
        "source": {"path": "builtin:conversations"},
        "backend": {
            "name": "sglang",
            "urls": [f"http://127.0.0.1:{port}"],
            "concurrency": args.concurrency,
            "request_timeout_s": 300,
            "dump_timeout_s": 60,
        },
        "shards": {"bytes": 64 << 20, **({} if args.storage == "native" else {"storage": args.storage})},
        "sglang": {
            "python": args.python,
            "device": args.device,
            "port": port,
            "chunked_prefill_size": args.chunk,
            **({"module_path": "language_model.model"} if args.model == "kimi" else {}),
            "startup_timeout_s": 600,
            "args": server_args,
            "staging": {"dir": str(staging)},
            "env": {"SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1"} if args.device == "cpu" else {},
        },
    }
    path.write_text(yaml.safe_dump(card, sort_keys=False))
    return path


def write_source(path: Path, n_long: int) -> Path:
    """The bundled conversations plus long ones, so chunked prefill splits some prompts over several passes."""
    from hs_dataset.sources import bundled_conversations_path

    rows = [json.loads(line) for line in bundled_conversations_path().read_text().splitlines() if line.strip()]
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "while",
        "seven",
        "wizards",
        "quietly",
        "judge",
        "boxing",
        "matches",
    ]
    for i in range(n_long):
        text = " ".join(words[(i + j) % len(words)] for j in range(300 + 150 * i))
        rows.append(
            {
                "id": f"long-{i}",
                "messages": [
                    {"role": "user", "content": f"Summarise: {text}"},
                    {"role": "assistant", "content": f"A summary {i}: {text[:400]}"},
                ],
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cli(*args: str, log: Path, timeout: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hs_dataset.cli.main", *args]
    with open(log, "ab") as out:
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, cwd=REPO)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def serve(card: Path, log: Path, url: str, timeout: float) -> subprocess.Popen:
    out = open(log, "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hs_dataset.cli.main", "serve", "--config", str(card)],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}) before it was healthy; see {log}")
        if _healthy(url):
            return proc
        time.sleep(1)
    raise SystemExit(f"the server was not healthy within {timeout:.0f} s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


# ---------------------------------------------------------------------------- fail fast
def start_graph_servers(card: Path, out: Path, port: int, only: tuple[str, ...] = ("refused", "allowed")) -> dict:
    """Two servers with SGLang's prefill CUDA graph left on (hand-started: the plan's flag removed).

    ``refused``: the hooks as shipped, which must refuse to start; ``allowed``: the hooks told to
    allow the graph, so a build against it shows how fast the client names the cause.
    """
    import yaml

    from hs_dataset.capture.serve.plan import plan_server
    from hs_dataset.config import load_card

    started = {}
    for name, offset, env in (("refused", 1, {}), ("allowed", 2, {"HS_CAPTURE_ALLOW_PREFILL_GRAPH": "1"})):
        if name not in only:
            continue
        raw = yaml.safe_load(card.read_text())  # its own card: its own port and staging dir, which its client reads
        raw["sglang"].update(port=port + offset, staging={**raw["sglang"]["staging"], "dir": f"/dev/shm/hs-gpu-check-{name}-{port}"})
        raw["backend"]["urls"] = [f"http://127.0.0.1:{port + offset}"]
        own = out / f"graph-{name}.yaml"
        own.write_text(yaml.safe_dump(raw, sort_keys=False))
        plan = plan_server(load_card(str(own)))
        argv = [a for a in plan.argv if a != "--disable-prefill-cuda-graph"]
        argv[argv.index("--mem-fraction-static") + 1] = "0.2"
        log = out / f"server-graph-{name}.log"
        proc = subprocess.Popen(
            [plan.python, *argv],
            env={**os.environ, **plan.env, **env},
            cwd=REPO,
            start_new_session=True,
            stdout=open(log, "ab"),
            stderr=subprocess.STDOUT,
        )
        started[name] = {"proc": proc, "url": plan.url, "log": log, "t0": time.monotonic(), "card": own}
    return started


def judge_graph_servers(started: dict, card: Path, source: Path, out: Path) -> tuple[dict, list[str]]:
    problems, result = [], {}
    if "refused" in started:
        problems += _judge_refused(started["refused"], result)
    if "allowed" in started:
        problems += _judge_allowed(started["allowed"], card, source, out, result)
    return result, problems


def prefill_graph_in_log(text: str) -> bool | None:
    """Whether the server's own prefill log lines say a CUDA graph ran (None: no prefill logged yet)."""
    seen = [line for line in text.splitlines() if "Prefill batch" in line and "cuda graph:" in line]
    return any("cuda graph: True" in line for line in seen) if seen else None


def _not_applicable(server: dict, result: dict, key: str) -> bool:
    """A release that resolves the prefill graph to off for this setup runs prefill eagerly: nothing to fail fast on."""
    if prefill_graph_in_log(server["log"].read_text(errors="replace")) is False:
        result[key] = {
            "not_applicable": "this SGLang ran the prefill without a CUDA graph here although the flag was "
            "left out (its log: 'cuda graph: False'); the hooks saw every pass"
        }
        return True
    return False


def _prefill_once(server: dict, timeout: float = 60) -> None:
    """One short request, then wait until the server's log has a prefill line (the warm-up's may not be logged)."""
    body = json.dumps({"input_ids": list(range(10, 42)), "sampling_params": {"max_new_tokens": 1}}).encode()
    request = urllib.request.Request(server["url"] + "/generate", data=body, headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=timeout).read()
    except OSError:
        pass  # judged from the log below: no prefill line means "not shown to be eager"
    deadline = time.monotonic() + 10
    while prefill_graph_in_log(server["log"].read_text(errors="replace")) is None and time.monotonic() < deadline:
        time.sleep(0.5)


def _judge_refused(refused: dict, result: dict) -> list[str]:
    problems = []
    deadline = time.monotonic() + 600
    while refused["proc"].poll() is None and time.monotonic() < deadline:
        if _healthy(refused["url"]):  # it started: a release whose prefill graph is off here, or a hook that failed to refuse
            _prefill_once(refused)  # so its log says whether the prefill ran in a graph
            stop(refused["proc"])
            if _not_applicable(refused, result, "refused_at_start"):
                return problems
            break
        time.sleep(1)
    if refused["proc"].poll() is None:
        stop(refused["proc"])
    text = refused["log"].read_text(errors="replace")
    result["refused_at_start"] = {
        "exit": refused["proc"].returncode,
        "after_s": round(time.monotonic() - refused["t0"], 1),
        "names_the_flag": "--disable-prefill-cuda-graph" in text and "CUDA graph" in text,
    }
    if refused["proc"].returncode in (None, 0) or not result["refused_at_start"]["names_the_flag"]:
        problems.append(f"a server with the prefill CUDA graph on was not refused at start by the hooks: {result['refused_at_start']}")
    return problems


def _judge_allowed(allowed: dict, card: Path, source: Path, out: Path, result: dict) -> list[str]:
    problems = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not _healthy(allowed["url"]) and allowed["proc"].poll() is None:
        time.sleep(1)
    if not _healthy(allowed["url"]):
        problems.append(f"the server with the graph allowed did not come up; see {allowed['log']}")
        stop(allowed["proc"])
        return problems
    t0 = time.monotonic()
    built = _cli(
        "build",
        "--config",
        str(allowed["card"]),
        "--server",
        allowed["url"],
        "--source",
        str(source),
        "--num-samples",
        "4",
        "--out",
        str(out / "ds-graph"),
        log=out / "build-graph.log",
        timeout=600,
    )
    took = time.monotonic() - t0
    stop(allowed["proc"])
    if built.returncode == 0 and _not_applicable(allowed, result, "build_against_graph"):
        return problems
    said = (out / "build-graph.log").read_text(errors="replace").strip().splitlines()[-1:]
    result["build_against_graph"] = {"exit": built.returncode, "after_s": round(took, 1), "said": said}
    if built.returncode == 0 or took > 30 or not said or "prefill CUDA graph" not in said[0]:
        problems.append(
            f"a build against a server whose prefill runs in a CUDA graph did not stop in < 30 s naming it: {result['build_against_graph']}"
        )
    return problems


# ---------------------------------------------------------------------------- the comparison
def _reference(model, ids):
    """HF hidden_states (post-norm last) and the pre-norm final state: the tests' independent forward, in float32."""
    from tests.fixtures.reference import independent_forward

    hidden, pre = independent_forward(model, ids)
    return [h.float() for h in hidden], pre.float()


def _token_errors(a, b):
    """Per-token relative errors |a - b| / |b| (float64 norms)."""
    return ((a.double() - b.double()).norm(dim=-1) / b.double().norm(dim=-1).clamp_min(1e-30)).cpu()


LAYERS = [f"aux hidden_states[{i}]" for i in AUX] + ["final (pre-norm)"]
SLACK = 1.5  # the server's error may be this many times transformers' own capture-dtype error


def load_transformers(model_dir: Path, device: str, dtype: str):
    """transformers' float32 model and its ``dtype`` twin (the same object when ``dtype`` is float32), on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    def load(d):
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=d, local_files_only=True).to(device).eval()

    fp32 = load(torch.float32)
    return fp32, (fp32 if getattr(torch, dtype) == torch.float32 else load(getattr(torch, dtype)))


def references(fp32, low, ids) -> tuple[tuple, tuple]:
    """:func:`_reference` of ``ids`` by the float32 model and by its capture-dtype twin (one forward when they are one)."""
    ref = _reference(fp32, ids)
    return ref, (ref if low is fp32 else _reference(low, ids))


def new_errors() -> dict[str, dict[str, list]]:
    """Per layer of :data:`LAYERS`: the server's, transformers' capture-dtype, the previous and the next layer's errors."""
    return {n: {"server": [], "hf_low": [], "prev": [], "next": []} for n in LAYERS}


def add_errors(errs: dict, refs: tuple[tuple, tuple], aux, final, rows=slice(None), stored=lambda x: x) -> None:
    """The per-token errors of stored states ``aux [N, K, H]``, ``final [N, H]`` (on the references' device) to the
    float32 :func:`references` ``refs`` at sequence positions ``rows``, appended to ``errs`` (:func:`new_errors`):
    beside them transformers' own capture-dtype states (put through ``stored``), the neighbouring layers, and for
    the pre-norm final the last layer's input and the post-norm final."""
    (ref, ref_pre), (low_hs, low_pre) = refs
    ref, ref_pre = [h[rows] for h in ref], ref_pre[rows]
    low_hs, low_pre = [h[rows] for h in low_hs], low_pre[rows]
    for k, i in enumerate(AUX):
        e = errs[LAYERS[k]]
        e["server"].append(_token_errors(aux[:, k], ref[i]))
        e["hf_low"].append(_token_errors(stored(low_hs[i]), ref[i]))
        e["prev"].append(_token_errors(aux[:, k], ref[i - 1]))
        e["next"].append(_token_errors(aux[:, k], ref[i + 1]))
    e = errs[LAYERS[-1]]
    e["server"].append(_token_errors(final, ref_pre))
    e["hf_low"].append(_token_errors(stored(low_pre), ref_pre))
    e["prev"].append(_token_errors(final, ref[-2]))  # the last layer's input, one layer early
    e["next"].append(_token_errors(final, ref[-1]))  # post-norm, what a pre/post-norm mix-up would store


def compare(dataset_dir: Path, model_dir: Path, device: str, dtype: str, storage: str = "native") -> dict:
    """Per-layer errors of the stored states to float32 transformers; with a ``storage`` encoding, transformers'
    own capture-dtype states are put through the same encoding (the host reference quantizer) before comparing."""
    import torch

    from hs_dataset.codecs.registry import get_encoding, state_encoding_for
    from hs_dataset.formats.encoding import decode_state, encode_state
    from hs_dataset.formats.reader import open_dataset

    ds = open_dataset(dataset_dir)
    encoding = get_encoding(state_encoding_for(getattr(torch, dtype), storage))

    def stored(x):  # what the dataset would hold for transformers' own capture-dtype states
        return (
            decode_state(*encode_state(x.to(getattr(torch, dtype)).cpu(), encoding), encoding).to(device).float() if encoding.scaled else x
        )

    fp32, low = load_transformers(model_dir, device, dtype)
    errs = new_errors()
    tokens = 0
    for row in ds:
        ids = row["input_ids"].to(device)
        tokens += int(ids.numel())
        aux = row["aux_hidden_states"].to(device).float()
        final = row["final_hidden_state"].to(device).float()
        add_errors(errs, references(fp32, low, ids), aux, final, stored=stored)
    return {"samples": len(ds), "tokens": tokens, "storage": encoding.name, "layers": {n: _summary(e) for n, e in errs.items()}}


def _summary(e: dict[str, list]) -> dict[str, dict[str, float]]:
    import torch

    out = {}
    for key, parts in e.items():
        v = torch.cat(parts)
        out[key] = {"median": float(v.median()), "p99": float(v.quantile(0.99)), "max": float(v.max())}
    return out


FLOAT32_LIMIT = 1e-6  # a float32 capture is compared with float32 transformers: rounding only


def error_limit(hf_low: float, slack: float) -> float:
    """The most a server error may be: ``slack`` x transformers' own capture-dtype error, at least :data:`FLOAT32_LIMIT`."""
    return max(hf_low * slack, FLOAT32_LIMIT)


def judge(result: dict, slack: float, neighbour_factor: float = 10.0, stats: tuple[str, ...] = ("median", "max")) -> list[str]:
    """Server errors within ``slack`` x transformers' own capture-dtype errors (float32: within 1e-6), for each of
    ``stats``; neighbours ``neighbour_factor`` x off (10; an encoded storage's own error, ~0.09 for nf4, leaves the
    neighbours closer)."""
    problems = []
    for name, s in result["layers"].items():
        server, low = s["server"], s["hf_low"]
        for stat in stats:
            limit = error_limit(low[stat], slack)
            if server[stat] > limit:
                problems.append(
                    f"{name}: server {stat} error {server[stat]:.3g} > {limit:.3g} ({slack} x transformers' own {low[stat]:.3g})"
                )
        nearest = min(s["prev"]["median"], s["next"]["median"])
        if nearest < neighbour_factor * server["median"]:
            problems.append(f"{name}: a neighbour is only {nearest / max(server['median'], 1e-30):.1f}x further than the server's states")
    return problems


def table(result: dict) -> str:
    lines = [
        f"{result['samples']} samples, {result['tokens']} tokens, stored {result.get('storage', 'native')}; "
        "per-token relative error to float32 transformers (hf-low: transformers' capture dtype, stored the same way)",
        f"{'layer':24} {'server med':>11} {'max':>9} {'hf-low med':>11} {'max':>9} {'prev med':>9} {'next med':>9}",
    ]
    for name, s in result["layers"].items():
        lines.append(
            f"{name:24} {s['server']['median']:11.3g} {s['server']['max']:9.3g} {s['hf_low']['median']:11.3g} "
            f"{s['hf_low']['max']:9.3g} {s['prev']['median']:9.3g} {s['next']['median']:9.3g}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--python", default=sys.executable, help="the server's Python (default: this one)")
    p.add_argument("--port", type=int, default=31000)
    p.add_argument("--chunk", type=int, default=256, help="--chunked-prefill-size")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--long", type=int, default=8, help="long conversations added to the bundled ones")
    p.add_argument("--slack", type=float, default=SLACK)
    p.add_argument("--server-arg", action="append", default=[], help="extra SGLang argument (repeatable)")
    p.add_argument("--storage", default="native", help="the card's shards.storage (fp8, nf4, mxfp4: quantized by the server on the GPU)")
    p.add_argument("--no-fail-fast", action="store_true", help="skip the two prefill-graph servers (CPU: there are no CUDA graphs)")
    p.add_argument(
        "--fail-fast-only",
        choices=["refused", "allowed"],
        action="append",
        default=[],
        help="start only this prefill-graph server (repeatable) and judge it: no main server, build or comparison",
    )
    p.add_argument(
        "--model",
        choices=["deepseek", "kimi"],
        default="deepseek",
        help="deepseek: a Kimi-shaped tiny DeepseekV3; kimi: the Kimi-K2.5-class remote-code snapshot "
        "(KimiK25ForConditionalGeneration, tiktoken tokenizer, language_model.model)",
    )
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    if args.model == "kimi":
        model = build_kimi_snapshot(Path(os.environ.get("HS_GPU_KIMI_DIR", "/tmp/hs-gpu-check-kimi")))
        reference_dir = text_model_dir(model, out / "kimi-text-model")
    else:
        model = build_model(
            Path(os.environ.get("HS_GPU_MODEL_DIR", "/tmp/hs-gpu-check-model")), args.dtype if args.device == "cuda" else "float32"
        )
        reference_dir = model
    timings["model_s"] = time.monotonic() - t0
    url = f"http://127.0.0.1:{args.port}"
    card = write_card(out / "gpu-check.yaml", model, args, args.port, Path("/dev/shm") / f"hs-gpu-check-{args.port}")
    source = write_source(out / "source.jsonl", args.long)
    if args.fail_fast_only:
        return fail_fast_only(card, source, out, args.port, tuple(args.fail_fast_only))
    t0 = time.monotonic()
    graph_servers = None if args.no_fail_fast or args.device != "cuda" else start_graph_servers(card, out, args.port)
    server = serve(card, out / "server.log", url, 900)
    timings["server_start_s"] = time.monotonic() - t0
    try:
        t0 = time.monotonic()
        built = _cli(
            "build",
            "--config",
            str(card),
            "--server",
            url,
            "--source",
            str(source),
            "--out",
            str(out / "ds"),
            "--batch-size",
            str(args.concurrency),
            log=out / "build.log",
            timeout=900,
        )
        timings["build_s"] = time.monotonic() - t0
    finally:
        stop(server)
    verified = _cli("verify", str(out / "ds"), log=out / "verify.log", timeout=600)
    report = {"timings": timings, "build_rc": built.returncode, "verify_rc": verified.returncode, "args": vars(args) | {"out": str(out)}}
    if built.returncode == 0 and verified.returncode == 0:
        t0 = time.monotonic()
        report["compare"] = compare(out / "ds", reference_dir, args.device, args.dtype, args.storage)
        timings["compare_s"] = time.monotonic() - t0
        report["problems"] = judge(report["compare"], args.slack, 10.0 if args.storage == "native" else 1.5)
        print(table(report["compare"]))
    else:
        report["problems"] = [f"build exit {built.returncode}, verify exit {verified.returncode}: see build.log / verify.log"]
    if graph_servers is not None:
        report["fail_fast"], problems = judge_graph_servers(graph_servers, card, source, out)
        report["problems"] += problems
        print("fail fast:", json.dumps(report["fail_fast"]))
    (out / "check_server.json").write_text(json.dumps(report, indent=1))
    for line in report["problems"]:
        print("PROBLEM:", line)
    print("timings:", {k: round(v, 1) for k, v in timings.items()})
    print("GPU check", "passed" if not report["problems"] else "FAILED")
    return 0 if not report["problems"] else 1


def fail_fast_only(card: Path, source: Path, out: Path, port: int, only: tuple[str, ...]) -> int:
    """The prefill-graph servers alone (one call's diagnosis of a judge that failed beside the main server)."""
    result, problems = judge_graph_servers(start_graph_servers(card, out, port, only), card, source, out)
    print("fail fast:", json.dumps(result))
    for line in problems:
        print("PROBLEM:", line)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
