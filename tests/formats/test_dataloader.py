"""The reader is a torch Dataset that survives worker processes (fork and spawn)."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader

from hs_dataset import open_dataset
from hs_dataset.formats import ShardWriter
from tests.fixtures.samples import make_metadata, make_sample


def _first_token_state(item):
    return item["sample_id"], item["final_hidden_state"][0].float().clone()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_with_workers(tmp_path, context):
    samples = [make_sample(f"s{i:02d}", 4 + i) for i in range(10)]
    with ShardWriter(tmp_path, make_metadata(), shard_bytes=3_000) as writer:
        writer.add_many(samples)
    ds = open_dataset(tmp_path)
    assert len(ds.manifest.shards) > 2
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context, collate_fn=_first_token_state)
    got = dict(loader)
    assert sorted(got) == [s.sample_id for s in samples]
    for s in samples:
        assert torch.equal(got[s.sample_id], s.final_hidden_state[0].float())


def test_pickles_only_the_path(tmp_path):
    with ShardWriter(tmp_path, make_metadata()) as writer:
        writer.add(make_sample("a", 3))
    ds = open_dataset(tmp_path)
    ds[0]
    blob = pickle.dumps(ds)
    assert len(blob) < 1000
    assert torch.equal(pickle.loads(blob)[0]["input_ids"], ds[0]["input_ids"])


def test_sequence_protocol(tmp_path):
    with ShardWriter(tmp_path, make_metadata(), shard_bytes=500) as writer:
        writer.add_many(make_sample(f"s{i}", 3) for i in range(5))
    ds = open_dataset(tmp_path)
    assert len(ds) == 5 and ds[-1]["sample_id"] == "s4" and [x["sample_id"] for x in ds[1:3]] == ["s1", "s2"]
    with pytest.raises(IndexError):
        ds[5]
