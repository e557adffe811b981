"""One capture node end to end: GPU prefill -> server capture -> staging -> client check -> verified shards on disk.

Everything but SGLang itself and the HTTP round trip is the production code, at
Kimi-K2.5 shapes (hidden 7168, HF aux layers [2, 30, 58] + the pre-norm final state,
bf16), split over two processes as on a real node, where the client (``hs-dataset
build``) is a separate process from the SGLang server:

* the server process (this one): a synthetic prefill on the GPU
  (bench_gpu_capture.py's residual-MLP model, 61 blocks), 4096-token passes of 8
  requests, at ~26k tokens/s (a Kimi-K2.5 TP8 node's per-GPU rate) and at ~108k
  tokens/s (4x faster), and the server's
  :class:`~hs_dataset.server_patch.core.CaptureCore` (split, device snapshot or fp8
  quantization on the GPU, pinned side-stream copy, writer threads writing each dump
  with one ``os.writev`` into a bounded staging dir in /dev/shm);
* the client process (this file again, started with multiprocessing's ``spawn``: it
  never touches the GPU): the client's dump consumer, ``SGLangBackend._load_and_check``
  (read, validate, turn into a sample), in a pool of threads as the client runs it,
  polling the staging dir for each request's dump and handing it back after use (the
  server writes a later dump over it) as the client does; the shard writer (:class:`~hs_dataset.formats.writer.ShardWriter`:
  validation, NaN scan, hashing, fsync, atomic publish; ``--writer-threads`` threads,
  ``--shard-mib`` shards) writing to disk, and ``verify_dataset`` over the result.
  The server process tells it only which requests a phase will send (their ids and
  tokens, as the client knows what it sent) and hears back the figures.

An unmeasured warm-up phase (``--warmup-gb``, 1 GB) runs first, so that the
process's one-time costs (CUDA and allocator warm-up, the client's first reads into
new memory) are not charged to whichever phase happens to come first. The server's
pinned-memory copier is one per run, as a server process keeps it (``--copier-per-phase``:
a new one per phase). ``--trace`` prints, per phase, how many shards the client's writer
had in flight and how long the thread adding samples waited for a free writer thread:
near the thread count and long waits mean the disk sets the pace, few in flight mean
the client does; and where the client's loader threads spent their time (reading
dumps, scanning them for NaN/inf, the rest of the check, waiting for dumps to appear). Then, for
each rate and each storage (native bf16, and fp8 quantized on the GPU) it prints
the prefill rate with and without capture, the sustained end-to-end rate (shard
bytes on disk per second, from the first pass to the last shard published), and
that rate against raw writes of as many bytes to the same directory (as many threads
as the shard writer, shard-sized files, fsync) measured in the same run, before and
after the phases. The fp8 figure is the sustained *state* rate (tokens/s x bf16 bytes
per token) against bf16's at the fast rate.
Last line: ``prefill_overhead=X end_to_end_vs_raw=Y fp8_vs_bf16=Z``: the worst bf16
prefill overhead across the rates measured; the worst, across the bf16 phases, of the
sustained on-disk rate (shard bytes over the time from the first shard's write to the
last publish: a long run's rate, without the fill of the first shard buffer; the
wall-clock rate from the first pass is printed beside it) against the lower of raw
writes of as many bytes and the rate the prefill offers (at 26k tokens/s it offers
only ~1.5 GB/s of bf16 states, below a fast disk); and fp8's
wall-clock state rate against bf16's at the fastest rate.

Needs CUDA; without it, it says so and exits 0 (``HS_BENCH_SMOKE=1`` with a small
``HS_BENCH_HIDDEN`` and ``HS_BENCH_INTER``, e.g. ``HS_BENCH_SMOKE=1 HS_BENCH_HIDDEN=64 HS_BENCH_INTER=64
    python benchmarks/bench_node.py --phase-gb 0.05 --shard-mib 8 --writer-threads 2``, runs it on the CPU to
check the plumbing only).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu_capture import AUX, H, SyntheticPrefill
from bench_writeback import write_files

K = len(AUX)
RATES = {
    26_000: 13_952,
    108_000: 3_072,
    216_000: 1_536,
}  # target tokens/s -> MLP width giving it on an H200 (216k: scaled from the other two; each phase prints the rate it measured)
DUMP_WAIT_S = 120.0  # the client gives up on a dump not seen this long after it started waiting (server-side loss)
PHASE_WAIT_S = 420.0  # the server side gives up on the client process after this long past its last pass


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _now() -> float:
    """CLOCK_MONOTONIC: one system-wide clock, so timestamps of the two processes compare."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@dataclass
