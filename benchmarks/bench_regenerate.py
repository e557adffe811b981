"""Regeneration against what a user runs for generation alone: ``build --regenerate`` vs a turn-order client on a plain server.

Two servers on the same machine at once (each with half the GPU memory on a GPU host): the build's, started by
``hs-dataset serve`` with the prefix cache on (card key ``sglang.radix_cache: true``), and a plain SGLang server
(``python -m sglang.launch_server``, ``_plain_server.py``: the same model and sizing flags, prefix cache on, CUDA
graphs as SGLang sets them, no hooks, no hs_dataset). A reference build (also the warm-up) regenerates the
conversations once; its records give every turn's prompt and answer length. Then, each round in a rotated order,
every server's prefix cache flushed before each run and given the prompts' common head (``prime_cache``):

* ``build``: ``build_dataset`` with regeneration, what ``hs-dataset build --regenerate`` runs (start-up,
  regeneration, capture, shards), the answer lengths drawn as below;
* ``turn-order`` (THE baseline, on the plain server): the same number of conversations in flight, turn k+1 of a
  conversation sent the moment turn k's answer arrives, the same conversations and answer lengths
  (``_regen_clients.turn_order``);
* ``independent`` (a second line, on the plain server): every turn's stored prompt in source order, as many
  requests in flight, no turn waiting for another;
* ``isolated`` (with ``--isolate``): the build with its capture left out (regeneration alone).

Printed: the build's wall time / the turn-order client's (THE figure; best of ``--rounds``, and per round), the
generation rates (tok/s), the prompt tokens the build's server prefilled beyond what the plain server prefilled for
the same generation (as % of the generated tokens; from each server's ``/metrics`` prompt-token counters, started
with ``--enable-metrics``, else from its log's ``#new-token`` lines: the line says which), and the peak RSS of the
build process (VmHWM, reset before each build). Answer lengths spread as real answers do: each user turn says how
long its answer must be (``[answer N tokens]``, N lognormal, sigma ``--sigma``), and every request asks for exactly
that many tokens with ``ignore_eos``. ``--multi-turn`` of the conversations (at least a third) have 2-4 turns. The
run is refused where the lengths' coefficient of variation is below 1.

Without ``--server`` both servers are started here on CPU (``.sglang-venv``, the ``tiny-deepseek-sglang`` card).
On a GPU host, ``scripts/gpu/run_regenerate.sh`` starts both and passes ``--server URL --plain-server URL
--model-path DIR --config CARD``; use at least 256 conversations there. Output is appended to ``--results``.

    .venv/bin/python benchmarks/bench_regenerate.py [--conversations 64] [--mean-tokens 40] [--concurrency 16] [--rounds 3]
    python benchmarks/bench_regenerate.py --server http://127.0.0.1:30000 --plain-server http://127.0.0.1:30001 \
        --model-path /models/kimi-wide --config card.yaml --conversations 256 --mean-tokens 500 --rounds 3

The build captures in one pass wherever its server reports it can (``regenerate.capture: auto``); ``--card-override
regenerate.capture=prefill`` measures the prefill capture instead (and any other ``KEY=VALUE``, YAML values changes the
build's card).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import re
import shutil
import statistics
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _capture_counters import capture_counters, describe_capture_cost
from _regen_clients import Outcome, Span, StoredTurn, independent, stored_turns, turn_order
from _server_metrics import PrefillMeter
from _sglang_bench_util import SERVER_PYTHON, free_port, server_python_missing, server_shm_files, start_run, stop_and_clean

RESULTS = Path(__file__).resolve().parent / "results"
LOCAL_CARD = "tiny-deepseek-sglang"
_MARK = re.compile(r"\[answer (\d+) tokens\]")
BUILDS = ("build", "isolated")


# ---------------------------------------------------------------------------- the workload
def conversations(n: int, mean_tokens: float, sigma: float, max_tokens: int, seed: int, multi_turn: float) -> tuple[list[dict], list[int]]:
    """``n`` chats, ``round(multi_turn * n)`` of them of 2-4 user turns (50/30/20 %), the rest of one, each turn naming
    its answer's length; and all those lengths."""
    rng = random.Random(seed)
    mu = math.log(mean_tokens) - sigma * sigma / 2  # lognormal with this mean
    multi = set(rng.sample(range(n), round(multi_turn * n)))
    rows, lengths = [], []
    for i in range(n):
        messages = []
        for turn in range(rng.choices([2, 3, 4], [0.5, 0.3, 0.2])[0] if i in multi else 1):
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


