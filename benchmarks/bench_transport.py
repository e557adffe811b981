"""P1: per-token cost of moving Kimi-wide hidden states out of a real SGLang server.

One real SGLang 0.5.23 server (CPU, started here through ``hs_dataset.capture.serve.plan``) with
capture on serves three kinds of requests for the same prompts, in the same run:

* ``plain``: ``/generate`` without any state return (rid without our ``hs-`` prefix, so
  the capture hook ignores it) -- the forward pass alone, the baseline both paths pay;
* ``ours``: the hs_dataset path -- ``SGLangBackend.capture_batch`` (request, server-side
  binary dump into the staging dir, client read + checks + delete) and ``ShardWriter``
  (validate, encode, hash, write, fsync, publish), one request at a time;
* ``json``: SGLang's own hidden-state return -- ``"return_hidden_states": true`` with
  the aux-capture mode on, which returns the concatenated aux states of every prompt
  token as JSON; the client reads the body, ``json.loads`` it and turns it into a
  ``[T, K, H]`` tensor of the model dtype.

The model is a tiny DeepseekV3 OF KIMI'S WIDTH (hidden 7168, 3 layers, vocab 4096, tiny
MLA/MoE dims, bfloat16) built here with a fixed seed. Aux layers: HF hidden_states
[0, 1, 2] plus the pre-norm final state, so ours moves 4 x 7168 values per token; the
JSON return carries only the 3 aux states (SGLang has no pre-norm final there), so it
moves 25% fewer values -- the comparison is in its favour.

For each prompt the three requests run back to back (plain and ours always adjacent,
order rotating), one at a time. Per token, a path's *transport* is what it adds to the
plain forward:

* ours = server extra + the client's wait for the dump after the answer, read, checks
  and hand back + ``ShardWriter.add`` and ``close`` (the shard is written to disk and
  fsynced synchronously here: no overlap with capture is credited);
* json = server extra + ``json.loads`` + conversion to a tensor.

Server extra of the JSON path = median over prompts of (CPU time used by all server
processes during that path's request - during the plain request of the same prompt),
counted as 0 when noise makes it negative. CPU time (ns-resolution schedstat of every
server thread) is less disturbed than wall time by the other jobs on the 2 shared cores;
the wall-clock version (HTTP time minus plain HTTP time) is printed too. Ours is a few
hundredths of a ms per token, below what that pairing resolves (its IQR spans about
+-0.1), so ours is counted as the server accounts it: the CPU the capture hook spent on
the forward thread for the request (``capture_cpu_ns`` in each dump's metadata) plus the
CPU of the dump writer threads during the request (schedstat of the threads the capture
core names ``hs-dump-writer``); the paired estimate is printed beside it, with whether
the accounted figure lies inside its IQR, and the pessimistic ratio uses its upper
quartile. Client-side parts are timed directly.
Last line: ``transport_speedup=X`` = json transport / ours transport, token-weighted
over the lengths. End-to-end ratios (forward included) are printed too.

The server gets ``OMP_WAIT_POLICY=PASSIVE`` (``--server-env``): on 2 cores shared with
other processes OpenMP's spin-waiting made identical forwards swing several-fold.

Runs in a temporary directory (model, staging dir under /dev/shm, shards, server log)
that is removed at the end; the server is always stopped.

    /root/venv-hs/bin/python benchmarks/bench_transport.py [--lengths 128,512] [--prompts 128:12,512:6] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import sys
import threading
import time
import urllib.request
from pathlib import Path

import torch

from hs_dataset.demo.tiny_model import TINY_DEEPSEEK_CONFIG, write_random_deepseek

HIDDEN = 7168
NUM_LAYERS = 3
VOCAB = 4096
AUX = [0, 1, 2]  # HF hidden_states indexes (0 = embeddings); + the pre-norm final = 4 states per token
DTYPE = "bfloat16"  # --dtype
DUMP_WRITER_THREAD = "hs-dump-writer"  # the OS name the capture core gives its dump writer threads
SEED = 20240607

WIDE_DEEPSEEK_CONFIG: dict = {
    **TINY_DEEPSEEK_CONFIG,  # the tiny default's MLA/MoE shape and SGLang keys, at Kimi's width
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "num_hidden_layers": NUM_LAYERS,
    "initializer_range": 0.02,
}


def build_wide_deepseek(directory: Path) -> Path:
    """Write a random DeepseekV3 of Kimi's width (fixed seed, bf16) that SGLang's CPU path can serve."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return write_random_deepseek(directory, WIDE_DEEPSEEK_CONFIG, seed=SEED, dtype=DTYPE)


