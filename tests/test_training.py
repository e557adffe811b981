"""hs_dataset.training: the EAGLE-3 shift, packing, collation, workers and distributed sharding."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler

from hs_dataset.formats import ShardWriter
from hs_dataset.training import (
    Eagle3Dataset,
    PackedCollator,
    PackingBatchSampler,
    PackingOptions,
    SeededShuffleSampler,
    make_loader,
    shift_sample,
)
from tests.fixtures.samples import make_metadata, make_sample

K, H = 3, 16


def _write(root, lengths, shard_bytes=4_000):
    samples = [make_sample(f"s{i:03d}", n, k=K, h=H) for i, n in enumerate(lengths)]
    with ShardWriter(root, make_metadata(k=K, h=H), shard_bytes=shard_bytes) as writer:
        writer.add_many(samples)
    return samples


def _hand_shift(s, alignment="next"):
    """The convention written out token by token (the module doc's table)."""
    t = s.input_ids.shape[0]
    rows = []
    for j in range(t - 1):
        rows.append(
            {
                "input_ids": s.input_ids[j + 1],
                "aux": s.aux_hidden_states[j],
                "final": s.final_hidden_state[j + 1] if alignment == "next" else s.final_hidden_state[j],
                "loss_mask": s.loss_mask[j + 1],
                "position": j + 1,
            }
        )
    return rows


@pytest.mark.parametrize("alignment", ["next", "current"])
def test_shift_matches_hand_computation(tmp_path, alignment):
    samples = _write(tmp_path, [5, 2, 9])
    ds = Eagle3Dataset(tmp_path, final_alignment=alignment)
    assert len(ds) == 3 and ds.lengths == [4, 1, 8]
    for i, s in enumerate(samples):
        item = ds[i]
        rows = _hand_shift(s, alignment)
        assert item["sample_id"] == s.sample_id
        assert item["input_ids"].shape == (len(rows),)
        assert item["aux_hidden_states"].shape == (len(rows), K, H)
        assert item["final_hidden_state"].shape == (len(rows), H)
        for j, row in enumerate(rows):
            assert int(item["input_ids"][j]) == int(row["input_ids"])
            assert torch.equal(item["aux_hidden_states"][j], row["aux"])
            assert torch.equal(item["final_hidden_state"][j], row["final"])
            assert bool(item["loss_mask"][j]) == bool(row["loss_mask"])


def test_items_are_views_of_the_mapped_shard(tmp_path):
    _write(tmp_path, [6, 7])
    ds = Eagle3Dataset(tmp_path)
    item = ds[1]
    reader = ds.data.shard(0)
    for key in ("input_ids", "aux_hidden_states", "final_hidden_state", "loss_mask"):
        assert item[key].untyped_storage().data_ptr() == reader.tensor(key).untyped_storage().data_ptr(), key
    # shift_sample on a plain dict is the same function
    assert torch.equal(shift_sample(ds.data[1])["input_ids"], item["input_ids"])


def test_collate_packs_with_boundaries_and_padding(tmp_path):
    samples = _write(tmp_path, [5, 3, 7])
    ds = Eagle3Dataset(tmp_path)
    batch = PackedCollator(32, pad_to_multiple_of=8)([ds[0], ds[1], ds[2]])
    assert batch["num_tokens"] == 4 + 2 + 6
    assert batch["input_ids"].shape == (1, 16)
    assert batch["aux_hidden_states"].shape == (1, 16, K, H)
    assert batch["final_hidden_state"].shape == (1, 16, H)
    assert batch["cu_seqlens"].tolist() == [0, 4, 6, 12] and batch["cu_seqlens"].dtype == torch.int32
    assert batch["lengths"].tolist() == [4, 2, 6] and batch["max_seqlen"] == 6
    assert batch["position_ids"][0].tolist() == [1, 2, 3, 4, 1, 2, 1, 2, 3, 4, 5, 6, 0, 0, 0, 0]
    assert batch["document_ids"][0].tolist() == [0] * 4 + [1] * 2 + [2] * 6 + [-1] * 4
    assert batch["sample_ids"] == ["s000", "s001", "s002"]
    pos = 0
    for s in samples:
        for row in _hand_shift(s):
            assert int(batch["input_ids"][0, pos]) == int(row["input_ids"])
            assert torch.equal(batch["aux_hidden_states"][0, pos], row["aux"])
            assert torch.equal(batch["final_hidden_state"][0, pos], row["final"])
            assert bool(batch["loss_mask"][0, pos]) == bool(row["loss_mask"])
            pos += 1
    assert not batch["loss_mask"][0, 12:].any()
    assert not batch["aux_hidden_states"][0, 12:].any() and not batch["input_ids"][0, 12:].any()
    # the one copy: the batch owns its memory
    assert (
        batch["aux_hidden_states"].untyped_storage().data_ptr() != ds.data.shard(0).tensor("aux_hidden_states").untyped_storage().data_ptr()
    )


def test_packing_respects_the_budget_and_never_splits(tmp_path):
    g = torch.Generator().manual_seed(0)
    lengths = [int(n) for n in torch.randint(1, 30, (40,), generator=g)] + [1, 55]  # a 1-token sample, an oversize one
    _write(tmp_path, lengths)
    ds = Eagle3Dataset(tmp_path)
    budget = 24
    packs = list(PackingBatchSampler(SeededShuffleSampler(len(ds), seed=1), ds.lengths, budget))
    flat = [i for p in packs for i in p]
    assert sorted(flat) == [i for i, n in enumerate(ds.lengths) if n > 0]  # every sample once, the 1-token one skipped
    collate = PackedCollator(budget)
    oversize = len(lengths) - 1
    for pack in packs:
        assert sum(min(ds.lengths[i], budget) for i in pack) <= budget
        if oversize in pack:
            assert pack == [oversize]  # alone in its pack
        batch = collate([ds[i] for i in pack])
        assert batch["num_tokens"] <= budget
        assert batch["lengths"].tolist() == [min(ds.lengths[i], budget) for i in pack]  # whole samples (oversize: its first 24)
    trunc = collate([ds[oversize]])
    assert torch.equal(trunc["input_ids"][0], ds[oversize]["input_ids"][:budget])
    assert len(packs) == len(PackingBatchSampler(SeededShuffleSampler(len(ds), seed=1), ds.lengths, budget))
    dropped = [i for p in PackingBatchSampler(SequentialSampler(ds), ds.lengths, budget, oversize="drop") for i in p]
    assert oversize not in dropped
    with pytest.raises(ValueError, match="more than max_tokens"):
        list(PackingBatchSampler(SequentialSampler(ds), ds.lengths, budget, oversize="error"))


def _as_lists(batch):
    return {
        k: (
            v.tolist()
            if isinstance(v, torch.Tensor) and v.dtype != torch.bfloat16
            else v.float().tolist()
            if isinstance(v, torch.Tensor)
            else v
        )
        for k, v in batch.items()
    }


def test_workers_give_the_same_batches(tmp_path):
    _write(tmp_path, [int(n) for n in torch.randint(2, 25, (30,), generator=torch.Generator().manual_seed(2))], shard_bytes=2_500)
    ds = Eagle3Dataset(tmp_path)
    assert len(ds.data.manifest.shards) > 3

    def loader(workers):
        sampler = PackingBatchSampler(SeededShuffleSampler(len(ds), seed=7), ds.lengths, 40)
        return DataLoader(
            ds,
            batch_sampler=sampler,
            collate_fn=PackedCollator(40),
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
        )

    serial = [_as_lists(b) for b in loader(0)]
    parallel = [_as_lists(b) for b in loader(2)]
    assert len(serial) > 5
    assert serial == parallel


def test_distributed_sampler_covers_every_sample_once(tmp_path):
    _write(tmp_path, [int(n) for n in torch.randint(2, 20, (26,), generator=torch.Generator().manual_seed(3))])
    ds = Eagle3Dataset(tmp_path)
    per_rank = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=5)
        batches = PackingBatchSampler(sampler, ds.lengths, 30)
        batches.set_epoch(1)
        first = [list(p) for p in batches]
        assert first == [list(p) for p in batches]  # deterministic
        loader = DataLoader(ds, batch_sampler=batches, collate_fn=PackedCollator(30))
        ids = [sid for batch in loader for sid in batch["sample_ids"]]
        assert ids == [f"s{i:03d}" for p in first for i in p]
        per_rank.append(ids)
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == [f"s{i:03d}" for i in range(26)]


def test_make_loader(tmp_path):
    _write(tmp_path, [4, 9, 3, 12, 6, 5])
    seen = []
    for rank in range(2):
        loader = make_loader(tmp_path, 16, rank=rank, world_size=2, seed=0, packing=PackingOptions(pad_to_max=True))
        loader.batch_sampler.set_epoch(3)
        for batch in loader:
            assert batch["input_ids"].shape == (1, 16) and batch["num_tokens"] <= 16
            seen.extend(batch["sample_ids"])
    assert sorted(seen) == [f"s{i:03d}" for i in range(6)]


def test_packing_options_are_typed_and_named(tmp_path):
    _write(tmp_path, [4, 9])
    with pytest.raises(TypeError, match=r"pad_to_max is a packing option; pass packing=PackingOptions"):
        make_loader(tmp_path, 16, pad_to_max=True)
    with pytest.raises(ValueError, match="oversize must be one of"):
        PackingOptions(oversize="split")
    with pytest.raises(TypeError):
        PackingOptions(padding=8)  # unknown keys are refused
