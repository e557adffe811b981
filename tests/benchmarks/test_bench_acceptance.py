"""The acceptance benchmark's one-pass helpers: capture paths from a manifest, two builds paired per sample, the reorder."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import torch

from tests.fixtures.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from bench_acceptance import captured_by, pair

from hs_dataset.formats.reader import open_dataset
from hs_dataset.formats.writer import ShardWriter
from tests.fixtures.acceptance import write_encoded
from tests.fixtures.samples import make_metadata, make_sample


def _write(root, samples, shard_bytes: int = 1 << 20):
    with ShardWriter(root, make_metadata(dtype="float32"), final_norm_weight=torch.ones(16), shard_bytes=shard_bytes) as writer:
        for s in samples:
            writer.add(s)
    return root


def _samples(n: int, paths=(None,)):
    return [replace(make_sample(f"s{i}", 5 + i, dtype=torch.float32), capture_path=paths[i % len(paths)]) for i in range(n)]


def test_captured_by_sums_the_shards_and_counts_unrecorded_shards_as_prefill(tmp_path) -> None:
    mixed = _write(tmp_path / "mixed", _samples(7, ("one_pass", "one_pass", "prefill")), shard_bytes=1_500)
    assert len(open_dataset(mixed).manifest.shards) > 1
    assert captured_by(mixed) == {"one_pass": 5, "prefill": 2}
    assert captured_by(_write(tmp_path / "plain", _samples(3))) == {"prefill": 3}


def test_pair_matches_by_id_and_measures_states_of_equal_tokens_only(tmp_path) -> None:
    a = _samples(4)
    b = [replace(s) for s in reversed(a[1:])] + [make_sample("extra", 4, dtype=torch.float32)]
    b[0].final_hidden_state = b[0].final_hidden_state.clone()
    b[0].final_hidden_state[2, 3] += 0.5  # s3: same tokens, one state off
    b[1].input_ids = b[1].input_ids.flip(0)  # s2: regenerated differently
    got = pair(_write(tmp_path / "a", a), _write(tmp_path / "b", b))
    assert got.same_tokens == ["s1", "s3"] and got.other_tokens == ["s2"] and got.unpaired == ["extra", "s0"]
    assert got.max_abs["aux"] == 0.0 and got.max_abs["final"] == pytest.approx(0.5)
    assert got.max_state == max(float(getattr(s, k).abs().max()) for s in (a[1], a[3]) for k in ("aux_hidden_states", "final_hidden_state"))


def test_write_encoded_in_a_given_order_keeps_every_state(tmp_path) -> None:
    src = _write(tmp_path / "src", _samples(4))
    order = ["s2", "s0", "s3", "s1"]
    out = open_dataset(write_encoded(src, tmp_path / "ordered", "native", order=order))
    assert out.sample_ids == order
    original = {s["sample_id"]: s for s in open_dataset(src)}
    for s in out:
        assert all(torch.equal(s[k], original[s["sample_id"]][k]) for k in ("input_ids", "aux_hidden_states", "final_hidden_state"))
    with pytest.raises(ValueError, match="each of its 4 sample ids once"):
        write_encoded(src, tmp_path / "bad", "native", order=["s0", "s0", "s1", "s2"])
