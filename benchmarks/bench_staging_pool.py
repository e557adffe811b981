"""Staging with spares and pooled read buffers vs fresh memory on both sides: one dump's cost per token.

The real code on both sides, no SGLang: the server's ``StagingDir.write_atomic`` writes a
Kimi-wide dump (a safetensors header, then 3 aux + 1 final bf16 states of hidden 7168:
56 KiB per token) from host buffers, and the client reads it and keeps the samples,
``--held`` at a time, dropping them together, as the shard writer keeps a shard's
samples until the shard is written.

* ``fresh`` (the baseline, how it was done before): every dump is a new tmpfs file
  (pages allocated and zeroed, freed again by the client's delete), read into new
  memory with ``torch.empty`` + ``readinto`` (a page fault per 4 KiB);
* ``pool`` (the product path): the client's ``read_dump`` copies the dump into a
  buffer of its ``HostBufferPool`` (memory already touched, back in the pool when the
  sample dies) through the mapping it keeps of that file, and ``spares.hand_back_dump``
  returns the file, which the next write claims and writes over through the server's
  kept mapping (``server_patch/contract/mapped_files.py``).

The two run interleaved, one dump at a time, each in its own staging dir under /dev/shm.
Prints the median ms/token of each side and of the round trip, and last
``pool_vs_fresh=X``: fresh round trip / pool round trip (higher is better).

    python benchmarks/bench_staging_pool.py [--tokens 128] [--rounds 60] [--held 16] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

HIDDEN, STATES = 7168, 4  # Kimi-K2.5's width; 3 aux + the final state


def dump_buffers(tokens: int, seed: int) -> list:
    """A header and the state bytes, as the capture core hands them to ``write_atomic``."""
    from hs_dataset.codecs.safetensors_header import dump_header

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (tokens,), generator=g)
    aux = torch.randn(tokens, STATES - 1, HIDDEN, generator=g).to(torch.bfloat16)
    final = torch.randn(tokens, HIDDEN, generator=g).to(torch.bfloat16)
    entries = [
        ("input_ids", "I64", (tokens,), ids.numel() * 8),
        ("aux_hidden_states", "BF16", tuple(aux.shape), aux.numel() * 2),
        ("final_hidden_state", "BF16", tuple(final.shape), final.numel() * 2),
    ]
    header, order = dump_header(entries, {"rid": "bench"})
    tensors = {"input_ids": ids, "aux_hidden_states": aux, "final_hidden_state": final}
    return [header] + [memoryview(tensors[name].view(torch.uint8).numpy()) for name in order]


def read_fresh(path: str) -> torch.Tensor:
    """The baseline client read: the whole file into new memory."""
    fd = os.open(path, os.O_RDONLY)
    with os.fdopen(fd, "rb", buffering=0) as f:
        data = torch.empty(os.fstat(fd).st_size, dtype=torch.uint8)
        view, got = memoryview(data.numpy()), 0
        while got < len(view):
            got += f.readinto(view[got:])
    return data


def one_dump(stage, buffers, name: str, pool: bool, held: list, keep: int) -> tuple[float, float]:
    """(server write s, client read + hand back or delete s) of one dump."""
    from hs_dataset.capture.sglang.dumps import read_dump
    from hs_dataset.server_patch.contract.spares import hand_back_dump

    if len(held) >= keep:
        held.clear()  # the shard is written: its samples go
    t0 = time.perf_counter()
    stage.write_atomic(name, buffers)
    t1 = time.perf_counter()
    path = os.path.join(stage.path, name)
    if pool:
        held.append(read_dump(path))
        hand_back_dump(path)
    else:
        held.append(read_fresh(path))
        os.unlink(path)
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    from hs_dataset.server_patch.staging import StagingDir

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--held", type=int, default=16, help="samples the client keeps alive, then drops together (a shard's worth)")
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = ap.parse_args()
    buffers = dump_buffers(args.tokens, 0)
    nbytes = sum(memoryview(b).nbytes for b in buffers)
    times: dict[str, list[tuple[float, float]]] = {"fresh": [], "pool": []}
    held: dict[str, list] = {mode: [] for mode in times}
    with tempfile.TemporaryDirectory(prefix="hs-bench-pool-", dir=args.dir) as tmp:
        stages = {mode: StagingDir(os.path.join(tmp, mode)) for mode in times}  # fresh writes must not find the pool's spares
        try:
            for mode, stage in stages.items():  # warm-up: fill what the client holds
                for i in range(args.held + 1):
                    one_dump(stage, buffers, f"warm-{i}.safetensors", mode == "pool", held[mode], args.held)
            for i in range(args.rounds):
                for mode in ("fresh", "pool") if i % 2 else ("pool", "fresh"):
                    times[mode].append(one_dump(stages[mode], buffers, f"{i}.safetensors", mode == "pool", held[mode], args.held))
        finally:
            for stage in stages.values():
                stage.close()
    per_token = lambda xs: statistics.median(xs) * 1e3 / args.tokens  # noqa: E731
    print(
        f"{args.rounds} dumps per mode, {args.tokens} tokens x {STATES} x {HIDDEN} bf16 = {nbytes / 2**20:.1f} MiB each, "
        f"the client dropping them {args.held} at a time; staging in {args.dir or 'the temp dir'}"
    )
    result = {}
    for mode, pairs in times.items():
        server, client = [p[0] for p in pairs], [p[1] for p in pairs]
        result[mode] = per_token([a + b for a, b in pairs])
        print(
            f"  {mode:5}: server write {per_token(server):.4f} ms/token, client read + {'hand back' if mode == 'pool' else 'delete'} "
            f"{per_token(client):.4f}, round trip {result[mode]:.4f}"
        )
    print(f"pool_vs_fresh={result['fresh'] / result['pool']:.2f}")


if __name__ == "__main__":
    main()