# ---------------------------------------------------------------------------- the build
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
            span.answered(len(result.token_ids))
            return result

        def _traced(self, result, out, rid, url):
            span.served(out.get("meta_info") if isinstance(out, dict) else None)
            return super()._traced(result, out, rid, url)

    return DrawnLengths


def _no_capture(backend: Any, samples: Any, batch_size: int, writer: Any, report: Any, task: Any) -> Any:
    """In place of the build's capture (``--isolate``): take every regenerated sample, capture none."""
    for _ in samples:
        report.samples_considered += 1
    return iter(())


def run_build(
    card: Any, source: Path, out: Path, server: str, generator_cls: Any, capture: bool = True, times: dict | None = None
) -> tuple[float, Any]:
    """``build_dataset`` with the lengths drawn (``capture`` False: regeneration only); wall time, run report.

    ``times``: filled with the build's ``started`` and ``ended`` (``time.perf_counter``), to set beside its span, and
    when it stored its last sample (``stored``), how long the writer's close took (``close_s``), when the build's run
    report was saved (``built``) and how long closing the capture session took (``session_close_s``): where the time
    after the last answer goes.
    """
    import hs_dataset.pipeline.build as build
    from hs_dataset.capture.sglang.backend import SGLangBackend
    from hs_dataset.formats.writer import ShardWriter
    from hs_dataset.pipeline.session import CaptureSession

    times = {} if times is None else times
    add, close = ShardWriter.add, ShardWriter.close
    session_close, inner_build = CaptureSession.close, build._build

    def timed_add(self: ShardWriter, sample: Any) -> bool:
        stored = add(self, sample)
        times["stored"] = time.perf_counter()
        return stored

    def timed_close(self: ShardWriter) -> Any:
        t = time.perf_counter()
        try:
            return close(self)
        finally:
            times["close_s"] = times.get("close_s", 0.0) + time.perf_counter() - t

    def timed_session_close(self: CaptureSession) -> None:
        t = time.perf_counter()
        try:
            session_close(self)
        finally:
            times["session_close_s"] = times.get("session_close_s", 0.0) + time.perf_counter() - t

    def timed_build(*args: Any, **kwargs: Any) -> Any:
        try:
            return inner_build(*args, **kwargs)
        finally:
            times["built"] = time.perf_counter()  # the run report saved: what follows is closing the regeneration and the session

    backend_generator = SGLangBackend.generator

    def make(self: SGLangBackend, *args: Any) -> Any:
        generator = backend_generator(self, *args)
        generator.__class__ = generator_cls
        return generator

    saved = build._capture
    SGLangBackend.generator = make
    build._capture = build._capture if capture else _no_capture
    ShardWriter.add, ShardWriter.close = timed_add, timed_close  # type: ignore[method-assign]
    CaptureSession.close, build._build = timed_session_close, timed_build  # type: ignore[method-assign]
    shutil.rmtree(out, ignore_errors=True)
    try:
        t0 = time.perf_counter()
        report = build.build_dataset(card, out, source=str(source), servers=[server])
        t1 = time.perf_counter()
        times.update(started=t0, ended=t1)
        return t1 - t0, report
    finally:
        SGLangBackend.generator = backend_generator
        build._capture = saved
        ShardWriter.add, ShardWriter.close = add, close  # type: ignore[method-assign]
        CaptureSession.close, build._build = session_close, inner_build  # type: ignore[method-assign]


def captured_by(out: Path) -> str:
    """How a build's samples were captured, summed over its manifest's shards (``one_pass``, ``prefill``)."""
    from hs_dataset.formats.manifest import Manifest

    counts: dict[str, int] = {}
    for shard in Manifest.load(out).shards:
        for path, n in (shard.captured_by or {"unrecorded": shard.samples}).items():
            counts[path] = counts.get(path, 0) + n
    return ", ".join(f"{path} {n}" for path, n in sorted(counts.items()))


