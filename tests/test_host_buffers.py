"""Host buffer pools: the client's read buffers come back only when no tensor over them is left, and
the shard writer keeps room for them in their pool; the server's pinned pool picks any free buffer."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

from hs_dataset.host_buffers import HostBufferPool

MIB = 1 << 20


def test_a_lease_is_exactly_the_size_asked_and_writable():
    pool = HostBufferPool()
    t = pool.lease(3 * MIB + 5)
    assert t.dtype == torch.uint8 and t.shape == (3 * MIB + 5,)
    t.fill_(7)
    assert int(t.sum()) == 7 * (3 * MIB + 5)


def test_memory_is_reused_only_after_every_view_is_gone():
    pool = HostBufferPool()
    first = pool.lease(2 * MIB)
    ptr = first.data_ptr()
    aux = first[1024:].view(torch.bfloat16)  # what read_dump hands out: views of slices
    del first
    gc.collect()
    other = pool.lease(2 * MIB)
    assert other.data_ptr() != ptr  # the view still holds the buffer
    aux.fill_(1.0)
    del aux
    gc.collect()
    again = pool.lease(2 * MIB)
    assert again.data_ptr() == ptr
    assert pool.stats["reused"] == 1 and pool.stats["allocated"] == 2


def test_the_smallest_idle_buffer_that_fits_is_taken():
    pool = HostBufferPool()
    big, small = pool.lease(8 * MIB), pool.lease(2 * MIB)
    big_ptr, small_ptr = big.data_ptr(), small.data_ptr()
    del big, small
    gc.collect()
    assert pool.lease(MIB + 1).data_ptr() == small_ptr
    assert pool.lease(3 * MIB).data_ptr() == big_ptr


def test_idle_memory_is_capped_and_small_reads_bypass_the_pool():
    pool = HostBufferPool(max_idle_bytes=3 * MIB)
    leases = [pool.lease(2 * MIB) for _ in range(3)]
    del leases
    gc.collect()
    assert pool.idle_bytes == 2 * MIB  # the second and third did not fit under the cap
    tiny = pool.lease(100)
    assert tiny.shape == (100,) and pool.stats["leased"] == 3


def test_concurrent_leases_never_share_memory():
    pool = HostBufferPool()
    errors: list[str] = []

    def worker(w: int) -> None:
        for i in range(50):
            t = pool.lease(MIB + 4096 * (i % 3))
            t.fill_(w)
            if int(t.min()) != w or int(t.max()) != w:
                errors.append(f"{w}/{i}")

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pool.stats["reused"] > 0


def test_the_servers_pool_hands_out_ranges_of_one_slab_best_fit_and_merges_them_back():
    """One slab, allocated once; the best-fitting free range is taken; released neighbours merge (no fragmentation)."""
    from hs_dataset.server_patch.copier import PinnedPool

    pool = PinnedPool(16 * MIB, granularity=MIB, pin_memory=False)
    a, b, c = (pool.acquire(n * MIB, timeout=0) for n in (4, 2, 6))
    slab = a.data_ptr()
    assert (b.data_ptr() - slab, c.data_ptr() - slab) == (4 * MIB, 6 * MIB)
    assert pool.acquire(5 * MIB, timeout=0) is None  # 4 MiB left
    pool.release(b)  # free: 2 MiB at 4, 4 MiB at 12
    d = pool.acquire(MIB + 1, timeout=0)  # rounded to 2 MiB: the hole at 4 fits best
    assert d.data_ptr() - slab == 4 * MIB
    pool.release(a)
    pool.release(c)  # 6-12 merges with 12-16
    assert pool.free_bytes() == 14 * MIB
    merged = pool.acquire(10 * MIB, timeout=0)
    assert merged is not None and merged.data_ptr() - slab == 6 * MIB
    pool.release(d)
    pool.release(merged)
    everything = pool.acquire(16 * MIB, timeout=0)
    assert everything.data_ptr() == slab  # everything merged back into one range
    pool.release(everything)
    with pytest.raises(ValueError, match="twice"):
        pool.release(d)


def test_the_servers_pool_waits_for_a_release_then_gives_up_at_its_timeout():
    from hs_dataset.server_patch.copier import PinnedPool

    pool = PinnedPool(4 * MIB, granularity=MIB, pin_memory=False)
    held = pool.acquire(4 * MIB, timeout=0)
    started = time.monotonic()
    assert pool.acquire(MIB, timeout=0.2) is None and time.monotonic() - started >= 0.2
    threading.Timer(0.1, pool.release, args=(held,)).start()
    assert pool.acquire(4 * MIB, timeout=5) is not None
    assert pool.acquire(5 * MIB, timeout=5) is None  # more than the whole pool: refused at once


def _leased_sample(pool: HostBufferPool, sid: str, t: int = 64, k: int = 3, h: int = 4096, seed: int = 0):
    """A sample whose states are views of one lease, as read_dump hands them out; and a copy of its states."""
    from hs_dataset.sample import CapturedSample

    raw = pool.lease(t * (k + 1) * h * 2)
    aux = raw[: t * k * h * 2].view(torch.bfloat16).view(t, k, h)
    final = raw[t * k * h * 2 :].view(torch.bfloat16).view(t, h)
    g = torch.Generator().manual_seed(seed)
    aux.copy_(torch.randn(t, k, h, generator=g))
    final.copy_(torch.randn(t, h, generator=g))
    return CapturedSample(sid, torch.arange(t), torch.ones(t, dtype=torch.bool), aux, final), (aux.clone(), final.clone())


def test_the_writer_stores_leased_states_without_a_copy_and_their_buffers_come_back(tmp_path):
    """No copy on the adding thread; once the shard is on disk the client's buffer is idle in its pool, for the next read."""
    from hs_dataset.formats import ShardWriter, open_dataset

    client = HostBufferPool(max_idle_bytes=0)  # no room of its own: what stays idle is the writer's hold
    sample, expected = _leased_sample(client, "s0")
    ptr = sample.aux_hidden_states.data_ptr()
    metadata = {"aux_layer_ids": [1, 2, 3], "hidden_size": 4096, "dtype": "bfloat16"}
    writer = ShardWriter(tmp_path / "ds", metadata, shard_bytes=8 * MIB, writer_threads=2)
    writer.add(sample)
    held_ptr = writer._buffer[0].aux.data_ptr()
    assert held_ptr == ptr  # held as it was read
    assert client.max_idle_bytes == 3 * 8 * MIB  # room for (threads + 1) shards while the writer is open
    del sample
    gc.collect()
    assert client.idle_bytes == 0  # still in the writer's buffer
    writer.flush()
    writer._flusher.wait_written()
    # the shard is on disk: back in the pool once the writer thread has let go of the batch
    # (its work item outlives the future's result by a moment)
    deadline = time.monotonic() + 10
    while client.idle_bytes == 0 and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert client.idle_bytes > 0
    reused = client.stats["reused"]
    again = client.lease(64 * 4 * 4096 * 2)
    assert again.data_ptr() == ptr and client.stats["reused"] == reused + 1
    del again
    writer.close()
    gc.collect()
    assert client.max_idle_bytes == 0 and client.idle_bytes == 0  # the room is given back, and trimmed
    (stored,) = list(open_dataset(tmp_path / "ds"))
    assert torch.equal(stored["aux_hidden_states"], expected[0]) and torch.equal(stored["final_hidden_state"], expected[1])


