"""P5: end-to-end samples/s with N concurrent capture requests vs one at a time, same server.

One real SGLang 0.5.23 server (CPU) runs the ``tiny-deepseek-sglang`` card (the tiny
DeepseekV3, float32, aux [2, 3, 4] + pre-norm final), started here through
``hs_dataset.capture.serve.plan``. The same samples -- the 42 bundled conversations, cycled to
``--samples`` (48) with distinct ids, 29-521 tokens each -- are captured two ways,
alternating (serial, concurrent, concurrent, serial, ...) so that drift in the machine's
load hits both:

* ``stream``: the pipeline's inner loop -- ``SGLangBackend.capture_stream`` over the
  tokenized samples into a ``ShardWriter`` (closed, i.e. shards fsynced and published,
  inside the timing);
* ``build``: ``build_dataset`` itself (tokenizer load, tokenization, capture, shard
  writer, run report), with the backend passed in already validated;
* ``plain`` (reference): the same prompts as plain ``/generate`` requests that nothing
  captures -- the server's own throughput at that concurrency, i.e. the ceiling.

Each figure is the median of ``--rounds`` runs. Serial = ``concurrency=1`` (one request in flight); concurrent = ``--concurrency`` (16)
requests in flight. Whether prefills really batched is read from the server's log
("Prefill batch, #new-seq: N" lines written during each run): the batch sizes seen are
printed. Last line: ``concurrency_speedup=X build_vs_stream=Y`` (stream samples/s, concurrent /
serial; ``build_dataset`` samples/s against the capture stream's, concurrent).

The server gets ``OMP_WAIT_POLICY=PASSIVE`` (``--server-env``): on 2 cores shared with
other processes, OpenMP's spin-waiting made its forward swing 10-30x between identical
runs; passive waiting keeps its 2 threads and made runs repeatable (see the report).

Runs in temporary directories (staging dir under /dev/shm, datasets, server log) removed
at the end; the server is always stopped. The tiny model is reused from the hs_dataset
cache when it is already built there, else built into the temporary directory.

    /root/venv-hs/bin/python benchmarks/bench_concurrency.py [--samples 48] [--concurrency 16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import torch

CARD = "tiny-deepseek-sglang"
_PREFILL_RE = re.compile(r"Prefill batch(?: \[\d+\])?, #new-seq: (\d+), #new-token: (\d+)")


from _sglang_bench_util import SERVER_PYTHON, finish_run, free_port, server_python_missing, server_shm_files, start_run  # noqa: E402 (benchmarks/ is on sys.path)


def tiny_model(tmp: Path) -> Path:
    from hs_dataset.demo.tiny_model import build_tiny_deepseek, tiny_model_dir

    cached = tiny_model_dir()
    if (cached / "config.json").exists():
        return cached
    return build_tiny_deepseek(cache_dir=tmp / "cache")


def conversation_rows(n: int) -> list[dict]:
    from hs_dataset.sources import bundled_conversations_path

    with open(bundled_conversations_path(), encoding="utf-8") as f:
        base = [json.loads(line) for line in f if line.strip()]
    return [{**base[i % len(base)], "id": f"{base[i % len(base)]['id']}-r{i // len(base)}"} for i in range(n)]


class LogWindow:
    """The server log lines written between start() and batches()."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0

    def start(self) -> None:
        self.offset = os.path.getsize(self.path)

    def batches(self) -> list[tuple[int, int]]:
        time.sleep(0.3)  # let the last lines reach the file
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            text = f.read().decode(errors="replace")
        return [(int(a), int(b)) for a, b in _PREFILL_RE.findall(text)]


def run_stream(backend, samples, concurrency: int, out: Path, metadata: dict, norm_weight) -> float:
    from hs_dataset.capture.base import CaptureFailure
    from hs_dataset.formats import ShardWriter

    t0 = time.perf_counter()
    failures = []
    with ShardWriter(out, metadata, final_norm_weight=norm_weight, shard_bytes=256 << 20) as writer:
        for result in backend.capture_stream(iter(samples), batch_size=concurrency):
            if isinstance(result, CaptureFailure):
                failures.append(result)
            else:
                writer.add(result)
    took = time.perf_counter() - t0
    if failures or writer.report.written != len(samples):
        raise RuntimeError(f"{len(failures)} capture failures ({failures[:2]}), {writer.report.written}/{len(samples)} written")
    return took


def run_build(card, backend, rows, concurrency: int, out: Path) -> tuple[float, object]:
    from hs_dataset.pipeline.build import build_dataset

    t0 = time.perf_counter()
    report = build_dataset(card, out, source=rows, num_samples=len(rows), batch_size=concurrency, backend=backend)
    took = time.perf_counter() - t0
    if report.samples_written != len(rows) or report.capture_failures:
        raise RuntimeError(f"build wrote {report.samples_written}/{len(rows)}; failures {report.capture_failures[:2]}")
    return took, report