# ---------------------------------------------------------------------------- the servers
def flush_cache(url: str, tries: int = 40) -> None:
    """Empty a server's prefix cache (SGLang refuses while requests run: retried), so no run reuses another's prefixes."""
    for _ in range(tries):
        try:
            with urllib.request.urlopen(urllib.request.Request(url + "/flush_cache", method="POST"), timeout=30) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url}/flush_cache: the prefix cache was not flushed after {tries} tries")


def common_head(prompts: list[list[int]]) -> list[int]:
    """The longest prefix every prompt starts with (the chat template's head: system prompt, first role marker)."""
    head = min(prompts, key=len) if prompts else []
    for prompt in prompts:
        n = next((i for i, (a, b) in enumerate(zip(head, prompt)) if a != b), min(len(head), len(prompt)))
        head = head[:n]
    return head


def prime_cache(url: str, head: list[int]) -> None:
    """Put ``head`` in a flushed server's prefix cache, as a server that has been serving holds it.

    Without it the first wave of requests (all at once from a client, staggered from the build) shares the head or
    not by timing alone: on the CPU server that moved the prompt tokens prefilled by ~15 per request in flight.
    """
    if not head:
        return
    body = json.dumps({"input_ids": head, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}).encode()
    request = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as resp:
        resp.read()


def describe(url: str) -> str:
    """What a server runs, from its ``/server_info`` (or ``/get_server_info``, its older name): the settings the comparison rests on."""
    for path in ("/server_info", "/get_server_info"):
        try:
            with urllib.request.urlopen(url + path, timeout=30) as resp:
                info = json.loads(resp.read())
            break
        except (urllib.error.URLError, OSError, ValueError):
            info = {}
    hooks = json.loads(info["forward_hooks"]) if isinstance(info.get("forward_hooks"), str) else info.get("forward_hooks") or []
    keys = ("disable_radix_cache", "disable_cuda_graph", "mem_fraction_static", "max_running_requests", "chunked_prefill_size")
    settings = ", ".join(f"{k} {info.get(k)}" for k in keys)
    return f"{url}: SGLang {info.get('version', '?')}, {settings}, forward hooks {[h.get('name') for h in hooks]}"


def local_servers(tmp: Path, shm: Path, server_env: list[str]) -> tuple[list[Any], str, Any]:
    """The build's CPU server (as ``hs-dataset serve`` plans it for the tiny card, prefix cache on) and the plain one,
    started side by side; ([build, plain], model dir, card)."""
    from _plain_server import plain_plan

    from hs_dataset.capture.serve import launch, plan_server
    from hs_dataset.config import load_card
    from hs_dataset.demo.tiny_model import build_tiny_deepseek

    model_dir = str(build_tiny_deepseek())
    port = free_port()
    base = load_card(LOCAL_CARD)
    staging = {**base.sglang.staging.model_dump(), "dir": str(shm / "stage")}
    env = {**base.sglang.env, **dict(kv.split("=", 1) for kv in server_env)}
    sglang = {"port": port, "python": str(SERVER_PYTHON), "staging": staging, "env": env, "radix_cache": True}
    card = base.with_overrides(model={"path": model_dir}, sglang={**sglang, "args": [*base.sglang.args, "--enable-metrics"]})
    plan = plan_server(card, port=port, staging_dir=staging["dir"], python=str(SERVER_PYTHON), model_path=model_dir)
    plans = [plan, plain_plan(card, plan, free_port(), str(shm / "plain-unused"))]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(lambda ab: launch(ab[0], log_path=str(tmp / f"{ab[1]}.log"), timeout=300), zip(plans, ("build", "plain"))))
    print(
        f"servers: SGLang {plan.sglang_version} on CPU, card {LOCAL_CARD} with the prefix cache on, env {server_env}; "
        f"build's {started[0].url}, plain {started[1].url}, both healthy after {time.perf_counter() - t0:.1f} s"
    )
    return started, model_dir, card


