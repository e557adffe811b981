"""Regeneration at the server's own speed: ``build --regenerate`` against a continuous client, the prefill, and the old windowed engine.

The same SGLang server, the same run; each figure is the best of ``--rounds`` with the
order of the runs rotated every round (the machine is noisy). Per round:

* ``new``: ``build_dataset`` with regeneration (what ``hs-dataset build --regenerate``
  runs): the pump keeps the requests in flight, capture overlaps generation, shards written;
* ``old``: the same build with the engine before this change, copied here
  (:class:`WindowedRegeneration`): fixed windows of ``concurrency`` conversations, turn k
  of a window in one blocking call, the next window only when capture asks for more;
* ``client``: a plain aiohttp client keeping the same number of requests in flight
  continuously, sending every turn's prompt in source order (taken from the reference
  build's records: the same prompts, the same lengths) with no turn waiting for another;
* ``prefill``: the same client sending each stored sample's ids with ``max_new_tokens``
  1 (the prefill capture costs the server), as many in flight as capture uses.

With ``--isolate`` each round also runs ``isolated``: the ``new`` build with its capture
left out (regeneration alone), to tell the engine's scheduling from what capture costs the
server. Printed: (a) generation throughput of ``new`` (generated tokens over the span from its
first request to its last answer) / the client's; (b) ``new``'s wall time (the whole
``build_dataset``: start-up, regeneration, capture, shards) / (client + prefill time);
(c) ``new`` against ``old``, both ways. Answer lengths spread as real answers do: each
user turn says how long its answer must be (``[answer N tokens]``, N drawn lognormal,
sigma ``--sigma``), and every request of the build and the client asks for exactly that
many tokens with ``ignore_eos`` (the build's generator is the package's, with its request
body changed only in those two fields). The coefficient of variation of the lengths is
printed; the run is refused below 1.

Without ``--server`` a CPU SGLang server (``.sglang-venv``) is started here with the
``tiny-deepseek-sglang`` card. With ``--server URL --model-path DIR`` (a GPU host, a
server started by ``hs-dataset serve``) the card is ``--config`` or derived from the
model; use at least 256 conversations there. Output is appended to ``--results``.

    .venv/bin/python benchmarks/bench_regenerate.py [--conversations 64] [--mean-tokens 40] [--concurrency 16] [--rounds 3]
    python benchmarks/bench_regenerate.py --server http://127.0.0.1:30000 --model-path /models/kimi-wide \
        --conversations 256 --mean-tokens 1500 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import json
import math
import random
import re
import shutil
import statistics
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sglang_bench_util import SERVER_PYTHON, finish_run, free_port, server_python_missing, server_shm_files, start_run

RESULTS = Path(__file__).resolve().parent / "results"
LOCAL_CARD = "tiny-deepseek-sglang"
_MARK = re.compile(r"\[answer (\d+) tokens\]")


# ---------------------------------------------------------------------------- the workload
def conversations(n: int, mean_tokens: float, sigma: float, max_tokens: int, seed: int) -> tuple[list[dict], list[int]]:
    """``n`` chats of 1-3 user turns (70/20/10 %), each turn naming its answer's length; and all those lengths."""
    rng = random.Random(seed)
    mu = math.log(mean_tokens) - sigma * sigma / 2  # lognormal with this mean
    rows, lengths = [], []
    for i in range(n):
        messages = []
        for turn in range(rng.choices([1, 2, 3], [0.7, 0.2, 0.1])[0]):
            length = max(1, min(max_tokens, round(rng.lognormvariate(mu, sigma))))
            lengths.append(length)
            topic = " ".join(rng.choice(["sea", "tree", "stone", "cloud", "river", "lamp"]) for _ in range(rng.randint(2, 12)))
            messages += [
                {"role": "user", "content": f"Item {i}, turn {turn}: {topic}. [answer {length} tokens]"},
                {"role": "assistant", "content": "ok"},
            ]
        rows.append({"id": f"conv-{i:05d}", "messages": messages})
    return rows, lengths


def answer_length(tokenizer: Any, prompt: list[int]) -> int:
    """The length the prompt's last user turn asks for."""
    return int(_MARK.findall(tokenizer.decode(prompt[-160:]))[-1])


def cv(values: list[int]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values)