def test_room_is_held_once_per_pool_and_released_once(tmp_path):
    from hs_dataset.formats import ShardWriter

    client = HostBufferPool(max_idle_bytes=5)
    metadata = {"aux_layer_ids": [1, 2, 3], "hidden_size": 4096, "dtype": "bfloat16"}
    with ShardWriter(tmp_path / "ds", metadata, shard_bytes=1 << 30, writer_threads=1) as writer:
        for i in range(3):
            writer.add(_leased_sample(client, f"s{i}", seed=i)[0])
        assert client.max_idle_bytes == 5 + 2 * (1 << 30)
    writer.close()  # a second close changes nothing
    assert client.max_idle_bytes == 5


def test_a_dropped_writer_gives_the_room_back(tmp_path):
    from hs_dataset.formats import ShardWriter

    client = HostBufferPool(max_idle_bytes=0)
    metadata = {"aux_layer_ids": [1, 2, 3], "hidden_size": 4096, "dtype": "bfloat16"}
    writer = ShardWriter(tmp_path / "ds", metadata, shard_bytes=1 << 30, writer_threads=1)
    writer.add(_leased_sample(client, "s0")[0])
    assert client.max_idle_bytes > 0
    writer.abort()
    assert client.max_idle_bytes == 0


def test_held_room_trims_back_to_the_cap():
    pool = HostBufferPool(max_idle_bytes=2 * MIB)
    release = pool.hold_room(4 * MIB)
    leases = [pool.lease(2 * MIB) for _ in range(3)]
    del leases
    gc.collect()
    assert pool.idle_bytes == 6 * MIB
    release()
    assert pool.idle_bytes == 2 * MIB and pool.max_idle_bytes == 2 * MIB
    release()
    assert pool.max_idle_bytes == 2 * MIB


def test_a_lease_is_known_until_its_memory_comes_back():
    from hs_dataset.host_buffers import lease_pool

    pool = HostBufferPool()
    lease = pool.lease(3 * MIB)
    tail = lease[2 * MIB :].view(torch.int32)
    assert lease_pool(lease) is pool and lease_pool(tail) is pool
    assert lease_pool(torch.empty(3 * MIB, dtype=torch.uint8)) is None
    del lease, tail
    gc.collect()
    assert lease_pool(pool.lease(10)) is None  # below min_bytes: plain memory, not a lease


def test_the_writer_keeps_plain_tensors_as_they_are(tmp_path):
    """A caller's own tensors are stored as they are, and hold no pool's room."""
    from hs_dataset.formats import ShardWriter
    from hs_dataset.sample import CapturedSample

    t, h = 8, 1024
    aux, final = torch.randn(t, 3, h).to(torch.bfloat16), torch.randn(t, h).to(torch.bfloat16)
    metadata = {"aux_layer_ids": [1, 2, 3], "hidden_size": h, "dtype": "bfloat16"}
    with ShardWriter(tmp_path / "ds", metadata) as writer:
        writer.add(CapturedSample("s0", torch.arange(t), torch.ones(t, dtype=torch.bool), aux, final))
        assert writer._buffer[0].aux.data_ptr() == aux.data_ptr()