def the_card(args: argparse.Namespace, model_dir: str, card: Any) -> Any:
    """The build's card: the served one, regeneration on, prefix-cache-safe prefill capture, then ``--card-override``."""
    from hs_dataset.config import load_card
    from hs_dataset.model.card_from_model import card_from_model

    if args.server:
        card = (
            load_card(args.config).with_overrides(model={"path": model_dir})
            if args.config
            else card_from_model(model_dir, backend="sglang", servers=[args.server])
        )
    regenerate = {"enabled": True, "max_new_tokens": args.max_tokens, "thinking": "off", "concurrency": args.concurrency}
    card = card.with_overrides(regenerate=regenerate)
    for key, value in args.card_override:
        card = card.with_overrides(**_nested(key, value))
    return card


def _nested(key: str, value: Any) -> dict:
    head, *rest = key.split(".")
    return {head: _nested(".".join(rest), value) if rest else value}


def _override(text: str) -> tuple[str, Any]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE (dotted KEY, YAML VALUE)")
    return key, yaml.safe_load(value)


# ---------------------------------------------------------------------------- the runs
class Runs:
    """Every run of a benchmark, its figures per name and round, and the lines printed."""

    def __init__(self, build_meter: PrefillMeter, plain_meter: PrefillMeter) -> None:
        self.meters = {"build": build_meter, "plain": plain_meter}
        self.wall: dict[str, list[float]] = {}
        self.rate: dict[str, list[float]] = {}
        self.prefilled: dict[str, list[int | None]] = {}
        self.generated: dict[str, list[int]] = {}
        self.peak_rss: list[int] = []
        self.peak_exact = True  # False where the peak could not be reset before a build (then: since this process started)
        self.lines: list[str] = []

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)

    def record(self, name: str, seconds: float, rate: float, generated: int, prefilled: int | None) -> None:
        for table, value in ((self.wall, seconds), (self.rate, rate), (self.generated, generated), (self.prefilled, prefilled)):
            table.setdefault(name, []).append(value)


def run_one(name: str, r: int, runs: Runs, ctx: dict) -> None:
    """One run (its server's prefix cache flushed first, its prefill metered), recorded and printed."""
    meter = runs.meters["build" if name in BUILDS else "plain"]
    flush_cache(meter.url)
    prime_cache(meter.url, ctx["head"])
    meter.start()
    cpu, span = _cpu_s(), ctx["span"]
    span.__init__()
    if name in BUILDS:
        exact = _reset_peak_rss()
        times: dict = {}
        staging = str(ctx["card"].sglang.staging.dir)
        counted = capture_counters(staging)
        seconds, report = run_build(
            ctx["card"], ctx["source"], ctx["work"] / name, meter.url, ctx["generator"], capture=name == "build", times=times
        )
        assert report.regeneration["failed"] == 0 and not report.capture_failures, report.summary()
        peak, runs.peak_exact = _peak_rss(), runs.peak_exact and exact
        if name == "build":
            runs.peak_rss.append(peak)
        generated, rate = span.tokens, span.rate()
        rss = f"; peak RSS {peak / 2**20:.0f} MiB{'' if exact else ' (since start)'}"
        extra = f"generation {span.seconds():6.1f} s, {generated} tokens, {rate:7.1f} tok/s, {span.mean_in_flight():.1f} in flight on average ({span.at_server()}){rss}"
        if span.start is not None:  # what the build spends outside generation: its start, and its end after the last answer
            extra += (
                f"; {span.start - times['started']:.2f} s before the first request, {times['ended'] - span.end:.2f} s after the last answer"
            )
            if "stored" in times:  # of which: until the last sample was stored, the writer's close, the rest
                extra += (
                    f" ({times['stored'] - span.end:.2f} s to the last sample stored, writer close {times.get('close_s', 0.0):.2f} s, "
                    f"then {times['ended'] - times['stored'] - times.get('close_s', 0.0):.2f} s"
                )
                if "built" in times:  # the rest: until the run report is saved, then the regeneration's and the session's close
                    extra += (
                        f": {times['built'] - times['stored'] - times.get('close_s', 0.0):.2f} s to the report saved, "
                        f"session close {times.get('session_close_s', 0.0):.2f} s"
                    )
                extra += ")"
        if name == "build":
            after = capture_counters(staging, settle=True)
            extra += f"; captured by {captured_by(ctx['work'] / name)}; {describe_capture_cost(counted, after)}"
    else:
        client = turn_order if name == "turn-order" else independent
        outcome: Outcome = client(meter.url, ctx["convs"] if name == "turn-order" else ctx["turns"], ctx["in_flight"], span)
        seconds, generated, rate = outcome.seconds, outcome.tokens, outcome.tokens / outcome.seconds
        extra = f"{generated} tokens, {rate:7.1f} tok/s, {span.mean_in_flight():.1f} in flight on average ({span.at_server()})"
        if name == "turn-order":
            extra += f"; later turns sent with the client's own history {outcome.own_history}, as stored {outcome.stored_prompt}"
    prefilled = meter.stop()
    runs.record(name, seconds, rate, generated, prefilled)
    extra += f"; prefilled {prefilled if prefilled is not None else 'unknown'} prompt tokens"
    if meter.decode:
        extra += f"; the server's {meter.decode}"
    runs.say(f"round {r + 1} {name:11s} {seconds:7.1f} s  {extra}; this process {_cpu_s() - cpu:.1f} CPU s")