class Phase:
    """What one (rate, storage) run measured."""

    rate: int
    storage: str
    base_tok_s: float = 0.0
    cap_tok_s: float = 0.0
    e2e_s: float = 0.0
    loop_s: float = 0.0
    consumed_s: float = 0.0
    first_flush_s: float = 0.0  # when the first shard's samples were all added, so its write began
    tokens: int = 0
    shard_bytes: int = 0
    staged_bytes: int = 0
    samples: int = 0
    failures: list[str] = field(default_factory=list)
    verified: str = ""
    load_busy_s: float = 0.0
    add_busy_s: float = 0.0
    fallback: bool = False
    trace: str = ""

    @property
    def overhead(self) -> float:
        return self.base_tok_s / self.cap_tok_s - 1 if self.cap_tok_s else float("nan")

    @property
    def e2e_gb_s(self) -> float:
        return self.shard_bytes / self.e2e_s / 1e9 if self.e2e_s else 0.0

    @property
    def steady_gb_s(self) -> float:
        """Shard bytes over the time the disk was in use: from the first shard's write (its last
        sample added) to the last publish. A long run's rate: it leaves out only the fill of the
        first shard's buffer, which the raw-write baseline has no counterpart of either."""
        busy = self.e2e_s - self.first_flush_s
        return self.shard_bytes / busy / 1e9 if self.first_flush_s and busy > 0 else 0.0

    @property
    def sustained_gb_s(self) -> float:
        """The sustained rate, or the wall-clock one where no shard filled before the end."""
        return self.steady_gb_s or self.e2e_gb_s

    @property
    def state_gb_s(self) -> float:
        """Sustained rate of captured states in bf16 bytes (what fp8 must beat bf16 on)."""
        return self.tokens * (K + 1) * H * 2 / self.e2e_s / 1e9 if self.e2e_s else 0.0

    @property
    def offered_gb_s(self) -> float:
        """Shard bytes per second the prefill offers at its capture rate (an upper bound on the sustained rate)."""
        return self.shard_bytes / self.tokens * self.cap_tok_s / 1e9 if self.tokens else 0.0


def raw_disk_rate(directory: str, nbytes: int, file_bytes: int, threads: int) -> float:
    """GB/s of plain writes + fsync of ``nbytes`` into shard-sized files, ``threads`` at a time (the writer's concurrency)."""
    sizes = [min(file_bytes, nbytes - start) for start in range(0, nbytes, file_bytes)]
    source = memoryview(os.urandom(64 << 20))
    return write_files(directory, sizes, threads, source, early=False, chunk=len(source))[0]


# ---------------------------------------------------------------------------- the client process


class Consumer:
    """The client's side of the staging dir: per expected dump, wait, ``check_dump``, delete; then ``ShardWriter.add``.

    Loader threads play the client's executor threads; one thread adds to the writer,
    as the pipeline's main loop does. Runs in the client process only. Timestamps are
    CLOCK_MONOTONIC, absolute (the server process turns them into times from its first pass).
    """

    def __init__(self, expected, writer, staging: str, loaders: int, stats: dict) -> None:
        from hs_dataset.server_patch.contract.dump import DUMP_SUFFIX, REFUSED_SUFFIX

        self.expected_dump, self.writer, self.staging, self.stats = expected, writer, staging, stats
        self.dump_suffix, self.refused_suffix = DUMP_SUFFIX, REFUSED_SUFFIX
        self.expected: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue(maxsize=256)
        self._lock = threading.Lock()
        self.loaders = [threading.Thread(target=self._load_loop, daemon=True) for _ in range(loaders)]
        self.adder = threading.Thread(target=self._add_loop, daemon=True)
        self.error: BaseException | None = None
        self.added_bytes = 0
        self.shard_bytes = getattr(writer, "shard_bytes", 0)
        for t in self.loaders:
            t.start()
        self.adder.start()

    def _load_loop(self) -> None:
        from hs_dataset.capture.sglang.dumps import check_dump
        from hs_dataset.server_patch.contract.spares import hand_back_dump

        while (item := self.expected.get()) is not None:
            rid, sample = item
            dump = os.path.join(self.staging, rid + self.dump_suffix)
            refused = os.path.join(self.staging, rid + self.refused_suffix)
            delay = 0.0005
            waited_from = time.perf_counter()
            deadline = _now() + DUMP_WAIT_S
            while not os.path.exists(dump):
                if os.path.exists(refused):
                    os.unlink(refused)
                    self.results.put((_now(), f"{rid}: refused"))
                    break
                if _now() > deadline:
                    self.results.put((_now(), f"{rid}: no dump within {DUMP_WAIT_S:.0f} s"))
                    break
                time.sleep(delay)
                delay = min(delay * 1.5, 0.01)
            else:
                t0 = time.perf_counter()
                result = check_dump(dump, rid, sample, self.expected_dump)
                hand_back_dump(dump)  # as the client does: the server writes a later dump over it
                with self._lock:
                    self.stats["load_busy_s"] += time.perf_counter() - t0
                    self.stats["dump_wait_s"] += t0 - waited_from
                self.results.put((_now(), result))

    def _add_loop(self) -> None:
        from hs_dataset.errors import SampleError
        from hs_dataset.formats.encoding import decode_state
        from hs_dataset.sample import CapturedSample

        while (item := self.results.get()) is not None:
            loaded_at, result = item
            if _TRACE:
                _TRACE[0].queued_spans.append((loaded_at, _now()))
            if not isinstance(result, CapturedSample):
                self.stats["failures"].append(getattr(result, "reason", str(result)))
                continue
            t0 = time.perf_counter()
            a0 = _now()
            try:
                try:
                    self.writer.add(result)
                except SampleError:
                    if result.aux_scale is None:
                        raise
                    # A writer without the pass-through of server-encoded states: decode, and let it encode again.
                    self.stats["fallback"] = True
                    enc = self.writer.state_encoding  # the server encodes what the phase's storage names
                    result.aux_hidden_states = decode_state(result.aux_hidden_states, result.aux_scale, enc)
                    result.final_hidden_state = decode_state(result.final_hidden_state, result.final_scale, enc)
                    result.aux_scale = result.final_scale = None
                    self.writer.add(result)
                self.stats["samples"] += 1
                parts = (
                    result.input_ids,
                    result.loss_mask,
                    result.aux_hidden_states,
                    result.final_hidden_state,
                    result.aux_scale,
                    result.final_scale,
                )
                self.added_bytes += sum(t.numel() * t.element_size() for t in parts if t is not None) + 8  # as the writer counts
                if not self.stats["first_flush_at"] and self.shard_bytes and self.added_bytes >= self.shard_bytes:
                    self.stats["first_flush_at"] = _now()
            except BaseException as exc:  # surfaced by finish()
                self.error = exc
            self.stats["add_busy_s"] += time.perf_counter() - t0
            if _TRACE:
                _TRACE[0].add_spans.append((a0, _now()))

    def finish(self) -> None:
        for _ in self.loaders:
            self.expected.put(None)
        for t in self.loaders:
            t.join()
        self.results.put(None)
        self.adder.join()
        if self.error is not None:
            raise self.error


