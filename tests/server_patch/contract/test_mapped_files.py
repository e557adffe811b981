"""Dump files are copied through mappings kept from the file's last round, and never give stale bytes.

The server writes a claimed spare through its kept writable mapping and the client reads
every dump through its own read-only one (``server_patch.contract.mapped_files``). These tests
drive the real ``StagingDir``, ``read_dump`` and ``hand_back_dump`` on tmpfs and on the
disk the tests run on: dumps of any sizes going round the pool read back exactly, a
mapping is reused for its file and remapped when the file outgrows it, files deleted
meanwhile are unmapped, the cap never unmaps a mapping in use, a write through a kept
mapping still dates the file for the sweeper, and where a mapping cannot be made (no
fallocate, a closed cache) the plain system calls give the same bytes.
"""

from __future__ import annotations

import errno
import os
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from hs_dataset.capture.sglang import dumps as client
from hs_dataset.capture.sglang.dumps import read_dump
from hs_dataset.codecs.safetensors_header import dump_header
from hs_dataset.server_patch.contract.mapped_files import FileMaps, copy_into, copy_out
from hs_dataset.server_patch.contract.spares import hand_back_dump
from hs_dataset.server_patch.staging import StagingDir


@pytest.fixture(params=["disk", "tmpfs"])
def stage(request, tmp_path):
    if request.param == "tmpfs":
        if not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)):
            pytest.skip("no writable /dev/shm")
        import tempfile

        base = tempfile.mkdtemp(dir="/dev/shm", prefix="hs-test-maps-")
    else:
        base = str(tmp_path)
    staging = StagingDir(os.path.join(base, "stage"))
    yield staging
    staging.close()
    if request.param == "tmpfs":
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def _dump(tokens: int, seed: int) -> tuple[list, dict[str, torch.Tensor]]:
    """A dump as the capture core hands it to ``write_atomic``: its header, then each tensor's bytes."""
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "input_ids": torch.randint(0, 1 << 30, (tokens,), generator=g),
        "aux_hidden_states": torch.randn(tokens, 2, 96, generator=g).to(torch.bfloat16),
        "final_hidden_state": torch.randn(tokens, 96, generator=g).to(torch.bfloat16),
    }
    entries = [
        (n, {torch.int64: "I64", torch.bfloat16: "BF16"}[t.dtype], tuple(t.shape), t.numel() * t.element_size()) for n, t in tensors.items()
    ]
    header, order = dump_header(entries, {"rid": f"r{seed}"})
    return [header] + [memoryview(tensors[n].view(torch.uint8).reshape(-1).numpy()) for n in order], tensors


def _round(stage: StagingDir, name: str, tokens: int, seed: int) -> int:
    """Write a dump, read it back as the client does, check every byte, hand it back; returns its inode."""
    buffers, tensors = _dump(tokens, seed)
    assert stage.write_atomic(name, buffers)
    path = os.path.join(stage.path, name)
    inode = os.stat(path).st_ino
    meta, got = read_dump(path)
    assert meta["rid"] == f"r{seed}"
    for key, want in tensors.items():
        assert torch.equal(got[key], want), key
    hand_back_dump(path)
    return inode


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(min_value=200, max_value=3000), min_size=2, max_size=12))
def test_dumps_of_any_sizes_going_round_the_pool_read_back_exactly(stage, sizes):
    """Spares grow, shrink and come back in any order: every read is the dump just written."""
    inodes = [_round(stage, f"d{i}.safetensors", tokens, seed=i * 7 + tokens) for i, tokens in enumerate(sizes)]
    assert len(set(inodes)) < len(inodes)  # files were reused, so the kept mappings were exercised