def summarize(runs: Runs, rounds: int, in_flight: int) -> None:
    """THE figure, the rates, the prefill beyond generation's, the peak memory; and one line of key=value."""
    best_wall = {k: min(v) for k, v in runs.wall.items()}
    best_rate = {k: max(v) for k, v in runs.rate.items()}
    paired = [b / t for b, t in zip(runs.wall["build"], runs.wall["turn-order"])]
    figure = best_wall["build"] / best_wall["turn-order"]
    independent = f"; independent-turn client {best_wall['independent']:.1f} s" if "independent" in best_wall else ""
    runs.say(
        f"build --regenerate wall / turn-order client wall on the plain server, {in_flight} conversations in flight: "
        f"**{figure:.2f}x** (best of {rounds}: {best_wall['build']:.1f} s / {best_wall['turn-order']:.1f} s; "
        f"per round {', '.join(f'{p:.2f}' for p in paired)}){independent}"
    )
    isolated = f", build without capture {best_rate['isolated']:.1f}" if "isolated" in best_rate else ""
    independent = f", independent-turn client {best_rate['independent']:.1f}" if "independent" in best_rate else ""
    runs.say(
        f"generation tok/s (best): build {best_rate['build']:.1f}, turn-order client {best_rate['turn-order']:.1f} "
        f"(build / turn-order {best_rate['build'] / best_rate['turn-order']:.2f}){independent}{isolated}"
    )
    extra = _extra_prefill(runs)
    runs.say(f"prompt tokens prefilled beyond generation's (build's server - plain server's turn-order run, per round): {extra[0]}")
    if "isolated" in runs.prefilled:
        alone = [
            f"{b - i}" if b is not None and i is not None else "unknown"
            for b, i in zip(runs.prefilled["build"], runs.prefilled["isolated"])
        ]
        runs.say(f"prompt tokens the build's server prefilled for capture (build - build without capture, per round): {', '.join(alone)}")
    peak = max(runs.peak_rss) / 2**20
    how = "VmHWM over a build, the reference build's excluded" if runs.peak_exact else "since this process started: no reset here"
    runs.say(f"peak RSS of the build process: {peak:.0f} MiB ({how})")
    runs.say(
        f"wall_ratio={figure:.3f} extra_prefill_pct={extra[1]} build_tok_s={best_rate['build']:.1f} turn_order_tok_s={best_rate['turn-order']:.1f} peak_rss_mib={peak:.0f}"
    )