class _WriterTrace:
    """Where the writer's time went (``--trace``): the adder's waits for a free writer thread, and each shard's write span."""

    def __init__(self) -> None:
        self.wait_s = 0.0
        self.spans: list[tuple[float, float]] = []
        self.wait_spans: list[tuple[float, float]] = []  # the adder waiting for a free writer thread
        self.add_spans: list[tuple[float, float]] = []  # the adder inside writer.add (waits included)
        self.queued_spans: list[tuple[float, float]] = []  # loaded samples waiting for the adder
        self.lock = threading.Lock()

    def summary(self, start: float, end: float) -> str:
        window = max(end - start, 1e-9)
        busy = sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.spans)
        edges = sorted([(a, 1) for a, _ in self.spans] + [(b, -1) for _, b in self.spans])
        idle, depth, last = 0.0, 0, start
        for t, step in edges:
            if depth == 0 and t > last:
                idle += max(0.0, min(t, end) - max(last, start))
            depth += step
            last = t
        per = [b - a for a, b in self.spans]
        return (
            f"trace: {len(self.spans)} shards, write+fsync {min(per):.2f}-{max(per):.2f} s each (mean {statistics.mean(per):.2f}); "
            f"mean shards in flight {busy / window:.2f} over the sustained window, none in flight for {idle:.2f} s; "
            f"the adder waited {self.wait_s:.2f} s for a free writer thread; per {_STEP_S} s: shards in flight "
            f"{self.timeline(self.spans, start, end)}; the adder adding (not waiting) {self.adding(start, end)}; "
            f"loaded samples waiting for the adder {self.timeline(self.queued_spans, start, end)}"
        )

    @staticmethod
    def timeline(spans: list[tuple[float, float]], start: float, end: float) -> str:
        """Mean number of spans open in each step of the window (where the ramp and the tail are)."""
        steps = []
        t = start
        while t < end:
            u = min(t + _STEP_S, end)
            busy = sum(max(0.0, min(b, u) - max(a, t)) for a, b in spans)
            steps.append(f"{busy / (u - t):.1f}")
            t = u
        return " ".join(steps)

    def adding(self, start: float, end: float) -> str:
        """The adder's share of each step spent inside writer.add but not waiting for a writer thread."""
        adding = self.timeline(self.add_spans, start, end).split()
        waiting = self.timeline(self.wait_spans, start, end).split()
        return " ".join(f"{max(0.0, float(a) - float(w)):.1f}" for a, w in zip(adding, waiting))


_STEP_S = 0.25  # the trace's timeline step


_TRACE: list[_WriterTrace] = []  # the phase being traced (one at a time in the client process)