# ---------------------------------------------------------------------------- the build's generator, lengths drawn
class Span:
    """First request to last answer of one run, and the tokens generated."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.end = 0.0
        self.tokens = 0
        self.pending = 0
        self._area = 0.0  # integral of requests in flight over time
        self._since = 0.0

    def seconds(self) -> float:
        return self.end - (self.start or self.end)

    def change(self, by: int) -> None:
        now = time.perf_counter()
        if self.start is None:
            self.start = self._since = now
        self._area += self.pending * (now - self._since)
        self.pending, self._since = self.pending + by, now

    def mean_in_flight(self) -> float:
        return self._area / max(self.seconds(), 1e-9)


def drawn_lengths(tokenizer: Any, span: Span) -> Any:
    """The package's SGLang generator with each request's max_new_tokens set to its turn's length, ignore_eos on, timed."""
    from hs_dataset.capture.sglang.generate import SGLangGenerator

    class DrawnLengths(SGLangGenerator):
        def body(self, prompt, params):
            body = super().body(prompt, params)
            body["sampling_params"].update(max_new_tokens=answer_length(tokenizer, prompt), ignore_eos=True)
            return body

        async def _generate_one(self, prompt, params):
            span.change(+1)
            result = await super()._generate_one(prompt, params)
            span.change(-1)
            span.end, span.tokens = time.perf_counter(), span.tokens + len(result.token_ids)
            return result

    return DrawnLengths


# ---------------------------------------------------------------------------- the engine before this change (faithful copy)
def windowed_regeneration() -> Any:
    """The regeneration engine as it was: fixed windows of ``concurrency`` (here: the requests in flight) conversations, turn k of a window in one
    blocking ``generate`` call, a window stored before its samples go on, the next one generated only when capture
    pulls past the last (so capture waits for generation and generation for capture)."""
    from hs_dataset.formats.regenerated_record import ConversationRecord
    from hs_dataset.regenerate.engine import Regeneration

    class WindowedRegeneration(Regeneration):
        def regenerate(self, samples, progress=None):
            window: list = []
            for sample in itertools.chain(samples, [None]):
                if sample is not None:
                    window.append(sample)
                if window and (len(window) == self.generator.in_flight or sample is None):
                    yield from self._window(window)
                    window = []

        def _window(self, window):
            missing = [s for s in window if s.sample_id not in self.store]
            if missing:
                convs = [self.rules.start(s) for s in missing]
                for _k in itertools.count():
                    active = [c for c in convs if c.more]
                    if not active:
                        break
                    ready = [(c, p) for c in active if (p := self.rules.next_prompt(c)) is not None]
                    results = self.generator.generate([p for _, p in ready], self.params)
                    for (conv, prompt), result in zip(ready, results):
                        self.rules.take_turn(conv, prompt, result)
                self.store.append_chunk([self.rules.record(c).to_json() for c in convs])
            self.report.from_store += len(window) - len(missing)
            for sample in window:
                record = ConversationRecord.from_json(self.store.get(sample.sample_id))
                self.report.count(record, False)
                out = self._sample_from_record(sample, record)
                if out is not None:
                    yield out

    return WindowedRegeneration


def _no_capture(backend: Any, samples: Any, batch_size: int, writer: Any, report: Any) -> Any:
    """In place of the build's capture (``--isolate``): take every regenerated sample, capture none."""
    for _ in samples:
        report.samples_considered += 1
    return iter(())


def run_build(card: Any, source: Path, out: Path, server: str, generator_cls: Any, engine: Any, capture: bool = True) -> tuple[float, Any]:
    """``build_dataset`` with the lengths drawn (``old``: the windowed engine; ``capture`` False: regeneration only); wall time, run report."""
    import hs_dataset.pipeline.build as build
    from hs_dataset.capture.sglang.backend import SGLangBackend

    backend_generator = SGLangBackend.generator

    def make(self: SGLangBackend, *args: Any) -> Any:
        generator = backend_generator(self, *args)
        generator.__class__ = generator_cls
        return generator

    saved = build.Regeneration, build._capture
    SGLangBackend.generator, build.Regeneration = make, engine or build.Regeneration
    build._capture = build._capture if capture else _no_capture
    shutil.rmtree(out, ignore_errors=True)
    try:
        t0 = time.perf_counter()
        report = build.build_dataset(card, out, source=str(source), servers=[server])
        return time.perf_counter() - t0, report
    finally:
        SGLangBackend.generator = backend_generator
        build.Regeneration, build._capture = saved