from _sglang_bench_util import SERVER_PYTHON, finish_run, free_port, group_pids, server_python_missing, server_shm_files, start_run  # noqa: E402 (benchmarks/ is on sys.path)


def make_card(model_dir: Path, staging: Path, port: int, server_env: dict | None = None) -> dict:
    return {
        "name": "bench-wide-deepseek-sglang",
        "model": {"path": str(model_dir), "revision": None},
        "layers": {"convention": "hf_hidden_states_index", "aux": AUX, "final": "pre_norm"},
        "dtype": DTYPE,
        "max_length": 4096,
        "backend": {
            "name": "sglang",
            "urls": [f"http://127.0.0.1:{port}"],
            "concurrency": 1,
            "request_timeout_s": 600,
            "dump_timeout_s": 300,
            "retries": 0,
        },
        "shards": {"bytes": 1 << 30, "storage": "native"},
        "sglang": {
            "python": str(SERVER_PYTHON),
            "device": "cpu",
            "host": "127.0.0.1",
            "port": port,
            "module_path": "model",
            "radix_cache": False,
            "startup_timeout_s": 300,
            "env": {"SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1", **(server_env or {})},
            "args": [
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
            ],
            "staging": {"dir": str(staging), "max_bytes": 2 << 30, "max_files": 256, "max_wait_s": 2.0, "writer_threads": 2},
        },
    }


# ---------------------------------------------------------------------------- memory


def _group_rss_bytes(pgid: int) -> int:
    total = 0
    for entry in group_pids(pgid):
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, IndexError, ValueError):
            continue
    return total