def _trace_writer(writer) -> _WriterTrace:
    """Wrap one ShardWriter's in-flight wait and shard writes with timers (benchmark-only instrumentation)."""
    import hs_dataset.formats.shard_flusher as flusher_module

    trace = _WriterTrace()
    _TRACE[:] = [trace]
    semaphore = writer._flusher._in_flight

    class TimedSemaphore:
        def acquire(self, *a, **k):
            t0 = time.perf_counter()
            w0 = _now()
            try:
                return semaphore.acquire(*a, **k)
            finally:
                trace.wait_s += time.perf_counter() - t0
                trace.wait_spans.append((w0, _now()))

        def release(self):
            semaphore.release()

    if not getattr(flusher_module.write_shard, "_traced", False):
        write_shard = flusher_module.write_shard

        def timed_write(*a, **k):
            t0 = _now()
            try:
                return write_shard(*a, **k)
            finally:
                with _TRACE[0].lock:
                    _TRACE[0].spans.append((t0, _now()))

        timed_write._traced = True
        flusher_module.write_shard = timed_write
    writer._flusher._in_flight = TimedSemaphore()
    return trace


def _trace_loads() -> dict[str, float]:
    """Time the client's dump read, its copy through a kept mapping and the NaN/inf scan (benchmark-only instrumentation).

    Wall and CPU time of the calling thread both: CPU near wall means the work itself
    is slow (memory, page faults); wall far above CPU means the thread waited (for the
    GIL, or for a core).
    """
    import gc

    import hs_dataset.capture.sglang.dumps as client_module

    totals = {f"{name}_{what}": 0.0 for name in ("read", "scan", "mapped") for what in ("s", "cpu_s", "n")}
    lock = threading.Lock()

    def timed(name: str, fn):
        real = getattr(fn, "_real", fn)

        def wrapper(*a, **k):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return real(*a, **k)
            finally:
                wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
                with lock:
                    totals[name + "_s"] += wall
                    totals[name + "_cpu_s"] += cpu
                    totals[name + "_n"] += 1

        wrapper._real = real
        return wrapper

    gc_started: list[float] = []

    def gc_timer(phase: str, info: dict) -> None:  # every thread stops while the cyclic collector runs
        if phase == "start":
            gc_started[:] = [time.perf_counter()]
        elif gc_started:
            totals["gc_s"] += time.perf_counter() - gc_started[0]
            totals[f"gc{info.get('generation', 0)}_n"] += 1

    totals.update(gc_s=0.0, gc0_n=0, gc1_n=0, gc2_n=0)
    gc.callbacks[:] = [cb for cb in gc.callbacks if getattr(cb, "__name__", "") != "gc_timer"] + [gc_timer]
    client_module.read_dump = timed("read", client_module.read_dump)
    client_module.all_finite = timed("scan", client_module.all_finite)
    client_module.copy_out = timed("mapped", client_module.copy_out)
    return totals


def consume_phase(spec: dict, replies) -> dict:
    """One phase on the client side: expect every request the server will be sent, consume, write, close, verify."""
    from hs_dataset.capture.sglang.dumps import ExpectedDump
    from hs_dataset.formats.verify import verify_dataset
    from hs_dataset.formats.writer import ShardWriter
    from hs_dataset.sample import TokenizedSample

    per, requests = spec["per"], spec["requests"]
    ids = torch.tensor(spec["ids"], dtype=torch.int64)
    mask = torch.ones(per, dtype=torch.bool)
    prompts = [ids[r * per : (r + 1) * per].clone() for r in range(requests)]
    expected = ExpectedDump(aux_layer_ids=tuple(AUX), dtype=torch.bfloat16, hidden_size=H)  # what the client checks each dump against
    metadata = {
        "aux_layer_ids": list(AUX),
        "hidden_size": H,
        "dtype": "bfloat16",
        "final_state": "pre_norm",
        "model": "synthetic-kimi-shape",
        "config_name": "bench-node",
    }
    writer = ShardWriter(
        spec["out"],
        metadata,
        storage=spec["storage"],  # native, fp8, mxfp4, nf4: as the server's capture core
        shard_bytes=spec["shard_bytes"],
        writer_threads=spec["writer_threads"],
    )
    stats = {
        "load_busy_s": 0.0,
        "dump_wait_s": 0.0,
        "add_busy_s": 0.0,
        "samples": 0,
        "failures": [],
        "fallback": False,
        "first_flush_at": 0.0,
    }
    trace = _trace_writer(writer) if spec.get("trace") else None
    loads = _trace_loads() if trace is not None else None
    consumer = Consumer(expected, writer, spec["staging"], spec["loaders"], stats)
    try:
        # the client knows every request it sends: the server side names them hs-node-<seq>-<tokens>, 8 per pass
        for seq in range(spec["n"]):
            rid = f"hs-node-{seq}-{per}"
            consumer.expected.put((rid, TokenizedSample(rid, prompts[seq % requests], mask)))
        replies.put(("ready", None))
        consumer.finish()
        stats["consumed_at"] = _now()
        report = writer.close()
        stats["closed_at"] = _now()
        if trace is not None:
            stats["trace"] = (
                trace.summary(stats["first_flush_at"] or stats["closed_at"], stats["closed_at"])
                + f"; the loaders: {loads['read_s']:.1f} s reading {loads['read_n']:.0f} dumps ({loads['read_cpu_s']:.1f} s of it on a core; "
                f"{loads['mapped_n']:.0f} copied through a kept mapping in {loads['mapped_s']:.1f} s, the others read), "
                f"{loads['scan_s']:.1f} s scanning for NaN/inf ({loads['scan_cpu_s']:.1f} s on a core), "
                f"{stats['load_busy_s'] - loads['read_s'] - loads['scan_s']:.1f} s on the rest of the check and hand-back, "
                f"{stats['dump_wait_s']:.1f} s waiting for dumps to appear; the process in Python's cyclic garbage "
                f"collector {loads['gc_s']:.2f} s ({loads['gc0_n']:.0f}/{loads['gc1_n']:.0f}/{loads['gc2_n']:.0f} collections of generations 0/1/2)"
            )
        stats["tokens"] = report.tokens
        stats["bytes_written"] = report.bytes_written
    finally:
        writer.abort()
    if spec["verify"]:
        result = verify_dataset(spec["out"])
        stats["verified"] = result.summary() if result.ok else f"NOT VERIFIED: {result.problems[:3]}"
    shutil.rmtree(spec["out"], ignore_errors=True)
    return stats


