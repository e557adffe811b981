"""Read throughput into the training view: from an S3 bucket through the bounded cache vs from local disk, same shards.

One run: a dataset is written locally (Kimi-K2.5-shaped rows by default: hidden 7168,
3 aux + final, bf16), uploaded to moto's S3 server started on 127.0.0.1 (the one the
tests use, in its own process), then read twice by the same consumer, a DataLoader over
``training.Eagle3Dataset`` with the packing sampler and collator (every state byte is
copied into the packed batch):

  local:  ``open_dataset(DIR)`` with the shards' pages dropped first (posix_fadvise
          DONTNEED, where the kernel allows), so the disk is read;
  remote: ``open_dataset("s3://...")`` from an empty cache bounded to --cache-shards
          shards (prefetch --prefetch), the bound checked on disk after every batch.
          The cache lies on the working directory's disk unless --cache-dir says
          otherwise: every byte read remotely is also written there once.

The two passes alternate --repeat times (each remote pass from an empty cache, each local
pass with the pages dropped again). First, one shard's download three ways (the receive
alone; receive, hash and write on one thread; ``receive_file``). Prints every pass, the medians, the cache's peak on
disk against its bound, and last ``remote_vs_local=X.XX`` (median state bytes per
second, remote / local).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, SequentialSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_shards import drop_cache

import hs_dataset
from hs_dataset.formats import ShardWriter
from hs_dataset.remote.cache import disk_usage
from hs_dataset.remote.location import open_location
from hs_dataset.remote.publish import publish_dataset
from hs_dataset.sample import CapturedSample
from hs_dataset.training import Eagle3Dataset, PackedCollator, PackingBatchSampler
from tests.fixtures.s3_server import ENV, start_moto


def write_dataset(root: Path, total_bytes: int, hidden: int, shard_bytes: int) -> None:
    g = torch.Generator().manual_seed(0)
    metadata = {
        "config_name": "bench-remote",
        "config_fingerprint": "0" * 64,
        "model": {"path": "synthetic", "fingerprint": "none"},
        "aux_layer_ids": [2, 30, 58],
        "layer_convention": "hf_hidden_states_index",
        "final_state": "pre_norm",
        "final_norm": {"eps": 1e-6},
        "dtype": "bfloat16",
        "hidden_size": hidden,
    }
    size, i = 0, 0
    with ShardWriter(root, metadata, final_norm_weight=torch.ones(hidden), shard_bytes=shard_bytes) as writer:
        while size < total_bytes:
            t = int(torch.randint(64, 513, (1,), generator=g))
            states = torch.randn(t, 4, hidden, generator=g).bfloat16()
            writer.add(
                CapturedSample(
                    f"s{i:05d}",
                    torch.randint(0, 163840, (t,), generator=g),
                    torch.ones(t, dtype=torch.bool),
                    states[:, :3].contiguous(),
                    states[:, 3].contiguous(),
                )
            )
            size += t * 4 * hidden * 2
            i += 1


def download_rates(record, work: Path, repeats: int = 3) -> dict[str, float]:
    """MiB/s of one shard's download three ways (best of ``repeats``): the receive alone, receive + hash + write on
    one thread (the baseline), and ``receive_file`` as the cache calls it (receive on one thread, hash + write on
    another, the hash checked, no fsync)."""
    import urllib.request

    from hs_dataset.formats.hashing import new_hasher
    from hs_dataset.remote.transfer import Expected, receive_file

    loc = open_location("s3://bench/ds")
    shard, size = record.file, record.bytes
    url = loc.fs.sign(loc.key(shard), expiration=600)
    buf = bytearray(8 << 20)
    view = memoryview(buf)

    def receive(hash_and_write: bool) -> None:
        hasher, out = new_hasher("blake3"), open(work / "dl.tmp", "wb") if hash_and_write else None
        with urllib.request.urlopen(url) as response:
            while n := response.readinto(buf):
                if out is not None:
                    hasher.update(view[:n])
                    out.write(view[:n])
        if out is not None:
            out.close()

    ways = {
        "receive only": lambda: receive(False),
        "receive + hash + write, one thread": lambda: receive(True),
        "receive_file (hash + write on a second thread)": lambda: receive_file(
            loc, shard, work / "dl.bin", Expected(size, record.hash_algorithm, record.digest), durable=False
        ),
    }
    rates: dict[str, float] = {}
    for name, run in ways.items():
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - t0)
        rates[name] = size / best / 2**20
    for f in ("dl.tmp", "dl.bin"):
        (work / f).unlink(missing_ok=True)
    return rates


def consume(data, max_tokens: int, cache: Path | None) -> tuple[float, int, int]:
    """(seconds, state bytes delivered, peak cache bytes on disk) for one pass of the training view."""
    view = Eagle3Dataset(data)
    batches = PackingBatchSampler(SequentialSampler(range(len(view))), view.lengths, max_tokens)
    loader = DataLoader(view, batch_sampler=batches, collate_fn=PackedCollator(max_tokens), num_workers=0)
    start, moved, peak = time.perf_counter(), 0, 0
    for batch in loader:
        moved += batch["aux_hidden_states"].numel() * 2 + batch["final_hidden_state"].numel() * 2
        if cache is not None:
            peak = max(peak, disk_usage(cache))
    return time.perf_counter() - start, moved, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=768, help="dataset size in MiB of states")
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--shard-mib", type=int, default=64)
    parser.add_argument("--cache-shards", type=int, default=5, help="cache bound, in shards")
    parser.add_argument("--prefetch", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=8192, help="tokens per packed batch")
    parser.add_argument("--repeat", type=int, default=3, help="local and remote passes, alternated; medians are compared")
    parser.add_argument("--dir", default=None, help="working directory (default: a temp dir on the disk of the current one)")
    parser.add_argument("--cache-dir", default=None, help="the remote read's cache (default: in the working directory, on the same disk)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-remote-", dir=args.dir or "."))
    cache = Path(tempfile.mkdtemp(prefix="bench-remote-cache-", dir=args.cache_dir)) if args.cache_dir else work / "cache"
    proc, endpoint = start_moto()
    os.environ.update({**ENV, "AWS_ENDPOINT_URL": endpoint})
    try:
        import s3fs

        s3fs.S3FileSystem().mkdir("bench")
        local = work / "local"
        write_dataset(local, args.mib << 20, args.hidden, args.shard_mib << 20)
        shards = hs_dataset.open_dataset(local).manifest.shards
        largest = max(r.bytes for r in shards)
        t0 = time.perf_counter()
        publish_dataset(local, open_location("s3://bench/ds"))
        upload_s = time.perf_counter() - t0
        print(
            f"{len(shards)} shards, {sum(r.bytes for r in shards) / 2**20:.0f} MiB in {work}, cache in {cache}; upload {upload_s:.1f} s; "
            f"cores {os.cpu_count()}; moto at {endpoint}"
        )

        rates = download_rates(shards[0], work)
        base = rates["receive + hash + write, one thread"]
        for name, rate in rates.items():
            print(f"one shard's download, {name}: {rate:.0f} MiB/s ({rate / base:.2f}x the one-thread baseline)")
        bound = args.cache_shards * (largest + 4096) + 65536
        local_rates, remote_rates, peaks, dropped = [], [], [], True
        for rep in range(args.repeat):  # alternated, so both sides see the same load on a shared machine
            dropped = drop_cache(sorted(local.rglob("*.safetensors"))) and dropped
            local_s, local_bytes, _ = consume(hs_dataset.open_dataset(local), args.max_tokens, None)
            shutil.rmtree(cache, ignore_errors=True)  # every remote pass starts from an empty cache
            remote = hs_dataset.open_dataset("s3://bench/ds", cache_dir=cache, max_cache_bytes=bound, prefetch_shards=args.prefetch)
            remote_s, remote_bytes, peak = consume(remote, args.max_tokens, cache)
            remote.close()
            assert remote_bytes == local_bytes, (remote_bytes, local_bytes)
            local_rates.append(local_bytes / local_s / 2**20)
            remote_rates.append(remote_bytes / remote_s / 2**20)
            peaks.append(peak)
            print(f"  pass {rep + 1}: local {local_rates[-1]:.0f} MiB/s, s3 via cache {remote_rates[-1]:.0f} MiB/s, cache peak {peak}")
        local_rate, remote_rate = statistics.median(local_rates), statistics.median(remote_rates)
        print(
            f"local disk{' (pages dropped)' if dropped else ' (page cache NOT dropped)'}: {local_rate:.0f} MiB/s of states "
            f"into the training view (median of {args.repeat})"
        )
        print(
            f"s3 via cache: {remote_rate:.0f} MiB/s (median of {args.repeat}); cache peak {max(peaks)} bytes on disk, bound {bound} "
            f"({'held' if max(peaks) <= bound else 'EXCEEDED'}); prefetch {args.prefetch}"
        )
        print(f"remote_vs_local={remote_rate / local_rate:.2f}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
        if args.cache_dir:
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
