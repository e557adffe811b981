"""Host buffer pools: the client's read buffers come back only when no tensor over them is left; the server's pinned pool picks any free buffer."""

from __future__ import annotations

import gc
import threading

import torch

from hs_dataset.capture.sglang.read_buffers import HostBufferPool

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
