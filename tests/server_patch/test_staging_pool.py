"""Dumps the client has read go back to the server as spares, and the next dump is written over one.

Spares live in the staging dir's ``.spares/`` pool, which either side uses only if it
is a private directory of ours. A spare is claimed by renaming it to a temporary name,
so two writers never share one; it is used only if it is a plain private file of ours
with a single link, and truncated to the new size. These tests write real files:
reuse keeps the inode, the bytes read back are the new dump's, a hostile pool or
spare (symlink, hard link, foreign mode, directory) is never written through, the
client's pool stays within its caps, and idle spares are swept without a warning.
"""

from __future__ import annotations

import logging
import os
import threading

import pytest
import torch

from hs_dataset.capture.sglang.dumps import read_dump
from hs_dataset.server_patch.contract import dump, spares
from hs_dataset.server_patch.contract.spares import SPARE_DIR, hand_back_dump
from hs_dataset.server_patch.staging import StagingDir

BIG = 1 << 17  # above the size from which a write looks for a spare


def _spares(stage: str) -> list[str]:
    pool = os.path.join(stage, SPARE_DIR)
    return sorted(os.listdir(pool)) if os.path.isdir(pool) else []


def _pool(stage) -> str:
    path = os.path.join(stage.path, SPARE_DIR)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _payload(nbytes: int, seed: int) -> bytes:
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)).numpy().tobytes()


@pytest.fixture
def stage(tmp_path) -> StagingDir:
    staging = StagingDir(str(tmp_path / "stage"))
    yield staging
    staging.close()


