"""What the writer tells a progress line: the bytes of the shard not yet published, so a build never shows 0 MiB written."""

from __future__ import annotations

from hs_dataset.formats import ShardWriter
from tests.fixtures.samples import make_metadata, make_sample


def test_open_shard_bytes_count_samples_before_their_shard_is_published(tmp_path):
    with ShardWriter(tmp_path / "ds", make_metadata(), shard_bytes=2**30) as writer:
        assert writer.progress_bytes() == (0, 0)
        writer.add(make_sample("a", 40))
        writer.add(make_sample("b", 40))
        written, held = writer.progress_bytes()
        assert held > 0 and written == held and writer.report.bytes_written == 0
        writer.flush()  # handed to a writer thread: still open until the manifest lists it
        writer._flusher.wait()
        assert writer.open_shard_bytes == 0 and writer.report.bytes_written > 0
    assert writer.progress_bytes() == (writer.report.bytes_written, 0)


def test_a_full_shard_leaves_only_the_next_one_open(tmp_path):
    first = make_sample("a", 40)
    with ShardWriter(tmp_path / "ds", make_metadata(), shard_bytes=1) as writer:  # every sample fills a shard
        writer.add(first)
        writer._flusher.wait()
        assert writer.open_shard_bytes == 0 and writer.report.shards_written == 1
