"""Reading a dataset from a real S3-compatible server (moto's, on 127.0.0.1) through the bounded local cache.

A dataset written locally is uploaded (manifest last), then read back with
``hs_dataset.open_dataset("s3://...")``: the same bytes as the local copy, the cache never
holding more than its bound on disk (measured with ``stat`` after every sample), the
next shards prefetched, a replaced object refused on download, ``hs-dataset verify s3://``
passing on the good copy and failing on the damaged one, and the training view reading
through it (pickled, as DataLoader workers get it).
"""

from __future__ import annotations

import pickle
import time

import pytest
import torch

import hs_dataset
from hs_dataset.cli.main import main as cli_main
from hs_dataset.errors import IntegrityError, UsageError
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.remote.cache import disk_usage
from hs_dataset.remote.location import open_location
from hs_dataset.remote.publish import publish_dataset
from hs_dataset.training import Eagle3Dataset
from tests.fixtures.samples import make_metadata, make_sample

H, K = 32, 3
SHARD_BYTES = 30_000


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("HS_DATASET_CACHE_DIR", str(tmp_path / "default-cache"))


@pytest.fixture
def uploaded(s3_bucket, tmp_path):
    """(url, local copy): 30 samples in ~10 shards, uploaded."""
    local = tmp_path / "local"
    with ShardWriter(local, make_metadata(k=K, h=H), final_norm_weight=torch.ones(H), shard_bytes=SHARD_BYTES) as writer:
        for i in range(30):
            writer.add(make_sample(f"s{i:03d}", 40 + 7 * (i % 5), k=K, h=H))
    url = f"{s3_bucket}/ds"
    report = publish_dataset(local, open_location(url))
    assert report.manifest_written and len(report.uploaded) >= 8
    return url, local


def shard_bytes_max(local) -> int:
    return max(record.bytes for record in hs_dataset.open_dataset(local).manifest.shards)


def test_remote_reads_the_local_bytes_within_the_cache_bound(uploaded, tmp_path):
    url, local = uploaded
    bound = 4 * shard_bytes_max(local) + 8192
    cache = tmp_path / "cache"
    remote = hs_dataset.open_dataset(url, cache_dir=cache, max_cache_bytes=bound, prefetch_shards=2)
    here = hs_dataset.open_dataset(local)
    assert len(remote) == len(here) == 30
    peak = 0
    for a, b in zip(remote, here):
        assert a["sample_id"] == b["sample_id"]
        for key in ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_state"):
            assert torch.equal(a[key], b[key]), key
        peak = max(peak, disk_usage(cache))
    assert 0 < peak <= bound, (peak, bound)
    weight, eps = remote.final_norm()
    assert torch.equal(weight, torch.ones(H)) and eps == 1e-6
    remote.close()
    assert disk_usage(cache) <= bound


def test_next_shards_are_prefetched(uploaded, tmp_path):
    url, _local = uploaded
    remote = hs_dataset.open_dataset(url, cache_dir=tmp_path / "cache", max_cache_bytes=1 << 30, prefetch_shards=3)
    remote[0]
    deadline = time.monotonic() + 20
    wanted = [remote.cache.path_for(r) for r in remote.manifest.shards[:4]]
    while not all(p.exists() for p in wanted) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(p.exists() for p in wanted)
    assert not remote.cache.path_for(remote.manifest.shards[5]).exists()
    remote.close()


def test_a_replaced_object_is_refused_on_download_and_by_verify(uploaded, tmp_path, capsys):
    import s3fs

    url, _local = uploaded
    assert cli_main(["verify", url]) == 0
    assert "verified 30 samples" in capsys.readouterr().out
    fs = s3fs.S3FileSystem()
    remote = hs_dataset.open_dataset(url, cache_dir=tmp_path / "cache2", prefetch_shards=0)
    record = remote.manifest.shards[1]
    key = f"{url.removeprefix('s3://')}/{record.file}"
    data = bytearray(fs.cat_file(key))
    data[-1] ^= 0xFF  # same size, other bytes
    fs.pipe_file(key, bytes(data))
    with pytest.raises(IntegrityError, match="blake3 .* != recorded"):
        remote[remote.manifest.shards[0].samples]  # the first sample of shard 1
    assert not remote.cache.path_for(record).exists()
    assert cli_main(["verify", url]) == 1
    assert "blake3" in capsys.readouterr().err
    assert cli_main(["verify", f"{url}-nothing"]) == 2  # no dataset there: an error, not a finding
    assert "no manifest.json; this is not an hs_dataset dataset" in capsys.readouterr().err


def test_training_view_pickles_and_the_bound_is_checked_up_front(uploaded, tmp_path):
    url, local = uploaded
    remote = hs_dataset.open_dataset(url, cache_dir=tmp_path / "cache", max_cache_bytes=1 << 30)
    assert Eagle3Dataset(remote).lengths == Eagle3Dataset(local).lengths  # for a packing sampler: from ranged reads ...
    assert not list((tmp_path / "cache").glob("*.safetensors"))  # ... no shard downloaded
    view = pickle.loads(pickle.dumps(Eagle3Dataset(remote)))
    row = view[3]
    assert row["input_ids"].shape[0] == Eagle3Dataset(local)[3]["input_ids"].shape[0]
    with pytest.raises(UsageError, match="cannot hold 2 open \\+ 2 prefetched shards"):
        hs_dataset.open_dataset(url, cache_dir=tmp_path / "c3", max_cache_bytes=shard_bytes_max(local))
    with pytest.raises(UsageError, match="unknown option 'cache_size'"):
        hs_dataset.open_dataset(url, cache_size=1)


def test_load_dataset_serves_a_dataset_in_the_bucket_as_rows(uploaded, tmp_path):
    """``load_dataset("hs_dataset", data_dir="s3://...")`` on another node: the bucket's rows, hash-checked, nothing captured."""
    import datasets

    url, local = uploaded
    expected = hs_dataset.open_dataset(local)
    for load in (
        lambda: hs_dataset.load_dataset(data_dir=url, cache_dir=str(tmp_path / "hf-a")),
        lambda: datasets.load_dataset("hs_dataset", data_dir=url, cache_dir=str(tmp_path / "hf-b"), split="train").with_format("torch"),
    ):
        rows = load()
        assert len(rows) == len(expected)
        by_id = {rows[i]["sample_id"]: rows[i] for i in range(len(rows))}
        for i in range(len(expected)):
            want = expected[i]
            got = by_id[want["sample_id"]]
            assert torch.equal(got["input_ids"], want["input_ids"])
            assert torch.equal(got["aux_hidden_states"], want["aux_hidden_states"].float()), "SILENT: other states served"
    local_rows = hs_dataset.load_dataset(data_dir=str(local), cache_dir=str(tmp_path / "hf-c"))  # a local directory too
    assert len(local_rows) == len(expected)


def test_load_dataset_refuses_a_damaged_object_in_the_bucket(uploaded, tmp_path):
    url, local = uploaded
    where = open_location(url)
    first = hs_dataset.open_dataset(local).manifest.shards[0].file
    data = bytearray((local / first).read_bytes())
    data[-5] ^= 0xFF
    where.fs.pipe(where.key(first), bytes(data))
    with pytest.raises(IntegrityError, match=first.split("/")[-1]):
        hs_dataset.load_dataset(data_dir=url, cache_dir=str(tmp_path / "hf"))
