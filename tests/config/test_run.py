"""Per-run options (``hs_dataset/config/run.py``): one validated schema for build and stream, applied to the card once."""

from __future__ import annotations

from pathlib import Path

import pytest

import hs_dataset
from hs_dataset.config.run import BuildOptions, RunOptions, StreamOptions, parse_options
from hs_dataset.errors import UsageError


def test_unknown_options_are_refused_by_name_with_the_known_ones(tmp_path):
    with pytest.raises(UsageError, match=r"build_dataset\(\): unknown option 'batchsize'; known options: batch_size, .*writer_threads"):
        hs_dataset.build_dataset("tiny-deepseek-hf", tmp_path / "ds", batchsize=2)
    with pytest.raises(UsageError, match=r"stream\(\): unknown option 'cache'"):
        hs_dataset.stream("tiny-deepseek-hf", cache_dir=tmp_path / "c", max_cache_bytes=10**6, cache=1)
    assert not (tmp_path / "ds").exists()


def test_bad_values_name_the_option():
    with pytest.raises(UsageError, match=r"rank must be in \[0, world_size\), got rank=2 world_size=2"):
        parse_options(BuildOptions, "build_dataset()", {"rank": 2, "world_size": 2})
    with pytest.raises(UsageError, match=r"build_dataset\(\): shard_bytes: .*see hs_dataset.config.run.BuildOptions"):
        parse_options(BuildOptions, "build_dataset()", {"shard_bytes": 0})
    with pytest.raises(UsageError, match=r"stream\(\): max_cache_bytes"):
        parse_options(StreamOptions, "stream()", {"cache_dir": "c", "max_cache_bytes": 0})


def test_card_settings_are_applied_to_the_card_for_its_backend():
    hf, sglang = hs_dataset.load_card("tiny-deepseek-hf"), hs_dataset.load_card("tiny-deepseek-sglang")
    assert RunOptions().apply_to(hf) is hf  # nothing given: the card as it is
    opts = RunOptions(batch_size=3, device="cpu", servers=["http://a:1"], shard_bytes=1000, storage="fp8", model_path=Path("/m"))
    card = opts.apply_to(hf)
    assert (card.backend.batch_size, card.backend.device, card.shards.bytes, card.shards.storage, card.model.path) == (
        3,
        "cpu",
        1000,
        "fp8",
        "/m",
    )
    served = opts.apply_to(sglang)
    assert served.backend.urls == ["http://a:1"] and served.backend.concurrency == sglang.backend.concurrency
    # a stream's batch size is also the client's requests in flight
    streamed = StreamOptions(cache_dir="c", max_cache_bytes=10**6, batch_size=4).apply_to(sglang)
    assert streamed.backend.batch_size == 4 and streamed.backend.concurrency == 4


def test_the_source_is_passed_on_as_given():
    rows = [{"messages": []}]
    assert RunOptions(source=rows).source is rows
    assert BuildOptions(**RunOptions(source=rows, num_samples=2).settings(), rank=1, world_size=2).source is rows


def test_load_card_is_public():
    assert hs_dataset.load_card("tiny-deepseek-hf").name == "tiny-deepseek-hf"
