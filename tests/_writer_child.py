"""Child process for crash tests: writes samples 0..N-1 (deterministic) into a dataset, resuming."""

import sys

from hs_dataset.formats import ShardWriter

from conftest import make_metadata, make_sample

root, count, shard_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with ShardWriter(root, make_metadata(), shard_bytes=shard_bytes, writer_threads=2) as writer:
    print("ready", flush=True)
    for i in range(count):
        if not writer.contains(f"sample-{i:04d}"):
            writer.add(make_sample(f"sample-{i:04d}", 3 + (i * 7) % 40))
print("done", flush=True)