def group_cpu_s(pgid: int, thread_name: str | None = None) -> float:
    """CPU time (s) used so far by every thread of the server's process group (ns-resolution schedstat),
    or only by those whose OS name is ``thread_name`` (the capture core names its dump writers)."""
    total = 0
    for entry in group_pids(pgid):
        try:
            tids = os.listdir(f"/proc/{entry}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                if thread_name is not None:
                    with open(f"/proc/{entry}/task/{tid}/comm") as f:
                        if f.read().strip() != thread_name:
                            continue
                with open(f"/proc/{entry}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


class MemoryWatch:
    """Peak RSS of the server's process group, sampled every 0.2 s on a thread."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _group_rss_bytes(self.pgid))
            self._stop.wait(0.2)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def client_peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---------------------------------------------------------------------------- the three paths


def post(url: str, body: dict, timeout: float = 900.0) -> bytes:
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def plain_request(url: str, sample, rid: str) -> float:
    """The forward alone: no state return, rid outside the capture prefix. Returns the HTTP time."""
    t0 = time.perf_counter()
    post(url, {"rid": rid, "input_ids": sample.input_ids.tolist(), "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    return time.perf_counter() - t0


def json_states(raw: bytes, t: int) -> torch.Tensor:
    """SGLang's JSON response -> [T, K, H] tensor of the model dtype (what a dataset needs)."""
    out = json.loads(raw)
    hs = out["meta_info"]["hidden_states"]
    rows = hs[0]  # one entry per output step; the first is the prefill: T rows of K*H floats
    ten = torch.tensor(rows, dtype=getattr(torch, DTYPE))
    if ten.shape != (t, len(AUX) * HIDDEN):
        raise RuntimeError(f"JSON hidden states have shape {tuple(ten.shape)}, expected ({t}, {len(AUX) * HIDDEN})")
    return ten.view(t, len(AUX), HIDDEN)


def json_request(url: str, sample, rid: str):
    """SGLang's JSON return. Returns (http_s, loads_and_tensor_s, response bytes, states)."""
    body = {
        "rid": rid,
        "input_ids": sample.input_ids.tolist(),
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_hidden_states": True,
    }
    t0 = time.perf_counter()
    raw = post(url, body)
    t1 = time.perf_counter()
    states = json_states(raw, sample.num_tokens)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, len(raw), states


class TimedBackend:
    """SGLangBackend with the HTTP part of each capture timed (wraps the instance's _post_generate)."""

    def __init__(self, backend) -> None:
        import hs_dataset.capture.sglang.dumps as client_module

        self.backend = backend
        self.last_http = 0.0
        self.last_meta: dict = {}
        read_dump = client_module.read_dump

        def keep_metadata(path):
            meta, tensors = read_dump(path)
            self.last_meta = meta
            return meta, tensors

        client_module.read_dump = keep_metadata  # the dump's capture_cpu_ns: the hook's own CPU, as the server counted it
        orig = backend._post_generate

        async def timed(ep, rid, ids):
            t0 = time.perf_counter()
            try:
                return await orig(ep, rid, ids)
            finally:
                self.last_http = time.perf_counter() - t0

        backend._post_generate = timed

    def capture(self, sample):
        """Returns (http_s, after_response_s, result): after the answer, the wait for the dump + read + checks."""
        from hs_dataset.capture.base import CaptureFailure

        t0 = time.perf_counter()
        (result,) = self.backend.capture_batch([sample])
        total = time.perf_counter() - t0
        if isinstance(result, CaptureFailure):
            raise RuntimeError(f"capture failed: {result.reason}")
        return self.last_http, total - self.last_http, result


def make_samples(n: int, length: int, seed: int):
    from hs_dataset.sample import TokenizedSample

    g = torch.Generator().manual_seed(seed)
    return [
        TokenizedSample(f"L{length}-{seed}-{i}", torch.randint(2, VOCAB, (length,), generator=g), torch.ones(length, dtype=torch.bool))
        for i in range(n)
    ]


def quantile(xs, q: float) -> float:
    """Linear-interpolated quantile (q in [0, 1])."""
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(xs):
    return quantile(xs, 0.5)


ORDERS = (("plain", "ours", "json"), ("ours", "plain", "json"), ("json", "plain", "ours"), ("json", "ours", "plain"))


def bench_length(url, pgid: int, tb: TimedBackend, writer_dir: Path, metadata: dict, norm_weight, length: int, n: int) -> dict:
    """n prompts of `length` tokens; for each, one request of every path back to back (rotating order)."""
    from hs_dataset.formats import ShardWriter

    # warm-up of every path at this length; also checks both paths carry the same aux states
    (warm,) = make_samples(1, length, seed=7 * length)
    plain_request(url, warm, f"plain-w{length}")
    _, _, ours_res = tb.capture(warm)
    _, _, _, json_aux = json_request(url, warm, f"json-w{length}")
    same = torch.equal(ours_res.aux_hidden_states, json_aux)
    diff = float((ours_res.aux_hidden_states.float() - json_aux.float()).abs().max())
    del ours_res, json_aux

    # The writer below holds every sample to the end (one shard); in a long run it hands each
    # shard's read buffers back to the client's pool for later dumps. Reading as many dumps
    # first and dropping them leaves the pool as a long run's earlier shards would.
    pooled = [tb.capture(w)[2] for w in make_samples(n, length, seed=11 * length)]
    del pooled
    gc.collect()

    samples = make_samples(n, length, seed=1000 + length)
    per = {
        k: []
        for k in (
            "plain_http",
            "ours_http",
            "ours_after",
            "ours_add",
            "json_http",
            "json_conv",
            "plain_cpu",
            "ours_cpu",
            "json_cpu",
            "ours_hook",
            "ours_dumpw",
        )
    }
    json_bytes = 0
    writer = ShardWriter(writer_dir, metadata, final_norm_weight=norm_weight, shard_bytes=1 << 30)
    try:
        for i, s in enumerate(samples):
            for path in ORDERS[i % len(ORDERS)]:  # plain and ours always adjacent
                cpu0, dumpw0 = group_cpu_s(pgid), group_cpu_s(pgid, DUMP_WRITER_THREAD)
                if path == "plain":
                    per["plain_http"].append(plain_request(url, s, f"plain-{length}-{i}"))
                elif path == "ours":
                    http, after, result = tb.capture(s)
                    a0 = time.perf_counter()
                    writer.add(result)
                    per["ours_add"].append(time.perf_counter() - a0)
                    per["ours_http"].append(http)
                    per["ours_after"].append(after)
                    per["ours_hook"].append(int(tb.last_meta["capture_cpu_ns"]) / 1e9)
                    del result
                else:
                    http, conv, nb, states = json_request(url, s, f"json-{length}-{i}")
                    per["json_http"].append(http)
                    per["json_conv"].append(conv)
                    json_bytes += nb
                    del states
                per[f"{path}_cpu"].append(group_cpu_s(pgid) - cpu0)
                if path == "ours":
                    per["ours_dumpw"].append(group_cpu_s(pgid, DUMP_WRITER_THREAD) - dumpw0)
                gc.collect()
    finally:
        c0 = time.perf_counter()
        writer.close()  # flush + fsync + publish the shard
    close_s = time.perf_counter() - c0
    shard_bytes = sum(p.stat().st_size for p in writer_dir.glob("*.safetensors"))
    shutil.rmtree(writer_dir, ignore_errors=True)

    tokens = n * length
    ms = lambda seconds: seconds * 1000 / tokens  # noqa: E731  total seconds -> ms per token
    r = {"length": length, "n": n, "tokens": tokens, "same": same, "diff": diff}
    r["plain"] = ms(sum(per["plain_http"]))
    r["ours_e2e"] = ms(sum(per["ours_http"]) + sum(per["ours_after"]) + sum(per["ours_add"]) + close_s)
    r["json_e2e"] = ms(sum(per["json_http"]) + sum(per["json_conv"]))
    # server-side extra of each path: median over prompts of (its HTTP time - the plain HTTP time of the same prompt)
    ours_d = [(o - p) * 1000 / length for o, p in zip(per["ours_http"], per["plain_http"])]
    json_d = [(j - p) * 1000 / length for j, p in zip(per["json_http"], per["plain_http"])]
    r["ours_server"], r["json_server"] = median(ours_d), median(json_d)
    r["ours_server_iqr"] = (quantile(ours_d, 0.25), quantile(ours_d, 0.75))
    r["json_server_iqr"] = (quantile(json_d, 0.25), quantile(json_d, 0.75))
    ours_c = [(o - p) * 1000 / length for o, p in zip(per["ours_cpu"], per["plain_cpu"])]
    json_c = [(j - p) * 1000 / length for j, p in zip(per["json_cpu"], per["plain_cpu"])]
    r["plain_cpu"] = ms(sum(per["plain_cpu"]))
    r["ours_cpu"], r["json_cpu"] = median(ours_c), median(json_c)
    r["ours_cpu_iqr"] = (quantile(ours_c, 0.25), quantile(ours_c, 0.75))
    r["json_cpu_iqr"] = (quantile(json_c, 0.25), quantile(json_c, 0.75))
    r["ours_after"] = ms(sum(per["ours_after"]))
    r["ours_writer"] = ms(sum(per["ours_add"]) + close_s)
    r["json_conv"] = ms(sum(per["json_conv"]))
    # ours' server extra as the server accounts it: the hook's CPU on the forward thread (from each dump)
    # + the dump writer threads' CPU (/proc, by thread name); json's: the paired median of server CPU time (>= 0)
    r["ours_hook"], r["ours_dumpw"] = ms(sum(per["ours_hook"])), ms(sum(per["ours_dumpw"]))
    r["ours_acct"] = r["ours_hook"] + r["ours_dumpw"]
    r["ours_t"] = r["ours_acct"] + r["ours_after"] + r["ours_writer"]
    r["json_t"] = max(r["json_cpu"], 0.0) + r["json_conv"]
    r["ours_tensors"] = r["ours_acct"] + r["ours_after"]  # up to client tensors, like the JSON path
    r["ours_tensors_paired"] = max(r["ours_cpu"], 0.0) + r["ours_after"]  # the same with the paired estimate
    # pessimistic for ours: server extras at the quartile against it
    r["ours_t_hi"] = max(r["ours_cpu_iqr"][1], 0.0) + r["ours_after"] + r["ours_writer"]
    r["json_t_lo"] = max(r["json_cpu_iqr"][0], 0.0) + r["json_conv"]
    # the same with the wall-clock paired median instead of CPU time
    r["ours_t_wall"] = max(r["ours_server"], 0.0) + r["ours_after"] + r["ours_writer"]
    r["json_t_wall"] = max(r["json_server"], 0.0) + r["json_conv"]
    plain_pt = [p * 1000 / length for p in per["plain_http"]]
    r["plain_spread"] = (min(plain_pt), max(plain_pt))
    r["shard_kib"] = shard_bytes / tokens / 1024
    r["json_kib"] = json_bytes / tokens / 1024
    return r


# ---------------------------------------------------------------------------- main


def main() -> int:
    global DTYPE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="128,512", help="prompt lengths (2048 needs ~11 GB for the JSON path: not by default)")
    ap.add_argument("--prompts", default="128:12,512:6,1024:3,2048:2", help="prompts per length (each gets one request per path)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="model dtype (Kimi: bfloat16)")
    ap.add_argument("--server-env", nargs="*", default=["OMP_WAIT_POLICY=PASSIVE"], help="extra KEY=VALUE for the server")
    args = ap.parse_args()
    DTYPE = args.dtype
    lengths = [int(x) for x in args.lengths.split(",") if x]
    per_len = {int(k): int(v) for k, v in (p.split(":") for p in args.prompts.split(","))}

    if server_python_missing():
        return 2

    from hs_dataset.capture.serve import launch, plan_server
    from hs_dataset.capture.sglang.backend import SGLangBackend
    from hs_dataset.config import card_from_dict

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    tmp, shm = start_run("transport")  # SIGTERM -> SystemExit, so the finally below still stops the server
    server = None
    shm_seen: set[str] = set()
    backend = None
    started = time.perf_counter()
    try:
        t0 = time.perf_counter()
        model_dir = build_wide_deepseek(tmp / "model")
        weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
        print(
            f"model: DeepseekV3 hidden {HIDDEN}, {NUM_LAYERS} layers, vocab {VOCAB}, {DTYPE}, "
            f"{weights / 2**20:.0f} MiB of weights, built in {time.perf_counter() - t0:.1f} s (seed {SEED})"
        )
        port = free_port()
        server_env = dict(kv.split("=", 1) for kv in args.server_env)
        card = card_from_dict(make_card(model_dir, shm / "stage", port, server_env))
        plan = plan_server(card, port=port, staging_dir=str(shm / "stage"), python=str(SERVER_PYTHON))
        print(
            f"server: SGLang {plan.sglang_version} on CPU, mechanism {plan.mechanism}, aux HF {plan.hf_aux_layer_ids} "
            f"-> sglang {plan.sglang_aux_layer_ids}, staging dir on {'tmpfs' if shm != tmp else 'disk'}, "
            f"extra server env {args.server_env}"
        )
        t0 = time.perf_counter()
        server = launch(plan, log_path=str(tmp / "server.log"), timeout=300)
        shm_seen = server_shm_files(server.proc.pid)
        print(f"server healthy after {time.perf_counter() - t0:.1f} s")

        backend = SGLangBackend.from_card(card, model_path=str(model_dir), servers=[server.url])
        info = backend.info()  # validation + probe request
        assert info.hidden_size == HIDDEN, info.hidden_size
        tb = TimedBackend(backend)
        metadata = {
            "config_name": card.name,
            "model": {"path": str(model_dir)},
            "aux_layer_ids": list(info.aux_layer_ids),
            "final_state": "pre_norm",
            "dtype": DTYPE,
            "hidden_size": info.hidden_size,
        }
        esize = torch.empty(0, dtype=getattr(torch, DTYPE)).element_size()
        print(
            f"ours moves {len(AUX)} aux + final = {len(AUX) + 1} x {HIDDEN} values/token ({(len(AUX) + 1) * HIDDEN * esize / 1024:.0f} KiB); "
            f"the JSON return only the {len(AUX)} aux states (SGLang returns no final state)"
        )
        print("one request at a time; for each prompt one request per path, back to back, in rotating order")
        print()

        rows = []
        with MemoryWatch(server.proc.pid) as mem:
            for length in lengths:
                r = bench_length(
                    server.url,
                    server.proc.pid,
                    tb,
                    tmp / f"shards-{length}",
                    metadata,
                    info.final_norm_weight,
                    length,
                    per_len.get(length, 2),
                )
                r["server_peak"] = mem.peak
                rows.append(r)
                print(
                    f"[T={length}] {r['n']} prompts x 3 paths; aux states identical on both paths: {r['same']} (max |diff| {r['diff']:g})"
                )
                print(
                    f"  plain forward, no state return   {r['plain']:9.3f} ms/token (per prompt {r['plain_spread'][0]:.2f}-{r['plain_spread'][1]:.2f})"
                )
                print(f"  ours end to end                  {r['ours_e2e']:9.3f} ms/token   {r['shard_kib']:6.1f} KiB/token into shards")
                print(f"  json end to end                  {r['json_e2e']:9.3f} ms/token   {r['json_kib']:6.1f} KiB/token of JSON")
                print(
                    f"  server extra vs plain, paired median per prompt (IQR): CPU time of all server processes ours {r['ours_cpu']:+.3f} "
                    f"({r['ours_cpu_iqr'][0]:+.3f}..{r['ours_cpu_iqr'][1]:+.3f}), json {r['json_cpu']:+.3f} ({r['json_cpu_iqr'][0]:+.3f}..{r['json_cpu_iqr'][1]:+.3f}); "
                    f"HTTP wall time ours {r['ours_server']:+.3f} ({r['ours_server_iqr'][0]:+.3f}..{r['ours_server_iqr'][1]:+.3f}), "
                    f"json {r['json_server']:+.3f} ({r['json_server_iqr'][0]:+.3f}..{r['json_server_iqr'][1]:+.3f}); plain forward uses {r['plain_cpu']:.3f} CPU ms/token"
                )
                inside = r["ours_cpu_iqr"][0] <= r["ours_acct"] <= r["ours_cpu_iqr"][1]
                print(
                    f"  ours server extra as the server accounts it: {r['ours_acct']:.4f} ms/token = hook on the forward thread {r['ours_hook']:.4f}"
                    f" + dump writer threads {r['ours_dumpw']:.4f} ({'inside' if inside else 'OUTSIDE'} the paired estimate's IQR above)"
                )
                print(
                    f"  ours transport {r['ours_t']:7.3f} ms/token = server extra (accounted) {r['ours_acct']:.3f}"
                    f" + dump wait/read/check/hand back {r['ours_after']:.3f} + shard writer add/close {r['ours_writer']:.3f}"
                )
                print(
                    f"  json transport {r['json_t']:7.3f} ms/token = server extra (CPU, >= 0) {max(r['json_cpu'], 0):.3f}"
                    f" + json.loads/to tensor {r['json_conv']:.3f}"
                )
                print(
                    f"  -> transport ratio {r['json_t'] / r['ours_t']:.0f}x (with wall-clock server extras {r['json_t_wall'] / r['ours_t_wall']:.0f}x; "
                    f"to client tensors only, i.e. ours without the shard writer, {r['json_t'] / r['ours_tensors']:.0f}x); "
                    f"end-to-end ratio {r['json_e2e'] / r['ours_e2e']:.1f}x"
                )
                print(f"  peak RSS so far: server processes {mem.peak / 2**30:.2f} GiB, this client {client_peak_rss() / 2**30:.2f} GiB")
                print(flush=True)

        weight = sum(r["tokens"] for r in rows)
        ours_t = sum(r["ours_t"] * r["tokens"] for r in rows) / weight
        json_t = sum(r["json_t"] * r["tokens"] for r in rows) / weight
        print(
            "summary (transport = what a path adds to the plain forward, ms/token; server part: CPU time, ours as the server accounts it):"
        )
        for r in rows:
            print(
                f"  T={r['length']:5d}: ours {r['ours_t']:.3f}, json {r['json_t']:.3f} -> {r['json_t'] / r['ours_t']:.0f}x"
                f"   (end to end incl. the forward: ours {r['ours_e2e']:.2f}, json {r['json_e2e']:.2f} -> {r['json_e2e'] / r['ours_e2e']:.1f}x)"
            )
        ours_tensors = sum(r["ours_tensors"] * r["tokens"] for r in rows) / weight
        ours_hi = sum(r["ours_t_hi"] * r["tokens"] for r in rows) / weight
        json_lo = sum(r["json_t_lo"] * r["tokens"] for r in rows) / weight
        print(
            f"  token-weighted: ours {ours_t:.3f}, json {json_t:.3f} -> {json_t / ours_t:.1f}x "
            f"(pessimistic for ours, server extras at the quartiles against it: {json_lo / ours_hi:.1f}x)"
        )
        ours_w = sum(r["ours_t_wall"] * r["tokens"] for r in rows) / weight
        json_w = sum(r["json_t_wall"] * r["tokens"] for r in rows) / weight
        print(f"  with wall-clock server extras instead of CPU time: ours {ours_w:.3f}, json {json_w:.3f} -> {json_w / ours_w:.1f}x")
        ours_tensors_paired = sum(r["ours_tensors_paired"] * r["tokens"] for r in rows) / weight
        print(
            f"  to client tensors only (ours without the shard writer: {ours_tensors:.3f}): {json_t / ours_tensors:.1f}x "
            f"(with ours' paired server extra instead of the accounted one: {ours_tensors_paired:.3f}, {json_t / ours_tensors_paired:.1f}x)"
        )
        print(
            f"  peak RSS: server processes {max(r['server_peak'] for r in rows) / 2**30:.2f} GiB, client {client_peak_rss() / 2**30:.2f} GiB;"
            f" total run {time.perf_counter() - started:.0f} s"
        )
        print(f"transport_speedup={json_t / ours_t:.1f}")
        return 0
    except Exception:
        if server is not None:
            print("server log tail:\n" + server.log_tail(3000), file=sys.stderr)
        raise
    finally:
        finish_run(server, shm_seen, tmp, shm, [backend] if backend is not None else [])


if __name__ == "__main__":
    sys.exit(main())