def client_main(requests, replies) -> None:
    """The client process: one phase per message until None; every answer goes to ``replies``."""
    while (spec := requests.get()) is not None:
        if spec.get("switch_interval_ms"):
            sys.setswitchinterval(spec["switch_interval_ms"] / 1000)
        try:
            replies.put(("done", consume_phase(spec, replies)))
        except BaseException:
            replies.put(("error", traceback.format_exc()))


# ---------------------------------------------------------------------------- the server process


class Client:
    """The client process, seen from the server side."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.requests, self.replies = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=client_main, args=(self.requests, self.replies), name="hs-node-client", daemon=True)
        self.proc.start()

    def wait(self, what: str, timeout: float):
        deadline = _now() + timeout
        while True:
            try:
                kind, payload = self.replies.get(timeout=1.0)
            except queue.Empty as exc:
                if not self.proc.is_alive():
                    raise RuntimeError(
                        f"the client process died (exit code {self.proc.exitcode}) while the server waited for {what}"
                    ) from exc
                if _now() > deadline:
                    raise TimeoutError(f"no {what} from the client process within {timeout:.0f} s") from exc
                continue
            if kind == "error":
                raise RuntimeError(f"the client process failed:\n{payload}")
            if kind != what:
                raise RuntimeError(f"the client process answered {kind!r}, expected {what!r}")
            return payload

    def close(self) -> None:
        if self.proc.is_alive():
            self.requests.put(None)
            self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=10)


def run_phase(
    args, client: Client, model: SyntheticPrefill, rate: int, storage: str, out_root: str, staging_root: str, copier=None
) -> Phase:
    """One (rate, storage) phase. ``copier``: the server's pinned-memory copier, shared across phases as one
    server process keeps it for its lifetime (so its pinned pool is allocated once, in the warm-up); None: a new one."""
    from hs_dataset.server_patch.batch import BatchView
    from hs_dataset.server_patch.config import CaptureConfig
    from hs_dataset.server_patch.core import CaptureCore

    phase = Phase(rate, storage)
    device = model.w1[0].device
    tokens, requests = args.tokens, args.requests
    per = tokens // requests
    # every phase writes about --phase-gb to disk: fp8 (1 byte a value) captures twice the passes of bf16,
    # 4-bit about four times, so all rates are measured over the same volume and the same fixed latencies
    # (first fill, last fsync)
    from hs_dataset.codecs.registry import get_encoding, state_encoding_for

    step_bytes = tokens * (K + 1) * get_encoding(state_encoding_for(torch.bfloat16, storage)).row_bytes(H)
    steps = max(4, math.ceil(args.phase_gb * 1e9 / step_bytes))
    g = torch.Generator(device=device).manual_seed(rate)
    ids = torch.randint(1, 160_000, (tokens,), device=device, generator=g)
    x0 = torch.randn(tokens, H, device=device, dtype=torch.bfloat16, generator=g)

    # baseline: the same passes, no capture (the client process idle, as with no client)
    model(x0, ())
    _sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        model(x0, ())
    _sync()
    phase.base_tok_s = steps * tokens / (time.perf_counter() - t0)

    staging = os.path.join(staging_root, f"staging-{rate}-{storage}")
    out = os.path.join(out_root, f"ds-{rate}-{storage}")
    config = CaptureConfig(
        staging_dir=staging,
        hf_aux_layer_ids=AUX,
        rid_prefix="hs-",
        writer_threads=args.dump_writers,
        storage=storage,
        pinned_pool_bytes=args.pinned_gib << 30,
        max_staging_bytes=args.staging_gib << 30,
        max_staging_files=100_000,
        max_wait_s=120.0,  # back-pressure, never a refusal: the sustained rate is what is measured
    )
    core = CaptureCore(config, sglang_version="bench", copier=copier)
    try:
        client.requests.put(
            {
                "rate": rate,
                "storage": storage,
                "staging": staging,
                "out": out,
                "ids": ids.cpu().tolist(),
                "per": per,
                "requests": requests,
                "n": steps * requests,
                "loaders": args.loaders,
                "writer_threads": args.writer_threads,
                "shard_bytes": args.shard_mib << 20,
                "verify": args.verify,
                "trace": args.trace,
                "switch_interval_ms": args.switch_interval_ms,
            }
        )
        client.wait("ready", timeout=120)

        def step(seq: int) -> int:
            out, captured = model(x0, AUX)
            rids = [f"hs-node-{seq + r}-{per}" for r in range(requests)]
            batch = BatchView(mode="EXTEND", extend_seq_lens=[per] * requests, extend_prefix_lens=[0] * requests, rids=rids, input_ids=ids)
            core.process(batch, aux=[captured[i] for i in AUX], final_prenorm=out)
            return seq + requests

        seq = 0
        _sync()
        t_start = _now()
        for _ in range(steps):
            seq = step(seq)
        _sync()
        t_loop = _now() - t_start
        phase.cap_tok_s = steps * tokens / t_loop
        phase.loop_s = t_loop
        assert core.flush(timeout=600), "dump writers did not drain"
        stats = client.wait("done", timeout=PHASE_WAIT_S)
        phase.staged_bytes = core.stats["dump_bytes"]
        if core.stats["refused"]:
            phase.failures.append(f"{core.stats['refused']} requests refused by the server")
    finally:
        core.close()
        shutil.rmtree(staging, ignore_errors=True)
    phase.consumed_s = stats["consumed_at"] - t_start
    phase.e2e_s = stats["closed_at"] - t_start
    phase.first_flush_s = stats["first_flush_at"] - t_start if stats["first_flush_at"] else 0.0
    phase.tokens, phase.shard_bytes, phase.samples = stats["tokens"], stats["bytes_written"], stats["samples"]
    phase.failures += stats["failures"]
    phase.verified = stats.get("verified", "")
    phase.trace = stats.get("trace", "")
    phase.load_busy_s, phase.add_busy_s, phase.fallback = stats["load_busy_s"], stats["add_busy_s"], stats["fallback"]
    shutil.rmtree(out, ignore_errors=True)
    return phase


def fp8_error_check(model: SyntheticPrefill, tokens: int, storage: str = "fp8") -> str:
    """The device quantizer against the host encoder on real states of one pass, and its error (as bench_fp8.py reports it).

    ``storage``: fp8, or a 4-bit one (mxfp4, nf4), whose figures are printed under the same keys with its name.
    """
    from hs_dataset.codecs.registry import get_encoding, state_encoding_for
    from hs_dataset.formats.encoding import decode_state, encode_state
    from hs_dataset.server_patch.states import QUANTIZERS

    device = model.w1[0].device
    x0 = torch.randn(tokens, H, device=device, dtype=torch.bfloat16, generator=torch.Generator(device=device).manual_seed(7))
    out, captured = model(x0, AUX)
    states = torch.stack([captured[i] for i in AUX] + [out], dim=1)  # [T, K+1, H] bf16
    enc = get_encoding(state_encoding_for(torch.bfloat16, storage))
    q_dev, s_dev = QUANTIZERS[enc.name](states)  # the server's quantizer (4-bit: the fused kernel), on the device
    host = states.cpu()
    q_host, s_host = encode_state(host, enc)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}  # compared bit for bit (a NaN would equal itself)
    differ = sum(
        int((d.cpu().view(bits[d.element_size()]) != h.view(bits[h.element_size()])).sum()) for d, h in ((q_dev, q_host), (s_dev, s_host))
    )
    back = decode_state(q_host, s_host, enc).float()
    ref = host.float()
    err = ((back - ref).flatten(2).norm(dim=2) / ref.flatten(2).norm(dim=2).clamp_min(1e-30)).flatten()
    median, p99, worst = float(err.median()), float(err.quantile(0.99)), float(err.max())
    return (
        f"{storage} on the device vs the host encoder: {differ} of {q_host.numel() + s_host.numel()} values differ; "
        f"per-token relative error vs bf16: median {median:.4f}, p99 {p99:.4f}, max {worst:.4f} "
        f"({storage}_rel_error_median={median:.4f} {storage}_rel_error_max={worst:.4f})"
    )


def _ceiling(phase: Phase, raw_rate: float) -> float:
    """What a phase's on-disk rate can reach: the raw disk rate, or the shard bytes the prefill offers if fewer."""
    return min(raw_rate, phase.offered_gb_s) if phase.offered_gb_s else raw_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--rates", default="26000,108000", help=f"target prefill tokens/s, from {sorted(RATES)}")
    parser.add_argument("--storages", default="native,fp8")
    parser.add_argument(
        "--phase-gb",
        type=float,
        default=10.0,
        help="bytes each phase writes to disk (sets the passes; fp8 phases run twice the tokens of bf16)",
    )
    parser.add_argument("--dump-writers", "--writers", dest="dump_writers", type=int, default=8, help="server dump writer threads")
    parser.add_argument("--loaders", type=int, default=8, help="client dump-consumer threads (the client's concurrency)")
    parser.add_argument("--writer-threads", type=int, default=8, help="shard writer threads in the client (also the raw-write baseline's)")
    parser.add_argument(
        "--shard-mib", type=int, default=512, help="shard size of the client's writer (also the raw-write baseline's files)"
    )
    parser.add_argument("--staging", default="/dev/shm")
    parser.add_argument(
        "--staging-gib", type=int, default=16, help="staging budget (the server's default): beyond it the prefill waits (back-pressure)"
    )
    parser.add_argument("--pinned-gib", type=int, default=4)
    parser.add_argument("--out", default=None, help="where shards go (default: a temp dir under the current directory's disk)")
    parser.add_argument(
        "--copier-per-phase", action="store_true", help="a new pinned pool per phase (before: one per run, as a server keeps it)"
    )
    parser.add_argument("--trace", action="store_true", help="print where the client's shard writer spent its time")
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=0.0,
        help="the client process's GIL switch interval (0: Python's default, 5 ms): a diagnostic",
    )
    parser.add_argument("--no-verify", dest="verify", action="store_false")
    parser.add_argument("--warmup-gb", type=float, default=1.0, help="an unmeasured first phase of this many bytes (0: none)")
    args = parser.parse_args()
    smoke = os.environ.get("HS_BENCH_SMOKE") == "1"
    if not torch.cuda.is_available() and not smoke:
        print("no CUDA device: bench_node needs a GPU (run it through the device tool); nothing measured")
        return

    client = Client()  # started first: its interpreter and imports load while the disk baseline runs
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    out_root = tempfile.mkdtemp(prefix="hs-node-", dir=args.out or os.getcwd())
    staging_root = tempfile.mkdtemp(prefix="hs-node-", dir=args.staging)
    st = os.statvfs(out_root)
    shard_bytes = args.shard_mib << 20
    print(
        f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, {os.cpu_count()} cores; hidden {H}, "
        f"aux {list(AUX)} + final, {args.tokens}-token passes of {args.requests} requests; shards to {out_root} "
        f"({st.f_bavail * st.f_frsize / 2**30:.0f} GiB free), staging {args.staging} (budget {args.staging_gib} GiB); "
        f"server process: prefill + capture core, {args.dump_writers} dump writers; client process (spawned, pid {client.proc.pid}): "
        f"{args.loaders} dump loaders, shard writer with {args.writer_threads} writer threads and {args.shard_mib} MiB shards",
        flush=True,
    )
    from hs_dataset.codecs.registry import state_encoding_for
    from hs_dataset.server_patch.copier import HostCopier
    from hs_dataset.server_patch.states import prepare_quantizer

    copier = None if args.copier_per_phase else HostCopier(args.pinned_gib << 30)
    if copier is not None:
        copier.prepare_pinned()  # as the hooks do when a server loads them: no phase pays for pinning the slab
    for storage in args.storages.split(","):  # as the hooks do too: no phase pays for compiling the 4-bit kernel
        prepare_quantizer(None if storage == "native" else state_encoding_for(torch.bfloat16, storage), device)
    phases: list[Phase] = []
    raw: list[float] = []
    try:
        raw_bytes = int(args.phase_gb * 1e9)
        raw.append(raw_disk_rate(out_root, raw_bytes, shard_bytes, args.writer_threads))
        print(
            f"raw disk writes ({raw_bytes / 1e9:.1f} GB, {args.writer_threads} threads, {args.shard_mib} MiB files, fsync): {raw[-1]:.2f} GB/s",
            flush=True,
        )
        rates = [int(r) for r in args.rates.split(",")]
        for rate in rates:
            model = SyntheticPrefill(args.layers, int(os.environ.get("HS_BENCH_INTER", RATES.get(rate, 14336))), device)
            if rate == max(rates):
                for storage in dict.fromkeys(["fp8", *(s for s in args.storages.split(",") if s != "native")]):
                    print(fp8_error_check(model, args.tokens, storage), flush=True)
            if rate == rates[0] and args.warmup_gb > 0:  # the process's one-time costs (CUDA, allocators, imports) land here
                warm = argparse.Namespace(**{**vars(args), "phase_gb": args.warmup_gb, "verify": False})
                w = run_phase(warm, client, model, rate, args.storages.split(",")[0], out_root, staging_root, copier)
                print(f"warm-up phase, not counted: {w.samples} samples, prefill {w.overhead * 100:+.1f}%", flush=True)
            for storage in args.storages.split(","):
                p = run_phase(args, client, model, rate, storage, out_root, staging_root, copier)
                phases.append(p)
                print(
                    f"{rate // 1000}k tok/s {storage:>6}: prefill {p.base_tok_s:,.0f} -> {p.cap_tok_s:,.0f} tok/s with capture "
                    f"({p.overhead * 100:+.1f}%); {p.samples} samples, {p.tokens:,} tokens, {p.shard_bytes / 1e9:.2f} GB of shards "
                    f"({p.staged_bytes / 1e9:.2f} GB staged) in {p.e2e_s:.2f} s: {p.e2e_gb_s:.2f} GB/s on disk end to end "
                    f"(sustained {p.steady_gb_s:.2f} GB/s from the first shard write at {p.first_flush_s:.2f} s to the last publish), "
                    f"state rate {p.state_gb_s:.2f} GB/s (bf16 bytes); passes done at {p.loop_s:.2f} s, last dump consumed at "
                    f"{p.consumed_s:.2f} s; client load busy {p.load_busy_s:.1f} s, writer.add busy {p.add_busy_s:.1f} s; "
                    f"{p.verified or 'not verified'}"
                    + (f"; FAILURES {len(p.failures)}: {p.failures[:2]}" if p.failures else "")
                    + (f"; the writer re-encoded {storage} (no pass-through)" if p.fallback else "")
                    + (f"\n  {p.trace}" if p.trace else ""),
                    flush=True,
                )
            del model
            torch.cuda.empty_cache() if device.type == "cuda" else None
        raw.append(raw_disk_rate(out_root, raw_bytes, shard_bytes, args.writer_threads))
        print(f"raw disk writes again: {raw[-1]:.2f} GB/s", flush=True)
    finally:
        client.close()
        shutil.rmtree(out_root, ignore_errors=True)
        shutil.rmtree(staging_root, ignore_errors=True)

    raw_rate = statistics.mean(raw)
    by = {(p.rate, p.storage): p for p in phases}
    high = max(p.rate for p in phases)
    native = [p for p in phases if p.storage == "native"]
    nan = float("nan")
    overhead = max(p.overhead for p in native) if native else nan  # the worst across the rates
    # the worst bf16 phase against what it could reach: the raw disk rate, or the rate the prefill offers if lower
    e2e = min(p.steady_gb_s / _ceiling(p, raw_rate) for p in native) if native else nan
    fp8 = by[(high, "fp8")].state_gb_s / by[(high, "native")].state_gb_s if (high, "fp8") in by and (high, "native") in by else nan
    for p in phases:
        ceiling = _ceiling(p, raw_rate)
        print(
            f"  {p.rate // 1000}k {p.storage}: prefill overhead {p.overhead * 100:+.1f}%; on disk end to end {p.e2e_gb_s:.2f} GB/s = "
            f"{p.e2e_gb_s / raw_rate:.2f} of raw {raw_rate:.2f} GB/s, sustained {p.steady_gb_s:.2f} GB/s = {p.steady_gb_s / raw_rate:.2f} of raw "
            f"({p.steady_gb_s / ceiling:.2f} of min(raw, {p.offered_gb_s:.2f} GB/s of shard bytes the prefill offers)); "
            f"states {p.state_gb_s:.2f} GB/s (bf16 bytes)"
        )
    if phases:
        worst = max(phases, key=lambda p: p.overhead)
        print(f"  worst prefill overhead with fp8 too: {worst.overhead * 100:+.1f}% ({worst.rate // 1000}k {worst.storage})")
    for storage in dict.fromkeys(p.storage for p in phases if p.storage not in ("native", "fp8")):
        for rate in sorted({p.rate for p in phases}):
            if (rate, storage) in by and (rate, "native") in by:
                cap = by[(rate, "native")].base_tok_s * (K + 1) * H * 2 / 1e9 / by[(rate, "native")].state_gb_s  # what the prefill allows
                print(
                    f"  {storage} state rate vs bf16 at {rate // 1000}k: {by[(rate, storage)].state_gb_s / by[(rate, 'native')].state_gb_s:.2f}x "
                    f"(the prefill's own rate caps it at {cap:.2f}x)"
                )
    print(f"prefill_overhead={overhead * 100:.1f}% end_to_end_vs_raw={e2e:.2f} fp8_vs_bf16={fp8:.2f}")


if __name__ == "__main__":
    main()