def _extra_prefill(runs: Runs) -> tuple[str, str]:
    """Per round, the build's prefill minus the turn-order client's, as % of the build's generated tokens; (text, worst %)."""
    parts, worst = [], None
    for built, plain, generated in zip(runs.prefilled["build"], runs.prefilled["turn-order"], runs.generated["build"]):
        if built is None or plain is None:
            parts.append("unknown")
            continue
        pct = 100.0 * (built - plain) / max(generated, 1)
        worst = pct if worst is None else max(worst, pct)
        parts.append(f"{built} - {plain} = {built - plain} tokens, {pct:.1f}% of {generated} generated")
    sources = ", ".join(f"{k}: {m.source}" for k, m in runs.meters.items())
    return f"{'; '.join(parts)} (from {sources})", "unknown" if worst is None else f"{worst:.2f}"


def measure(args: argparse.Namespace, urls: tuple[str, str], card: Any, tokenizer: Any, work: Path, source: Path, logs: tuple) -> list[str]:
    """The reference build, the warm-up, the rounds, the summary; returns the lines printed."""
    from hs_dataset.formats.regenerated import RegeneratedStore

    runs = Runs(PrefillMeter(urls[0], logs[0]), PrefillMeter(urls[1], logs[1]))
    runs.say(f"build's server {describe(urls[0])}")
    runs.say(f"plain server {describe(urls[1])}")
    span = Span()
    generator = drawn_lengths(tokenizer, span)
    seconds, report = run_build(card, source, work / "reference", urls[0], generator)  # also the build server's warm-up
    meta = json.loads((work / "reference" / "manifest.json").read_text())["metadata"]["regeneration"]["generator"]
    in_flight = int(meta["concurrency"])
    records = [r for _, r in sorted(RegeneratedStore(work / "reference").records.items())]  # source order
    convs = [stored_turns(r) for r in records]
    turns: list[StoredTurn] = [t for c in convs for t in c]
    head = common_head([c[0].prompt for c in convs if c])
    runs.say(
        f"reference build: {seconds:.1f} s, {report.regeneration['turns']} turns, {report.samples_written} samples, "
        f"{in_flight} requests in flight ({meta['concurrency_from']}); {sum(len(c) > 1 for c in convs)} of {len(convs)} "
        f"conversations multi-turn; every run starts from a flushed prefix cache holding the prompts' common head ({len(head)} tokens)"
    )
    warm = turn_order(urls[1], convs, in_flight, Span())
    runs.say(f"plain server warm-up (turn-order client, not counted): {warm.seconds:.1f} s")
    ctx = {"span": span, "card": card, "source": source, "work": work, "generator": generator, "convs": convs, "turns": turns}
    ctx.update(in_flight=in_flight, head=head)
    names = ["build", "turn-order", "independent"] + (["isolated"] if args.isolate else [])
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if name != "independent" or args.independent_rounds is None or r < args.independent_rounds:
                run_one(name, r, runs, ctx)
    summarize(runs, args.rounds, in_flight)
    return runs.lines


