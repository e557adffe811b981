"""One file written alone, with and without early writeback, against the disk's parallel rate.

Why: the shard writer asks the kernel to start writing back each ``WRITEBACK_BYTES``
of a shard as it goes (``hs_dataset.libc.start_writeback``, ``sync_file_range``).
Without that, a buffered file reaches the disk only at its ``fsync``, in one burst
from one stream, and while few shards are in flight (the first ones of a run, the
last ones) the disk idles. This measures, in one run and on one directory:

* ``plain``: one thread writes each file (8 MiB writes), then fsyncs it;
* ``writeback``: the same, asking for writeback every ``WRITEBACK_BYTES``;
* ``parallel``: ``--threads`` plain files at once (bench_node's raw baseline), the
  rate the disk reaches when it is kept busy;
* ``parallel writeback``: as many files at once, each asking for early writeback (the
  shard writer at full load: it must not lose there what it gains alone).

Runs alternate ``--repeats`` times; the figures are medians. Last line:
``writeback_vs_plain=X writeback_vs_parallel=Y parallel_writeback_vs_parallel=Z``. Where the call
is missing (not Linux) or refused, it says so and the two single-file figures match.
Usage: ``python benchmarks/bench_writeback.py [--dir DIR] [--file-mib 512] [--files 2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

from hs_dataset.formats.shard_file import WRITEBACK_BYTES
from hs_dataset.libc import start_writeback

CHUNK = 8 << 20  # the writer's write size (its hashing chunk)


def write_file(path: str, size: int, source: memoryview, early: bool, chunk: int = CHUNK) -> bool:
    """Write ``size`` bytes then fsync; with ``early``, ask for writeback as the writer does. True if it was accepted."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    accepted, asked, done = early, 0, 0
    try:
        while done < size:
            start = done % len(source)
            done += os.write(fd, source[start : start + min(chunk, size - done)])
            if accepted and done - asked >= WRITEBACK_BYTES:
                accepted = start_writeback(fd, asked, done - asked)
                asked = done
        os.fsync(fd)
    finally:
        os.close(fd)
    return accepted


def write_files(directory: str, sizes: list[int], threads: int, source: memoryview, early: bool, chunk: int = CHUNK) -> tuple[float, bool]:
    """GB/s writing files of ``sizes`` in ``chunk``-byte writes, ``threads`` at a time, each fsynced; and whether
    every early writeback was accepted. Also bench_node's raw-disk baseline (``early=False``, 64 MiB writes)."""
    names = iter(list(enumerate(sizes)))
    lock = threading.Lock()
    accepted = [True]

    def worker() -> None:
        while True:
            with lock:
                item = next(names, None)
            if item is None:
                return
            ok = write_file(os.path.join(directory, f"wb-{item[0]}.bin"), item[1], source, early, chunk)
            accepted[0] = accepted[0] and ok

    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    rate = sum(sizes) / (time.perf_counter() - t0) / 1e9
    for i in range(len(sizes)):
        os.unlink(os.path.join(directory, f"wb-{i}.bin"))
    return rate, accepted[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir in the current directory)")
    parser.add_argument("--file-mib", type=int, default=512, help="file size (the shard size)")
    parser.add_argument("--files", type=int, default=2, help="files per single-stream measurement")
    parser.add_argument("--threads", type=int, default=8, help="files at once in the parallel reference")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    size = args.file_mib << 20
    source = memoryview(os.urandom(64 << 20))
    directory = tempfile.mkdtemp(prefix="hs-writeback-", dir=args.dir or os.getcwd())
    st = os.statvfs(directory)
    print(
        f"dir {directory} ({st.f_bavail * st.f_frsize / 2**30:.0f} GiB free), {os.cpu_count()} cores; {args.file_mib} MiB files, "
        f"writeback asked every {WRITEBACK_BYTES >> 20} MiB; parallel reference: {args.threads} files at once",
        flush=True,
    )
    rates: dict[str, list[float]] = {"plain": [], "writeback": [], "parallel": [], "parallel writeback": []}
    accepted = True
    try:
        for rep in range(args.repeats):
            rates["plain"].append(write_files(directory, [size] * args.files, 1, source, early=False)[0])
            rate, ok = write_files(directory, [size] * args.files, 1, source, early=True)
            rates["writeback"].append(rate)
            accepted = accepted and ok
            rates["parallel"].append(write_files(directory, [size] * (args.threads * 2), args.threads, source, early=False)[0])
            rate, ok = write_files(directory, [size] * (args.threads * 2), args.threads, source, early=True)
            rates["parallel writeback"].append(rate)
            accepted = accepted and ok
            print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.2f} GB/s" for k, v in rates.items()), flush=True)
    finally:
        os.rmdir(directory)
    if not accepted:
        print("early writeback was refused here (not Linux, or this file system says no): the writer writes as plainly as the baseline")
    median = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"writeback_vs_plain={median['writeback'] / median['plain']:.2f} writeback_vs_parallel={median['writeback'] / median['parallel']:.2f} "
        f"parallel_writeback_vs_parallel={median['parallel writeback'] / median['parallel']:.2f}"
    )


if __name__ == "__main__":
    main()