# ---------------------------------------------------------------------------- the plain client
async def _client(url: str, bodies: list[dict], in_flight: int, timeout_s: float, span: Span) -> tuple[float, int]:
    import aiohttp

    gate = asyncio.Semaphore(in_flight)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=in_flight * 2), timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as session:

        async def one(body: dict) -> int:
            async with gate:
                span.change(+1)
                async with session.post(url + "/generate", json=body) as resp:
                    resp.raise_for_status()
                    n = len((await resp.json())["output_ids"])
                span.change(-1)
                span.end = time.perf_counter()
                return n

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - t0, sum(counts)


def plain_client(url: str, prompts: list[tuple[list[int], int]], in_flight: int, span: Span, timeout_s: float = 3600) -> tuple[float, int]:
    """Every (prompt, length) as its own ``/generate`` request (``gen-`` ids: nothing captured), ``in_flight`` at all times."""
    run = f"bench{random.getrandbits(32):08x}"
    bodies = [
        {"rid": f"gen-{run}-{k}", "input_ids": p, "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}}
        for k, (p, n) in enumerate(prompts)
    ]
    return asyncio.run(_client(url, bodies, in_flight, timeout_s, span))


# ---------------------------------------------------------------------------- the run
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=None, help="an SGLang server started by `hs-dataset serve` (default: start a CPU one here)")
    ap.add_argument("--model-path", default=None, help="with --server: the served model's local directory")
    ap.add_argument("--config", default=None, help="with --server: the card (default: derived from --model-path)")
    ap.add_argument("--conversations", type=int, default=None, help="default 64 here, 256 with --server")
    ap.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="requests in flight, build and client (default 16 here; with --server: what the server reports)",
    )
    ap.add_argument("--mean-tokens", type=float, default=None, help="mean answer length (default 40 here, 1500 with --server)")
    ap.add_argument("--sigma", type=float, default=1.2, help="lognormal sigma of the answer lengths (1.2: CV 1.8 before the cap)")
    ap.add_argument("--max-tokens", type=int, default=None, help="cap on an answer, the card's max_new_tokens (default 6x the mean)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--no-old", action="store_true", help="leave out the old windowed engine's runs (its ratio is measured; saves GPU time)"
    )
    ap.add_argument("--isolate", action="store_true", help="add a run per round: the build with capture left out (regeneration alone)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--results",
        default=None,
        help="file the output is appended to (default benchmarks/results/bench_regenerate_{cpu,gpu}.txt; '' for none)",
    )
    ap.add_argument("--server-env", nargs="*", default=["OMP_WAIT_POLICY=PASSIVE"], help="local server: extra KEY=VALUE")
    args = ap.parse_args()
    remote = args.server is not None
    if remote and not args.model_path:
        ap.error("--server needs --model-path DIR (the served model's local directory)")
    args.conversations = args.conversations or (256 if remote else 64)
    args.mean_tokens = args.mean_tokens or (1500.0 if remote else 40.0)
    args.max_tokens = args.max_tokens or int(6 * args.mean_tokens)
    args.concurrency = args.concurrency if args.concurrency is not None else (None if remote else 16)
    if args.results is None:
        args.results = str(RESULTS / f"bench_regenerate_{'gpu' if remote else 'cpu'}.txt")
    return args


def local_server(tmp: Path, shm: Path, server_env: list[str]) -> tuple[Any, str, Any]:
    """A CPU server for the tiny card, as ``hs-dataset serve`` plans it; (server, model dir, card)."""
    from hs_dataset.capture.serve import launch, plan_server
    from hs_dataset.config import load_card
    from hs_dataset.demo.tiny_model import build_tiny_deepseek

    model_dir = str(build_tiny_deepseek())
    port = free_port()
    base = load_card(LOCAL_CARD)
    staging = {**base.sglang.staging.model_dump(), "dir": str(shm / "stage")}
    env = {**base.sglang.env, **dict(kv.split("=", 1) for kv in server_env)}
    card = base.with_overrides(
        model={"path": model_dir}, sglang={"port": port, "python": str(SERVER_PYTHON), "staging": staging, "env": env}
    )
    plan = plan_server(card, port=port, staging_dir=staging["dir"], python=str(SERVER_PYTHON), model_path=model_dir)
    t0 = time.perf_counter()
    server = launch(plan, log_path=str(tmp / "server.log"), timeout=300)
    print(
        f"server: SGLang {plan.sglang_version} on CPU, card {LOCAL_CARD}, env {server_env}, healthy after {time.perf_counter() - t0:.1f} s"
    )
    return server, model_dir, card


