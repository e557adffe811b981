"""Host buffer pools: the client's read buffers come back only when no tensor over them is left; the server's pinned pool picks any free buffer."""

from __future__ import annotations

import gc
import threading

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
    aux = first[1024:].view(torch.bfloat16)  # what _read_dump hands out: views of slices
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


def test_the_servers_pinned_pool_hands_out_a_later_free_buffer():
    """The server's pinned pool picks among buffers of different sizes (it once compared tensors with ==)."""
    from hs_dataset.server_patch.copier import PinnedPool

    pool = PinnedPool(64 * MIB)
    small, big, mid = (torch.zeros(n, dtype=torch.uint8) for n in (2 * MIB, 8 * MIB, 4 * MIB))
    for buf in (small, big, mid):
        pool.release(buf)  # free buffers, as after three dumps
    assert pool.acquire(3 * MIB, timeout=0) is mid
    assert pool.acquire(5 * MIB, timeout=0) is big
    assert pool.acquire(MIB, timeout=0) is small


def test_the_writer_lets_go_of_a_sample_as_soon_as_it_is_added(tmp_path):
    """The client's read buffer is back in its pool before the shard is written, and the shard holds the states."""
    from hs_dataset.formats import ShardWriter, open_dataset
    from hs_dataset.sample import CapturedSample

    client = HostBufferPool()
    t, k, h = 64, 3, 4096
    raw = client.lease(t * (k + 1) * h * 2)  # one dump's states, as _read_dump leases them
    aux = raw[: t * k * h * 2].view(torch.bfloat16).view(t, k, h)
    final = raw[t * k * h * 2 :].view(torch.bfloat16).view(t, h)
    g = torch.Generator().manual_seed(0)
    aux.copy_(torch.randn(t, k, h, generator=g))
    final.copy_(torch.randn(t, h, generator=g))
    expected = (aux.clone(), final.clone())
    del raw
    sample = CapturedSample("s0", torch.arange(t), torch.ones(t, dtype=torch.bool), aux, final)
    metadata = {"aux_layer_ids": [1, 2, 3], "hidden_size": h, "dtype": "bfloat16"}
    with ShardWriter(tmp_path / "ds", metadata, shard_bytes=1 << 30) as writer:
        writer.add(sample)
        del sample, aux, final
        gc.collect()
        assert client.idle_bytes > 0  # returned while the shard is still only in the writer's buffer
    (stored,) = list(open_dataset(tmp_path / "ds"))
    assert torch.equal(stored["aux_hidden_states"], expected[0]) and torch.equal(stored["final_hidden_state"], expected[1])


def test_a_lease_is_known_until_its_memory_comes_back():
    from hs_dataset.host_buffers import in_a_lease

    pool = HostBufferPool()
    lease = pool.lease(3 * MIB)
    tail = lease[2 * MIB :].view(torch.int32)
    assert in_a_lease(lease) and in_a_lease(tail)
    assert not in_a_lease(torch.empty(3 * MIB, dtype=torch.uint8))
    del lease, tail
    gc.collect()
    assert not in_a_lease(pool.lease(10))  # below min_bytes: plain memory, not a lease


def test_the_writer_keeps_plain_tensors_as_they_are(tmp_path):
    """Only leased memory is copied: a caller's own tensors are stored without the extra pass."""
    from hs_dataset.formats import ShardWriter
    from hs_dataset.sample import CapturedSample

    t, h = 8, 1024
    aux, final = torch.randn(t, 3, h).to(torch.bfloat16), torch.randn(t, h).to(torch.bfloat16)
    metadata = {"aux_layer_ids": [1, 2, 3], "hidden_size": h, "dtype": "bfloat16"}
    with ShardWriter(tmp_path / "ds", metadata) as writer:
        writer.add(CapturedSample("s0", torch.arange(t), torch.ones(t, dtype=torch.bool), aux, final))
        assert writer._buffer[0].aux.data_ptr() == aux.data_ptr()