@pytest.mark.parametrize("second", [BIG // 2, BIG, 3 * BIG])
def test_next_dump_is_written_over_the_handed_back_one(stage, second):
    first = _payload(BIG, 1)
    assert stage.write_atomic("a.safetensors", [first[:100], first[100:]])
    path = os.path.join(stage.path, "a.safetensors")
    inode = os.stat(path).st_ino
    hand_back_dump(path)
    assert not os.path.exists(path)
    assert len(_spares(stage.path)) == 1

    data = _payload(second, 2)
    assert stage.write_atomic("b.safetensors", [data[:7], memoryview(data)[7:]])
    written = os.path.join(stage.path, "b.safetensors")
    st = os.stat(written)
    assert st.st_ino == inode and st.st_nlink == 1 and st.st_size == second
    with open(written, "rb") as f:
        assert f.read() == data
    assert _spares(stage.path) == []
    assert [n for n in os.listdir(stage.path) if n.startswith(".")] == [SPARE_DIR]  # no temporary left behind


def test_small_files_do_not_take_a_spare(stage):
    assert stage.write_atomic("a.safetensors", _payload(BIG, 1))
    hand_back_dump(os.path.join(stage.path, "a.safetensors"))
    assert stage.write_refusal("hs-r1-1-5", "staging full")
    assert len(_spares(stage.path)) == 1


def test_the_spare_closest_in_size_is_taken(stage):
    for name, size in (("a.safetensors", BIG), ("b.safetensors", 4 * BIG)):
        assert stage.write_atomic(name, _payload(size, size))
    for name in ("a.safetensors", "b.safetensors"):
        hand_back_dump(os.path.join(stage.path, name))
    assert stage.write_atomic("c.safetensors", _payload(4 * BIG - 10, 3))
    (left,) = _spares(stage.path)
    assert os.stat(os.path.join(stage.path, SPARE_DIR, left)).st_size == BIG


def test_spare_names_carry_their_sizes_and_older_names_are_weighed_by_stat(stage):
    for name, size in (("a.safetensors", BIG), ("b.safetensors", 3 * BIG)):
        assert stage.write_atomic(name, _payload(size, size))
    for name in ("a.safetensors", "b.safetensors"):
        hand_back_dump(os.path.join(stage.path, name))
    pool = _pool(stage)
    with os.scandir(pool) as it:
        weighed = {e.name: spares.spare_size(e) for e in it}
    assert sorted(weighed.values()) == [BIG, 3 * BIG]
    assert all(os.stat(os.path.join(pool, n)).st_size == size and n == f"{size:x}-{n.partition('-')[2]}" for n, size in weighed.items())

    for n in list(weighed):  # an older client's names: random hex only, so the server must stat them
        os.rename(os.path.join(pool, n), os.path.join(pool, os.urandom(16).hex()))
    assert stage.write_atomic("c.safetensors", _payload(3 * BIG - 10, 3))
    (left,) = _spares(stage.path)
    assert os.stat(os.path.join(pool, left)).st_size == BIG  # the closest one was still the one taken


def test_a_spare_whose_name_lies_about_its_size_is_written_exactly(stage):
    """The name is a hint for choosing; the claimed file is sized by the server itself."""
    assert stage.write_atomic("a.safetensors", _payload(4 * BIG, 1))
    hand_back_dump(os.path.join(stage.path, "a.safetensors"))
    pool = _pool(stage)
    (spare,) = _spares(stage.path)
    os.rename(os.path.join(pool, spare), os.path.join(pool, spares.spare_name(BIG)))  # claims to be a quarter of its size
    data = _payload(BIG + 5, 2)
    assert stage.write_atomic("b.safetensors", data)
    with open(os.path.join(stage.path, "b.safetensors"), "rb") as f:
        assert f.read() == data
    assert _spares(stage.path) == []


def _outside(tmp_path) -> str:
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious" * 100)
    os.chmod(victim, 0o600)
    return str(victim)


def _plant_symlink(stage, victim):
    os.symlink(victim, os.path.join(_pool(stage), "link"))


def _plant_hardlink(stage, victim):
    os.link(victim, os.path.join(_pool(stage), "hard"))


def _plant_shared_mode(stage, victim):
    path = os.path.join(_pool(stage), "shared")
    with open(path, "wb") as f:
        f.write(b"x" * BIG)
    os.chmod(path, 0o644)


def _plant_directory(stage, victim):
    os.mkdir(os.path.join(_pool(stage), "dir"))


def _pool_is_a_symlink(stage, victim):
    outside = os.path.join(os.path.dirname(victim), "outside-pool")
    os.mkdir(outside, 0o700)
    os.link(victim, os.path.join(outside, "spare"))
    os.symlink(outside, os.path.join(stage.path, SPARE_DIR))


def _pool_is_shared(stage, victim):
    os.link(victim, os.path.join(_pool(stage), "spare"))
    os.chmod(os.path.join(stage.path, SPARE_DIR), 0o755)


@pytest.mark.parametrize(
    "plant", [_plant_symlink, _plant_hardlink, _plant_shared_mode, _plant_directory, _pool_is_a_symlink, _pool_is_shared]
)
def test_hostile_spares_are_never_written_through(stage, tmp_path, plant):
    victim = _outside(tmp_path)
    before = open(victim, "rb").read()
    plant(stage, victim)
    data = _payload(BIG, 5)
    assert stage.write_atomic("a.safetensors", data)
    assert open(victim, "rb").read() == before
    written = os.path.join(stage.path, "a.safetensors")
    assert os.stat(written, follow_symlinks=False).st_nlink == 1
    with open(written, "rb") as f:
        assert f.read() == data
    hand_back_dump(written)  # a pool that is not a private directory of ours gets nothing: the dump is deleted
    if plant in (_pool_is_a_symlink, _pool_is_shared):
        assert not os.path.exists(written)
        assert sorted(os.listdir(os.path.join(stage.path, SPARE_DIR))) == ["spare"]
    assert open(victim, "rb").read() == before


def test_the_client_pool_stays_within_its_caps(stage, monkeypatch):
    monkeypatch.setattr(spares, "SPARE_MAX_FILES", 3)
    for i in range(5):
        assert stage.write_refusal(f"hs-r1-{i}-5", "x")  # tiny files: every one is new
        hand_back_dump(os.path.join(stage.path, f"hs-r1-{i}-5" + dump.REFUSED_SUFFIX))
    assert len(_spares(stage.path)) == 3

    for name in _spares(stage.path):
        os.unlink(os.path.join(stage.path, SPARE_DIR, name))
    monkeypatch.setattr(spares, "SPARE_MAX_BYTES", 2 * BIG)
    for i in range(3):
        assert stage.write_atomic(f"d{i}.safetensors", _payload(BIG, i))
    for i in range(3):
        hand_back_dump(os.path.join(stage.path, f"d{i}.safetensors"))
    assert len(_spares(stage.path)) == 2
    assert not any(n.endswith(".safetensors") for n in os.listdir(stage.path))
    hand_back_dump(os.path.join(stage.path, "gone.safetensors"))  # already swept: nothing to do


def test_spares_are_not_staging_usage_and_idle_ones_are_swept_quietly(stage, caplog):
    assert stage.write_atomic("a.safetensors", _payload(BIG, 1))
    assert stage.usage() == (BIG, 1)
    hand_back_dump(os.path.join(stage.path, "a.safetensors"))
    assert stage.usage() == (0, 0)
    with caplog.at_level(logging.WARNING, logger="hs_dataset.server_patch"):
        assert stage.sweep(3600, spare_max_age_s=3600) == 0
        assert len(_spares(stage.path)) == 1  # fresh: kept for the next dump
        stage.sweep(3600, spare_max_age_s=0)
    assert _spares(stage.path) == []
    assert not caplog.records


def test_concurrent_writers_and_hand_backs_never_mix_two_dumps(stage):
    """Four writers and a client handing every dump back: each dump reads back as written."""
    errors: list[str] = []
    done = threading.Event()
    written: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        for i in range(40):
            data = _payload(BIG + 4096 * ((w * 7 + i) % 5), 100 * w + i)
            name = f"w{w}-{i}.safetensors"
            assert stage.write_atomic(name, [data[:64], data[64:]])
            with lock:
                written.append((name, data))

    def client() -> None:
        seen = 0
        while not (done.is_set() and seen == 160):
            with lock:
                batch, written[:] = list(written), []
            for name, data in batch:
                path = os.path.join(stage.path, name)
                with open(path, "rb") as f:
                    if f.read() != data:
                        errors.append(name)
                hand_back_dump(path)
                seen += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    reader = threading.Thread(target=client)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join(timeout=60)
    assert not reader.is_alive()
    assert errors == []
    assert len(_spares(stage.path)) <= spares.SPARE_MAX_FILES


def test_client_reads_a_dump_written_over_a_spare(stage):
    """The client's reader sees exactly the new dump's tensors (safetensors file over an old, larger one)."""
    from safetensors.torch import save

    old = save({"x": torch.arange(BIG, dtype=torch.int64)})
    assert stage.write_atomic("hs-r1-0-5.safetensors", old)
    hand_back_dump(os.path.join(stage.path, "hs-r1-0-5.safetensors"))
    tensors = {"input_ids": torch.arange(5), "aux_hidden_states": torch.randn(5, 3, 4096)}
    assert stage.write_atomic("hs-r1-1-5.safetensors", save(tensors, metadata={"rid": "hs-r1-1-5"}))
    meta, got = read_dump(os.path.join(stage.path, "hs-r1-1-5.safetensors"))
    assert meta == {"rid": "hs-r1-1-5"}
    assert set(got) == set(tensors) and all(torch.equal(got[k], v) for k, v in tensors.items())


def test_the_budget_and_the_pinned_pool_keep_their_high_water_marks():
    """What a run shows to prove its bounds held: the most ever reserved, and the most of the slab ever handed out."""
    from hs_dataset.server_patch.budget import StagingBudget
    from hs_dataset.server_patch.copier import PinnedPool

    budget = StagingBudget(100, 10, lambda: (0, 0))
    assert budget.reserve(60, 0) and not budget.reserve(50, 0) and budget.peak_bytes == 60
    budget.release(60)
    assert budget.reserve(30, 0) and budget.peak_bytes == 60
    pool = PinnedPool(8 << 20, granularity=1 << 20, pin_memory=False)
    a, b = pool.acquire(3 << 20, 0), pool.acquire(4 << 20, 0)
    assert pool.acquire(2 << 20, 0) is None and pool.peak_bytes == 7 << 20
    pool.release(a)
    pool.release(b)
    c = pool.acquire(1 << 20, 0)
    assert pool.peak_bytes == 7 << 20 and pool.free_bytes() == 7 << 20
    pool.release(c)