def the_card(args: argparse.Namespace, model_dir: str, card: Any) -> Any:
    from hs_dataset.config import load_card
    from hs_dataset.model.card_from_model import card_from_model

    if args.server:
        card = (
            load_card(args.config).with_overrides(model={"path": model_dir})
            if args.config
            else card_from_model(model_dir, backend="sglang", servers=[args.server])
        )
    regenerate = {"enabled": True, "max_new_tokens": args.max_tokens, "thinking": "off", "concurrency": args.concurrency}
    return card.with_overrides(regenerate=regenerate)


def measure(args: argparse.Namespace, url: str, card: Any, tokenizer: Any, work: Path, source: Path) -> list[str]:
    """The runs and the ratios; returns the lines printed."""
    from hs_dataset.formats.regenerated import RegeneratedStore

    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    span = Span()
    generator_cls = drawn_lengths(tokenizer, span)
    seconds, report = run_build(card, source, work / "reference", url, generator_cls, None)  # also the warm-up
    meta = json.loads((work / "reference" / "manifest.json").read_text())["metadata"]["regeneration"]["generator"]
    in_flight = int(meta["concurrency"])
    records = [r for _, r in sorted(RegeneratedStore(work / "reference").records.items())]  # source order
    prompts = [(r["input_ids"][: t["prompt_tokens"]], len(t["token_ids"])) for r in records for t in r["turns"]]
    samples = [(r["input_ids"][: card.max_length], 1) for r in records if r["input_ids"]]
    capture_in_flight = max(card.backend.batch_size, card.backend.concurrency)
    say(
        f"reference build: {seconds:.1f} s, {report.regeneration['turns']} turns, {report.samples_written} samples, "
        f"{in_flight} requests in flight ({meta['concurrency_from']}); capture {capture_in_flight} in flight"
    )
    times: dict[str, list[float]] = {"new": [], "old": [], "client": [], "prefill": [], "isolated": []}
    rates: dict[str, list[float]] = {"new": [], "old": [], "client": []}
    runs = ["new"] + ([] if args.no_old else ["old"]) + ["client", "prefill"] + (["isolated"] if args.isolate else [])
    if args.isolate:
        rates["isolated"] = []
    for r in range(args.rounds):
        for name in runs[r % len(runs) :] + runs[: r % len(runs)]:
            cpu = _cpu_s()
            if name in ("new", "old", "isolated"):
                span.__init__()
                engine = windowed_regeneration() if name == "old" else None
                seconds, report = run_build(card, source, work / name, url, generator_cls, engine, capture=name != "isolated")
                assert report.regeneration["failed"] == 0 and not report.capture_failures, report.summary()
                rates[name].append(span.tokens / span.seconds())
                extra = f"generation {span.seconds():6.1f} s, {span.tokens} tokens, {rates[name][-1]:7.1f} tok/s, {span.mean_in_flight():.1f} in flight on average"
            elif name == "client":
                span.__init__()
                seconds, tokens = plain_client(url, prompts, in_flight, span)
                rates[name].append(tokens / seconds)
                extra = f"{tokens} tokens, {rates[name][-1]:7.1f} tok/s, {span.mean_in_flight():.1f} in flight on average"
            else:
                seconds, _ = plain_client(url, samples, capture_in_flight, Span())
                extra = f"{sum(len(p) for p, _ in samples)} prompt tokens"
            times[name].append(seconds)
            say(f"round {r + 1} {name:8s} {seconds:7.1f} s  {extra}; this process {_cpu_s() - cpu:.1f} CPU s")
    paired = sorted(n / c for n, c in zip(rates["new"], rates["client"]))  # each round's runs saw about the same machine
    best = {k: max(v) for k, v in rates.items() if v}
    fastest = {k: min(v) for k, v in times.items() if v}
    base = fastest["client"] + fastest["prefill"]
    old_best = f", old {best['old']:.1f}" if "old" in best else ""
    old_wall = f", old {fastest['old']:.1f}" if "old" in fastest else ""
    say(
        f"best of {args.rounds}: generation tok/s new {best['new']:.1f}{old_best}, client {best['client']:.1f}; "
        f"wall s new {fastest['new']:.1f}{old_wall}, client {fastest['client']:.1f} + prefill {fastest['prefill']:.1f}"
    )
    say(
        f"(a) generation, build --regenerate / continuous client at {in_flight} in flight: {best['new'] / best['client']:.2f} "
        f"(per round: {', '.join(f'{r:.2f}' for r in paired)}; median {statistics.median(paired):.2f})"
    )
    say(f"(b) end to end, build / (client generation + prefill): {fastest['new'] / base:.2f}x")
    if "old" in best:
        say(
            f"(c) new engine / old windowed engine: generation {best['new'] / best['old']:.2f}x the throughput, end to end "
            f"{fastest['old'] / fastest['new']:.2f}x faster (old: generation {best['old'] / best['client']:.2f} of the client, "
            f"end to end {fastest['old'] / base:.2f}x)"
        )
    if args.isolate:
        alone = sorted(n / c for n, c in zip(rates["isolated"], rates["client"]))
        say(
            f"(a') generation with capture left out of the build / continuous client: {best['isolated'] / best['client']:.2f} "
            f"(per round: {', '.join(f'{r:.2f}' for r in alone)}; median {statistics.median(alone):.2f})"
        )
    vs_old = f" new_vs_old={best['new'] / best['old']:.2f}" if "old" in best else ""
    say(f"generation_ratio={best['new'] / best['client']:.2f} end_to_end_ratio={fastest['new'] / base:.2f}{vs_old}")
    return lines