def test_a_file_keeps_one_mapping_while_it_goes_round(stage):
    first = _round(stage, "a.safetensors", 1000, seed=1)
    assert len(stage._maps) == 0  # a new file is written with writev: nothing mapped on the server yet
    assert _round(stage, "b.safetensors", 1000, seed=2) == first  # written over the spare, which is mapped for later
    assert len(stage._maps) == 1
    before = stage._maps.mapped_bytes
    assert _round(stage, "c.safetensors", 900, seed=3) == first  # smaller: the same mapping
    assert stage._maps.mapped_bytes == before
    assert _round(stage, "d.safetensors", 3000, seed=4) == first  # outgrew it: remapped, still exact
    assert stage._maps.mapped_bytes > before and len(stage._maps) == 1


def test_from_a_files_second_round_on_both_sides_copy_through_their_kept_mappings(stage, monkeypatch):
    """A file's first round on each side uses write/read (a new mapping's faults cost more); later rounds the mappings."""
    import hs_dataset.server_patch.staging as staging_module

    copies = {"server": 0, "client": 0}

    def counted(side, real):
        def wrapper(*args):
            copies[side] += 1
            return real(*args)

        return wrapper

    monkeypatch.setattr(staging_module, "copy_into", counted("server", staging_module.copy_into))
    monkeypatch.setattr(client, "copy_out", counted("client", client.copy_out))
    inodes = {_round(stage, f"r{i}.safetensors", 1000, seed=i) for i in range(5)}
    assert len(inodes) == 1  # one file, five rounds
    # server: round 1 is a new file (writev), round 2 the spare's first (writev, mapped for later), rounds 3-5 mapped
    assert copies["server"] == 3 * 4  # header + 3 tensors a dump
    # client: round 1 maps it for later (readinto), rounds 2-5 read through the kept mapping
    assert copies["client"] == 4


def test_files_deleted_meanwhile_are_unmapped(tmp_path):
    maps = FileMaps(writable=False)
    paths = []
    for i in range(3):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes([i]) * 8192)
        paths.append(p)
        fd = os.open(p, os.O_RDONLY)
        try:
            with maps.mapped(fd, 8192) as address:
                out = bytearray(8192)
                copy_out(address, 0, memoryview(out))
                assert out == bytes([i]) * 8192
        finally:
            os.close(fd)
    assert len(maps) == 3
    os.unlink(paths[0])
    maps.prune()
    assert len(maps) == 2 and maps.mapped_bytes == 2 * 8192
    maps.close()
    assert len(maps) == 0 and maps.mapped_bytes == 0


def test_a_callers_own_stat_finds_the_same_mapping(tmp_path):
    """``file_stat`` spares FileMaps its own fstat; the entry is the one its own fstat would find."""
    maps = FileMaps(writable=False)
    p = tmp_path / "f"
    p.write_bytes(b"x" * 8192)
    fd = os.open(p, os.O_RDONLY)
    try:
        with maps.mapped(fd, 8192) as first:
            pass
        with maps.mapped(fd, 8192, file_stat=os.fstat(fd)) as again, maps.mapped(fd, 8192) as without:
            assert again == without == first is not None
        assert len(maps) == 1
    finally:
        os.close(fd)
        maps.close()


def test_a_deleted_file_never_answers_for_a_new_one(tmp_path):
    """The cache holds each file open, so a new file cannot take a cached file's inode number."""
    maps = FileMaps(writable=False)
    for i in range(20):
        p = tmp_path / "same-name"
        p.write_bytes(bytes([i]) * 4096)
        fd = os.open(p, os.O_RDONLY)
        try:
            with maps.mapped(fd, 4096) as address:
                out = bytearray(4096)
                copy_out(address, 0, memoryview(out))
        finally:
            os.close(fd)
        assert out == bytes([i]) * 4096
        os.unlink(p)
    maps.close()


