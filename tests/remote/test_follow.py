"""A trainer following datasets that two ranks are still uploading to a real S3-compatible server (moto's, 127.0.0.1)."""

from __future__ import annotations

import threading
import time

import torch

from hs_dataset.formats.writer import ShardWriter
from hs_dataset.remote.cache import disk_usage
from hs_dataset.remote.follow import follow_dataset
from hs_dataset.remote.location import open_location
from hs_dataset.remote.publish import publish_dataset
from tests.fixtures.samples import make_metadata, make_sample


def produce(local, url: str, ids: list[str], finished: dict) -> None:
    """A rank: writes shards locally and publishes every few samples, as build --out URL's uploader does."""
    loc = open_location(url)
    with ShardWriter(local, make_metadata(), final_norm_weight=torch.ones(16), shard_bytes=1 << 20) as writer:
        for k, sid in enumerate(ids):
            writer.add(make_sample(sid, 30 + k))
            if k % 3 == 2:
                writer.flush()
                time.sleep(0.4)
                publish_dataset(local, loc)
    publish_dataset(local, loc)
    finished[url] = time.monotonic()


def test_follow_two_growing_ranks_reads_each_sample_once_as_it_is_published(s3_bucket, tmp_path):
    urls = [f"{s3_bucket}/ds/rank-{r:05d}" for r in range(2)]
    ids = {url: [f"r{r}-s{i:02d}" for i in range(12)] for r, url in enumerate(urls)}
    finished: dict = {}
    ranks = [threading.Thread(target=produce, args=(tmp_path / f"local{r}", url, ids[url], finished)) for r, url in enumerate(urls)]
    for rank in ranks:
        rank.start()
    seen, first_at = [], None
    cache = tmp_path / "cache"
    bound = 1 << 20
    for sample in follow_dataset(urls, poll_s=0.1, idle_timeout_s=4.0, cache_dir=cache, max_cache_bytes=bound, prefetch_shards=1):
        first_at = first_at or time.monotonic()
        seen.append(sample["sample_id"])
        assert sample["aux_hidden_states"].shape[1:] == (3, 16)
        assert disk_usage(cache) <= bound
    for rank in ranks:
        rank.join()
    assert sorted(seen) == sorted(ids[urls[0]] + ids[urls[1]])  # every sample once: none lost, none twice
    assert first_at < min(finished.values())  # trained on what was there while the ranks still wrote


def test_follow_a_bucket_prefix_given_with_and_without_its_slash_reads_each_sample_once(s3_bucket, tmp_path):
    url = f"{s3_bucket}/ds/twice"
    ids = [f"t-s{i:02d}" for i in range(6)]
    produce(tmp_path / "local", url, ids, {})
    urls = [url, url + "/"]
    seen = [s["sample_id"] for s in follow_dataset(urls, poll_s=0.05, idle_timeout_s=0.5, cache_dir=tmp_path / "cache")]
    assert sorted(seen) == ids, f"every sample once, not once per spelling of the prefix: {seen}"
