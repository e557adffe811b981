"""P2/P3: shard writer and random-sample reader throughput against raw disk I/O of the same bytes.

Both sides move the same number of bytes into the same directory in one run:
  (a) writer: ShardWriter (validation, hashing, atomic publish, fsync) vs plain os.write
      of the same samples' bytes from the same memory into files of the shards' sizes, fsynced;
  (b) reader: open_dataset + every sample in random order, copied out with the reader's
      read_into (preadv; the zero-copy mmap item views are measured too), vs
      plain sequential readinto of the same files; warm (page cache filled and shards
      mapped by a first pass, as in every epoch after the first) and cold (fresh
      mapping, pages dropped with posix_fadvise(DONTNEED), where the kernel allows).
Samples are Kimi-K2.5 shaped (hidden 7168, 3 aux + final, bf16). First line: where
it ran (directory, file system, cores, shard hash); last line:
``writer_vs_raw=X.XX reader_vs_raw=Y.YY`` (warm-cache reader ratio; cold printed above).
Needs torch, numpy and blake3 (what hs_dataset's writer and reader import), nothing else.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch

from hs_dataset import open_dataset
from hs_dataset.formats import ShardWriter
from hs_dataset.formats.hashing import SHARD_HASH
from hs_dataset.sample import CapturedSample

H, K = 7168, 3


def make_samples(total_bytes: int, seed: int = 0) -> list[CapturedSample]:
    g = torch.Generator().manual_seed(seed)
    per_token = (K + 1) * H * 2 + 9
    samples, size, i = [], 0, 0
    while size < total_bytes:
        t = int(torch.randint(64, 513, (1,), generator=g))
        states = torch.randn(t, K + 1, H, generator=g).bfloat16()
        samples.append(
            CapturedSample(
                f"s{i:05d}",
                torch.randint(0, 163840, (t,), generator=g),
                torch.ones(t, dtype=torch.bool),
                states[:, :K].contiguous(),
                states[:, K].contiguous(),  # backends hand out contiguous states
            )
        )
        size += t * per_token
        i += 1
    return samples


def metadata() -> dict:
    return {
        "config_name": "bench",
        "model": {"path": "synthetic"},
        "aux_layer_ids": [2, 30, 58],
        "final_state": "pre_norm",
        "dtype": "bfloat16",
        "hidden_size": H,
    }


def bench_writer(root: Path, samples: list[CapturedSample], shard_bytes: int, threads: int) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    with ShardWriter(root, metadata(), shard_bytes=shard_bytes, writer_threads=threads) as writer:
        for s in samples:
            writer.add(s)
    elapsed = time.perf_counter() - t0
    sizes = [r.bytes for r in writer.manifest.shards]
    return elapsed, sizes


def bench_raw_write(root: Path, samples: list[CapturedSample], sizes: list[int]) -> float:
    """The same bytes from the same memory, written sequentially into files of the shards' sizes, fsynced."""
    views = [
        memoryview(t.reshape(-1).view(torch.uint8).numpy())
        for s in samples
        for t in (s.input_ids, s.aux_hidden_states, s.final_hidden_state, s.loss_mask)
    ]
    t0 = time.perf_counter()
    source = iter(views)
    pending = memoryview(b"")
    for i, size in enumerate(sizes):
        fd = os.open(root / f"raw-{i}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        left = size
        while left:
            if not pending:
                pending = next(source, None) or memoryview(bytes(min(left, 1 << 20)))  # header bytes: pad
            n = os.write(fd, pending[: min(left, len(pending), 8 << 20)])
            pending, left = pending[n:], left - n
        os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - t0


def file_system(path: Path) -> str:
    """The mount type under ``path`` (tmpfs, ext4, xfs, ...), from /proc/mounts; '?' where there is none."""
    best, kind = "", "?"
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                _dev, mount, fs_type = line.split()[:3]
                if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
                    best, kind = mount, fs_type
    except OSError:
        pass
    return kind


def drop_cache(paths: list[Path]) -> bool:
    ok = True
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except (AttributeError, OSError):
            ok = False
        finally:
            os.close(fd)
    return ok


_CHUNK = 8 * 1024 * 1024  # both readers move data into one reused 8 MiB buffer


def bench_reader(ds, seed: int) -> tuple[float, int]:
    """Every sample in random order; each tensor's bytes copied out of the mapping in 8 MiB pieces.

    The destination is the same reused 8 MiB buffer the raw ``readinto`` baseline uses,
    so both sides pay the same for their writes and differ only in how bytes are found.
    """
    import numpy as np

    order = list(range(len(ds)))
    random.Random(seed).shuffle(order)
    out = np.empty(_CHUNK, dtype=np.uint8)
    moved = 0
    t0 = time.perf_counter()
    for i in order:
        item = ds[i]
        for key in ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_state"):
            src = item[key].reshape(-1).view(torch.uint8).numpy()
            for start in range(0, src.size, _CHUNK):
                piece = src[start : start + _CHUNK]
                np.copyto(out[: piece.size], piece)
            moved += src.size
    return time.perf_counter() - t0, moved


def bench_reader_copy_out(ds, seed: int) -> tuple[float, int]:
    """Same order and destination as :func:`bench_reader`, through the reader's ``read_into`` (preadv)."""
    order = list(range(len(ds)))
    random.Random(seed).shuffle(order)
    out = memoryview(bytearray(_CHUNK))
    moved = 0
    t0 = time.perf_counter()
    for i in order:
        shard, local = ds.locate(i)
        reader = ds.shard(shard)
        for key in ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_state"):
            total = reader.sample_nbytes(local, key)
            start = 0
            while start < total:
                start += reader.read_into(local, key, out, start)
            moved += total
    return time.perf_counter() - t0, moved


def bench_raw_read(paths: list[Path]) -> tuple[float, int]:
    buf = bytearray(_CHUNK)
    moved = 0
    t0 = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                moved += n
    return time.perf_counter() - t0, moved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=768, help="bytes of states to write (MiB)")
    parser.add_argument("--shard-mib", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="writer threads")
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    samples = make_samples(args.mib * 1024 * 1024)
    base = Path(tempfile.mkdtemp(prefix="bench-shards-", dir=args.dir))
    print(
        f"dir {base.parent} ({file_system(base)}), {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
        f"shard hash {SHARD_HASH}, writer threads {args.threads}, {args.repeats} repeats",
        flush=True,
    )
    w_ratios, r_warm, r_cold, r_views = [], [], [], []
    sizes: list[int] = []
    try:
        for rep in range(args.repeats):
            ds_dir, raw_dir = base / f"ds{rep}", base / f"raw{rep}"
            raw_dir.mkdir()
            # alternate which side writes first so neither always meets the emptier disk cache
            if rep % 2 and sizes:
                raw_s = bench_raw_write(raw_dir, samples, sizes)
                writer_s, sizes = bench_writer(ds_dir, samples, args.shard_mib * 1024 * 1024, args.threads)
            else:
                writer_s, sizes = bench_writer(ds_dir, samples, args.shard_mib * 1024 * 1024, args.threads)
                raw_s = bench_raw_write(raw_dir, samples, sizes)
            total = sum(sizes)
            w_ratios.append(raw_s / writer_s)
            shard_paths = sorted(ds_dir.glob("*.safetensors"))
            ds = open_dataset(ds_dir)
            bench_reader(ds, rep)  # warm: page cache filled, shards mapped, as in any epoch after the first
            bench_raw_read(shard_paths)
            ours_s, ours_b = bench_reader(ds, rep)
            raw_rs, raw_b = bench_raw_read(shard_paths)
            copy_s, copy_b = bench_reader_copy_out(ds, rep)
            del ds
            r_views.append((ours_b / ours_s) / (raw_b / raw_rs))
            r_warm.append((copy_b / copy_s) / (raw_b / raw_rs))
            if drop_cache(shard_paths):
                ours_cs, ours_cb = bench_reader_copy_out(open_dataset(ds_dir), rep + 100)  # cold: pages from disk
                drop_cache(shard_paths)
                raw_cs, raw_cb = bench_raw_read(shard_paths)
                r_cold.append((ours_cb / ours_cs) / (raw_cb / raw_cs))
            print(
                f"rep {rep}: {total / 2**20:.0f} MiB in {len(sizes)} shards | write ours {total / writer_s / 2**20:.0f} MiB/s raw {total / raw_s / 2**20:.0f} MiB/s"
                f" | read warm: read_into {copy_b / copy_s / 2**20:.0f}, mmap views {ours_b / ours_s / 2**20:.0f}, raw {raw_b / raw_rs / 2**20:.0f} MiB/s"
                + (f" | read cold ours {ours_cb / ours_cs / 2**20:.0f} raw {raw_cb / raw_cs / 2**20:.0f} MiB/s" if r_cold else ""),
                flush=True,
            )
            shutil.rmtree(ds_dir)
            shutil.rmtree(raw_dir)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"reader_mmap_views_vs_raw={med(r_views):.2f} (zero-copy item views, copied out by the consumer)")
    if r_cold:
        print(f"reader_cold_vs_raw={med(r_cold):.2f}")
    print(f"writer_vs_raw={med(w_ratios):.2f} reader_vs_raw={med(r_warm):.2f}")


if __name__ == "__main__":
    main()
