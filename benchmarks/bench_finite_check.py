"""The writer's NaN/inf check on one Kimi-wide sample, with and without threads wanting the GIL.

``ShardWriter.add`` runs ``formats.encoding.all_finite`` on every state, on the one thread
that adds samples; in the client that thread shares the GIL with the dump loaders and the
shard writer threads. The check used to scan in cache-sized pieces (256 K values), each
piece two numpy calls and so two hand-backs of the GIL; it now scans pieces of
``encoding._CHECK_CHUNK`` values (4 M: 3 for the aux states) through a temporary kept
per thread. Both run here, in the same process and run, on a 512-token sample (3 aux +
final, hidden 7168, bf16: 29 MB):

* ``quiet``: nothing else running;
* ``contended``: ``--spinners`` threads running pure-Python loops (a stand-in for the
  loaders' and writers' Python glue), so every GIL hand-back can wait a switch interval.

Prints the median ms per sample of each and last ``large_vs_small_pieces_contended=X``:
the time with 256 K pieces over the time with the large ones under contention (higher is better).

    python benchmarks/bench_finite_check.py [--tokens 512] [--spinners 4] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from hs_dataset.formats import encoding

PIECES = 1 << 18  # the piece size the check used before


def per_sample_ms(states: list[torch.Tensor], chunk: int, repeats: int) -> float:
    saved = encoding._CHECK_CHUNK
    encoding._CHECK_CHUNK = chunk
    try:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            assert all(encoding.all_finite(s) for s in states)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000
    finally:
        encoding._CHECK_CHUNK = saved


def spin(stop: threading.Event) -> None:
    """Pure-Python work that wants the GIL back as soon as it lets go of it."""
    while not stop.is_set():
        sum(range(200))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--spinners", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    states = [torch.randn(args.tokens, 3, 7168, generator=g).bfloat16(), torch.randn(args.tokens, 7168, generator=g).bfloat16()]
    mb = sum(s.numel() * s.element_size() for s in states) / 1e6
    print(f"{args.tokens} tokens x (3 aux + final) x 7168 bf16 = {mb:.0f} MB a sample; {args.repeats} repeats")
    results = {}
    for label, spinners in (("quiet", 0), ("contended", args.spinners)):
        stop = threading.Event()
        threads = [threading.Thread(target=spin, args=(stop,), daemon=True) for _ in range(spinners)]
        for t in threads:
            t.start()
        try:
            large = per_sample_ms(states, encoding._CHECK_CHUNK, args.repeats)
            small = per_sample_ms(states, PIECES, args.repeats)
        finally:
            stop.set()
            for t in threads:
                t.join()
        results[label] = (large, small)
        print(f"  {label:9s} ({spinners} spinning threads): {encoding._CHECK_CHUNK >> 20} M pieces {large:9.2f} ms, 256 K pieces {small:9.2f} ms per sample -> {small / large:.2f}x")
    large, small = results["contended"]
    print(f"large_vs_small_pieces_contended={small / large:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