# ---------------------------------------------------------------------------- the command line
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--server", default=None, help="the build's SGLang server, started by `hs-dataset serve` (default: start a CPU one here)"
    )
    ap.add_argument("--plain-server", default=None, help="with --server: the plain SGLang server (`_plain_server.py`)")
    ap.add_argument("--server-log", type=Path, default=None, help="with --server: its log (prefill counts where /metrics has none)")
    ap.add_argument("--plain-log", type=Path, default=None, help="with --plain-server: its log (as --server-log)")
    ap.add_argument("--model-path", default=None, help="with --server: the served model's local directory")
    ap.add_argument("--config", default=None, help="with --server: the card (default: derived from --model-path)")
    ap.add_argument("--conversations", type=int, default=None, help="default 64 here, 256 with --server")
    ap.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="requests in flight, build and clients (default 16 here; with --server: what the server reports)",
    )
    ap.add_argument("--mean-tokens", type=float, default=None, help="mean answer length (default 40 here, 1500 with --server)")
    ap.add_argument("--sigma", type=float, default=1.2, help="lognormal sigma of the answer lengths (1.2: CV 1.8 before the cap)")
    ap.add_argument("--max-tokens", type=int, default=None, help="cap on an answer, the card's max_new_tokens (default 6x the mean)")
    ap.add_argument("--multi-turn", type=float, default=0.4, help="share of conversations with 2-4 turns (at least 1/3; default 0.4)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--independent-rounds",
        type=int,
        default=None,
        help="the independent-turn client (the second line) only in the first N rounds (default: every round); "
        "on the lent GPU three full rounds and both servers' start do not fit one 600 s call",
    )
    ap.add_argument("--isolate", action="store_true", help="add a run per round: the build with capture left out (regeneration alone)")
    ap.add_argument(
        "--card-override", type=_override, action="append", default=[], help="KEY=VALUE for the build's card (dotted key, YAML value)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--results",
        default=None,
        help="file the output is appended to (default benchmarks/results/bench_regenerate_{cpu,gpu}.txt; '' for none)",
    )
    ap.add_argument("--server-env", nargs="*", default=["OMP_WAIT_POLICY=PASSIVE"], help="local servers: extra KEY=VALUE")
    args = ap.parse_args()
    remote = args.server is not None
    if remote and not (args.model_path and args.plain_server):
        ap.error("--server needs --plain-server URL and --model-path DIR (the served model's local directory)")
    if args.plain_server and not remote:
        ap.error("--plain-server goes with --server (without either, both servers are started here)")
    if args.multi_turn < 1 / 3 or args.multi_turn > 1:
        ap.error("--multi-turn: at least a third of the conversations must be multi-turn (1/3 to 1)")
    args.conversations = args.conversations or (256 if remote else 64)
    args.mean_tokens = args.mean_tokens or (1500.0 if remote else 40.0)
    args.max_tokens = args.max_tokens or int(6 * args.mean_tokens)
    args.concurrency = args.concurrency if args.concurrency is not None else (None if remote else 16)
    if args.results is None:
        args.results = str(RESULTS / f"bench_regenerate_{'gpu' if remote else 'cpu'}.txt")
    return args


def main() -> int:
    args = parse_args()
    if args.server is None and server_python_missing():
        return 2
    from transformers import AutoTokenizer

    tmp, shm = start_run("regenerate")
    servers, shm_seen, log = [], set(), io.StringIO()
    try:
        with redirect_stdout(_Tee(sys.stdout, log)):
            print(f"$ python benchmarks/bench_regenerate.py {' '.join(sys.argv[1:])}   # {time.strftime('%Y-%m-%d %H:%M')}, {_load()}")
            if args.server:
                urls, model_dir, card = (args.server.rstrip("/"), args.plain_server.rstrip("/")), args.model_path, None
                logs = (args.server_log, args.plain_log)
            else:
                servers, model_dir, card = local_servers(tmp, shm, args.server_env)
                urls, logs = (servers[0].url, servers[1].url), (tmp / "build.log", tmp / "plain.log")
                shm_seen = set().union(*(server_shm_files(s.proc.pid) for s in servers))
            card = the_card(args, model_dir, card)
            rows, lengths = conversations(args.conversations, args.mean_tokens, args.sigma, args.max_tokens, args.seed, args.multi_turn)
            multi = sum(len(r["messages"]) > 2 for r in rows)
            print(
                f"{len(rows)} conversations ({multi} of 2-4 turns), {len(lengths)} turns; answer lengths mean {statistics.fmean(lengths):.1f}, "
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
            measure(args, urls, card, tokenizer, tmp, source, logs)
            print(f"at the end: {_load()}")
        if args.results:
            with open(args.results, "a") as f:
                f.write(log.getvalue() + "\n")
        return 0
    except BaseException:
        for server in servers:
            print(f"server {server.url} log tail:\n" + server.log_tail(3000), file=sys.stderr)
        raise
    finally:
        for server in servers:
            stop_and_clean(server, shm_seen)
        shutil.rmtree(tmp, ignore_errors=True)
        if shm != tmp:
            shutil.rmtree(shm, ignore_errors=True)


# ---------------------------------------------------------------------------- this process
def _cpu_s() -> float:
    """CPU seconds this process (the build, or a client; not the servers) used so far, all its threads."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) where Linux allows it; False: the peak then counts from the start."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """This process's peak resident memory in bytes (VmHWM; getrusage's where /proc has none)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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