def run_plain(url: str, samples, concurrency: int, tag: str) -> float:
    """The same prompts as plain SGLang requests (no capture: rids outside the hs- prefix): the server's own ceiling."""
    import asyncio

    import aiohttp

    async def go():
        sem = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

            async def one(i, s):
                async with sem:
                    body = {
                        "rid": f"plain-{tag}-{i}",
                        "input_ids": s.input_ids.tolist(),
                        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                    }
                    async with session.post(url + "/generate", json=body) as resp:
                        await resp.read()
                        if resp.status != 200:
                            raise RuntimeError(f"plain request answered HTTP {resp.status}")

            await asyncio.gather(*(one(i, s) for i, s in enumerate(samples)))

    t0 = time.perf_counter()
    asyncio.run(go())
    return time.perf_counter() - t0


def median(xs):
    xs = sorted(xs)
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def describe(batches: list[tuple[int, int]]) -> str:
    if not batches:
        return "no prefill lines found in the server log"
    sizes = Counter(n for n, _ in batches)
    hist = ", ".join(f"{k}x{v}" for k, v in sorted(sizes.items()))
    reqs = sum(n for n, _ in batches)
    return (
        f"{len(batches)} prefill passes for {reqs} requests, mean {reqs / len(batches):.1f}, max {max(sizes)} "
        f"requests/pass (size x passes: {hist})"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="each round runs serial and concurrent once (order alternates)")
    ap.add_argument("--server-env", nargs="*", default=["OMP_WAIT_POLICY=PASSIVE"], help="extra KEY=VALUE for the server")
    args = ap.parse_args()

    if server_python_missing():
        return 2

    from transformers import AutoTokenizer

    from hs_dataset.capture.serve import launch, plan_server
    from hs_dataset.capture.sglang.backend import SGLangBackend
    from hs_dataset.config import load_card
    from hs_dataset.sources import SampleRules, iter_samples

    torch.set_num_threads(1)
    tmp, shm = start_run("concurrency")  # SIGTERM -> SystemExit, so the finally below still stops the server
    server = None
    shm_seen: set[str] = set()
    backends = []
    started = time.perf_counter()
    try:
        model_dir = tiny_model(tmp)
        port = free_port()
        base = load_card(CARD)
        staging = {**base.sglang.staging.model_dump(), "dir": str(shm / "stage")}
        # On 2 shared cores, OpenMP's spin-waiting made the server's forward swing 10-30x from run to run
        # (other processes on the cores); passive waiting keeps its 2 threads and makes runs repeatable.
        env = {**base.sglang.env, **dict(kv.split("=", 1) for kv in args.server_env)}
        card = base.with_overrides(
            model={"path": str(model_dir)},
            backend={"urls": [f"http://127.0.0.1:{port}"]},
            sglang={"port": port, "python": str(SERVER_PYTHON), "staging": staging, "env": env},
        )
        plan = plan_server(card, port=port, staging_dir=staging["dir"], python=str(SERVER_PYTHON), model_path=str(model_dir))
        t0 = time.perf_counter()
        server = launch(plan, log_path=str(tmp / "server.log"), timeout=300)
        shm_seen = server_shm_files(server.proc.pid)
        print(
            f"server: SGLang {plan.sglang_version} on CPU, card {CARD} ({card.dtype}, aux {card.aux_layer_ids}), "
            f"extra server env {args.server_env}, healthy after {time.perf_counter() - t0:.1f} s"
        )

        rows = conversation_rows(args.samples)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        samples = list(iter_samples(rows, tokenizer, SampleRules(max_length=card.max_length, overflow=card.overflow)))
        t_tok = time.process_time()
        list(iter_samples(rows, tokenizer, SampleRules(max_length=card.max_length, overflow=card.overflow)))
        tokenize_cpu_s = time.process_time() - t_tok  # what build_dataset adds per run, on cores the server also needs
        assert len(samples) == args.samples, len(samples)
        tokens = sum(s.num_tokens for s in samples)
        lens = sorted(s.num_tokens for s in samples)
        print(
            f"samples: {len(samples)} bundled conversations (cycled), {tokens} tokens, {lens[0]}-{lens[-1]} tokens each "
            f"(median {lens[len(lens) // 2]})"
        )

        modes = {"serial": 1, "concurrent": args.concurrency}
        be = {}
        for name, conc in modes.items():
            b = SGLangBackend.from_card(card.with_overrides(backend={"concurrency": conc}), model_path=str(model_dir), servers=[server.url])
            backends.append(b)
            info = b.info()  # validation + probe, outside the timings
            be[name] = b
        metadata = {
            "config_name": card.name,
            "model": {"path": str(model_dir)},
            "aux_layer_ids": list(info.aux_layer_ids),
            "final_state": "pre_norm",
            "dtype": card.dtype,
            "hidden_size": info.hidden_size,
        }
        window = LogWindow(str(tmp / "server.log"))

        # warm-up: both modes once on a few samples (first prefills, writer, client threads)
        for name, conc in modes.items():
            run_stream(be[name], samples[: max(conc, 4)], conc, tmp / f"warm-{name}", metadata, info.final_norm_weight)

        res = {(k, m): [] for k in ("stream", "build", "plain") for m in modes}
        seen = {m: [] for m in modes}
        order = ["serial", "concurrent"]
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                conc = modes[name]
                window.start()
                took = run_stream(be[name], samples, conc, tmp / f"stream-{name}-{r}", metadata, info.final_norm_weight)
                seen[name].extend(window.batches())
                res[("stream", name)].append(took)
                window.start()
                took_b, _ = run_build(card, be[name], rows, conc, tmp / f"build-{name}-{r}")
                seen[name].extend(window.batches())
                res[("build", name)].append(took_b)
                took_p = run_plain(server.url, samples, conc, f"{name}-{r}")
                res[("plain", name)].append(took_p)
                print(
                    f"round {r + 1} {name:10s} (in flight {conc:2d}): stream {len(samples) / took:6.2f} samples/s, "
                    f"build_dataset {len(samples) / took_b:6.2f}, plain requests without capture {len(samples) / took_p:6.2f}",
                    flush=True,
                )
                shutil.rmtree(tmp / f"stream-{name}-{r}", ignore_errors=True)
                shutil.rmtree(tmp / f"build-{name}-{r}", ignore_errors=True)

        print()
        rate = {key: len(samples) / median(v) for key, v in res.items()}  # median run of each kind
        labels = (
            ("stream", "SGLangBackend.capture_stream + ShardWriter (capture, checks, shards fsynced)"),
            ("build", "build_dataset end to end (incl. tokenizer load + tokenization per run)"),
            ("plain", "reference: the same prompts as plain SGLang requests, no capture, nothing stored"),
        )
        for kind, label in labels:
            print(f"{label}  [median of {args.rounds} runs]:")
            for name in modes:
                print(f"  {name:10s} {rate[(kind, name)]:7.2f} samples/s  ({rate[(kind, name)] * tokens / len(samples):8.0f} tokens/s)")
            print(f"  speedup    {rate[(kind, 'concurrent')] / rate[(kind, 'serial')]:7.2f}x")
        print(
            f"capture stream vs plain requests: serial {rate[('stream', 'serial')] / rate[('plain', 'serial')]:.0%}, "
            f"concurrent {rate[('stream', 'concurrent')] / rate[('plain', 'concurrent')]:.0%} of the server's own throughput"
        )
        print("prefill batching (server log, stream + build runs of each mode):")
        for name in modes:
            print(f"  {name:10s} {describe(seen[name])}")
        batched = max((n for n, _ in seen["concurrent"]), default=0) > 1
        print(f"prefills batched under concurrency: {'yes' if batched else 'NO'}; total run {time.perf_counter() - started:.0f} s")
        build_vs = {name: rate[("build", name)] / rate[("stream", name)] for name in modes}
        print(f"build_dataset vs capture stream: serial {build_vs['serial']:.2f}, concurrent {build_vs['concurrent']:.2f}")
        gap = {name: len(samples) / rate[("build", name)] - len(samples) / rate[("stream", name)] for name in modes}
        print(
            f"  per run, build_dataset takes {gap['serial']:.2f} s (serial) / {gap['concurrent']:.2f} s (concurrent) longer; "
            f"tokenizing the {len(samples)} samples alone costs {tokenize_cpu_s:.2f} s of CPU "
            f"({tokenize_cpu_s / len(samples) * 1e3:.1f} ms/sample), on {os.cpu_count()} cores the server's forward also uses"
        )
        print(
            f"concurrency_speedup={rate[('stream', 'concurrent')] / rate[('stream', 'serial')]:.2f} "
            f"build_vs_stream={build_vs['concurrent']:.2f}"
        )
        return 0
    except Exception:
        if server is not None:
            print("server log tail:\n" + server.log_tail(3000), file=sys.stderr)
        raise
    finally:
        finish_run(server, shm_seen, tmp, shm, backends)


if __name__ == "__main__":
    sys.exit(main())