def test_the_cap_never_unmaps_a_mapping_in_use(tmp_path):
    maps = FileMaps(writable=True, max_bytes=4096)
    fds = []
    for i in range(3):
        p = tmp_path / f"w{i}"
        p.write_bytes(b"\0" * 4096)
        fds.append(os.open(p, os.O_RDWR))
    try:
        with maps.mapped(fds[0], 4096) as held:
            with maps.mapped(fds[1], 4096) as other:  # over the cap while both are in use: both stay
                copy_into(other, 0, memoryview(b"y" * 4096))
            assert len(maps) == 1  # the idle one went on release
            copy_into(held, 0, memoryview(b"x" * 4096))  # still mapped: no crash, the bytes land
        assert (tmp_path / "w0").read_bytes() == b"x" * 4096
        assert (tmp_path / "w1").read_bytes() == b"y" * 4096
        with maps.mapped(fds[2], 4096):
            pass
        assert len(maps) == 1 and maps.mapped_bytes <= 4096
    finally:
        for fd in fds:
            os.close(fd)
        maps.close()


def test_a_write_through_a_kept_mapping_dates_the_file_for_the_sweeper(stage):
    _round(stage, "a.safetensors", 1000, seed=1)
    _round(stage, "b.safetensors", 1000, seed=2)  # the spare is now mapped
    spare = os.path.join(stage.path, ".spares", os.listdir(os.path.join(stage.path, ".spares"))[0])
    os.utime(spare, (time.time() - 3600, time.time() - 3600))
    buffers, _ = _dump(1000, seed=3)
    assert stage.write_atomic("c.safetensors", buffers)
    path = os.path.join(stage.path, "c.safetensors")
    assert time.time() - os.stat(path).st_mtime < 60
    assert stage.sweep(max_age_s=600) == 0 and os.path.exists(path)


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EINVAL])
def test_without_fallocate_the_spare_is_written_with_writev(stage, monkeypatch, code):
    _round(stage, "a.safetensors", 500, seed=1)

    def refuse(fd, offset, length):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "posix_fallocate", refuse)
    _round(stage, "b.safetensors", 2000, seed=2)  # grows the spare: a hole the write must fill
    assert len(stage._maps) == 0


def test_a_full_file_system_fails_the_write_instead_of_a_fault(stage, monkeypatch):
    _round(stage, "a.safetensors", 500, seed=1)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    buffers, _ = _dump(2000, seed=2)
    with pytest.raises(OSError) as info:
        stage.write_atomic("b.safetensors", buffers)
    assert info.value.errno == errno.ENOSPC
    assert not os.path.exists(os.path.join(stage.path, "b.safetensors"))


def test_the_client_reads_with_readinto_where_nothing_can_be_mapped(stage, monkeypatch):
    closed = FileMaps(writable=False)
    closed.close()
    monkeypatch.setattr(client, "_DUMP_MAPS", closed)
    _round(stage, "a.safetensors", 700, seed=1)
    _round(stage, "b.safetensors", 700, seed=2)


def test_concurrent_writers_and_readers_through_kept_mappings_never_mix_two_dumps(stage):
    """Four server writer threads and three client readers share the two caches; every read is the dump written."""
    import queue
    import threading

    ready: queue.Queue[tuple[str, dict] | None] = queue.Queue()
    errors: list[str] = []

    def write(w: int) -> None:
        for i in range(30):
            buffers, tensors = _dump(200 + 37 * ((w * 5 + i) % 7), seed=1000 * w + i)
            name = f"c{w}-{i}.safetensors"
            assert stage.write_atomic(name, buffers)
            ready.put((name, tensors))

    def read() -> None:
        while (item := ready.get()) is not None:
            name, tensors = item
            path = os.path.join(stage.path, name)
            _meta, got = read_dump(path)
            if any(not torch.equal(got[k], v) for k, v in tensors.items()):
                errors.append(name)
            del got
            hand_back_dump(path)

    writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join()
    for _ in readers:
        ready.put(None)
    for t in readers:
        t.join(timeout=60)
    assert errors == [] and not any(t.is_alive() for t in readers)
    assert len(stage._maps) > 0  # spares went round and were written through kept mappings