def main() -> int:
    args = parse_args()
    if args.server is None and server_python_missing():
        return 2
    from transformers import AutoTokenizer

    tmp, shm = start_run("regenerate")
    server, shm_seen, log = None, set(), io.StringIO()
    try:
        with redirect_stdout(_Tee(sys.stdout, log)):
            print(f"$ python benchmarks/bench_regenerate.py {' '.join(sys.argv[1:])}   # {time.strftime('%Y-%m-%d %H:%M')}, {_load()}")
            if args.server:
                url, model_dir, card = args.server.rstrip("/"), args.model_path, None
            else:
                server, model_dir, card = local_server(tmp, shm, args.server_env)
                url, shm_seen = server.url, server_shm_files(server.proc.pid)
            card = the_card(args, model_dir, card)
            rows, lengths = conversations(args.conversations, args.mean_tokens, args.sigma, args.max_tokens, args.seed)
            print(
                f"{len(rows)} conversations, {len(lengths)} turns; answer lengths mean {statistics.fmean(lengths):.1f}, "
                f"median {statistics.median(lengths):.0f}, max {max(lengths)}, coefficient of variation {cv(lengths):.2f}"
            )
            if cv(lengths) < 1:
                print("the answer lengths spread less than real answers (CV < 1): raise --sigma", file=sys.stderr)
                return 2
            source = tmp / "chats.jsonl"
            source.write_text("".join(json.dumps(row) + "\n" for row in rows))
            tokenizer = AutoTokenizer.from_pretrained(
                model_dir, local_files_only=True, trust_remote_code=bool(card.model.trust_remote_code)
            )
            measure(args, url, card, tokenizer, tmp, source)
            print(f"at the end: {_load()}")
        if args.results:
            with open(args.results, "a") as f:
                f.write(log.getvalue() + "\n")
        return 0
    except BaseException:
        if server is not None:
            print("server log tail:\n" + server.log_tail(3000), file=sys.stderr)
        raise
    finally:
        finish_run(server, shm_seen, tmp, shm)


def _cpu_s() -> float:
    """CPU seconds this process (the build, or the plain client; not the server) used so far, all its threads."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _load() -> str:
    """The machine's load average, for reading the figures of a shared machine."""
    try:
        return "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load average unknown"


class _Tee(io.TextIOBase):
    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


if __name__ == "__main__":
    sys.exit(main())
