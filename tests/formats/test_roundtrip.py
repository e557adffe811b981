"""Property tests: whatever goes into the writer comes back byte-exactly, across shard boundaries."""

from __future__ import annotations

import tempfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors import safe_open

from hs_dataset import open_dataset
from hs_dataset.formats import ShardWriter
from hs_dataset.formats.verify import verify_dataset
from tests.fixtures.paths import FIXTURES
from tests.fixtures.samples import make_metadata, make_sample

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=25),
    k=st.integers(min_value=0, max_value=4),  # 0: the final state only
    h=st.sampled_from([1, 8, 24]),
    dtype=st.sampled_from(sorted(DTYPES)),
    shard_bytes=st.integers(min_value=1, max_value=20_000),
    threads=st.integers(min_value=1, max_value=3),
)
def test_roundtrip_is_byte_exact(lengths, k, h, dtype, shard_bytes, threads):
    samples = [make_sample(f"id-{i}", n, k, h, DTYPES[dtype], seed=i) for i, n in enumerate(lengths)]
    with tempfile.TemporaryDirectory() as root:
        with ShardWriter(root, make_metadata(k, h, dtype), shard_bytes=shard_bytes, writer_threads=threads) as writer:
            for s in samples:
                assert writer.add(s)
        ds = open_dataset(root, verify_hashes=True)
        assert len(ds) == len(samples)
        by_id = {s.sample_id: s for s in samples}
        assert sorted(ds.sample_ids) == sorted(by_id)
        total_tokens = 0
        for item in ds:
            ref = by_id[item["sample_id"]]
            total_tokens += ref.num_tokens
            assert item["input_ids"].dtype == torch.int64 and torch.equal(item["input_ids"], ref.input_ids)
            assert item["loss_mask"].dtype == torch.bool and torch.equal(item["loss_mask"], ref.loss_mask)
            # byte-exact: compare the raw bits, so even NaN payloads or -0.0 would have to match
            assert torch.equal(item["aux_hidden_states"].view(torch.uint8), ref.aux_hidden_states.view(torch.uint8))
            assert torch.equal(item["final_hidden_state"].view(torch.uint8), ref.final_hidden_state.view(torch.uint8))
        assert ds.manifest.num_tokens == total_tokens
        # samples are never split: every shard's offsets end exactly at its token count
        for i, record in enumerate(ds.manifest.shards):
            reader = ds.shard(i)
            assert int(reader.offsets[-1]) == record.tokens
        assert verify_dataset(root).ok


def test_shards_are_plain_safetensors(tmp_path):
    """A third party can read a shard with nothing but safetensors and json (docs/FORMAT.md)."""
    import json

    samples = [make_sample(f"s{i}", 5 + i) for i in range(4)]
    with ShardWriter(tmp_path, make_metadata()) as writer:
        writer.add_many(samples)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    shard = tmp_path / manifest["shards"][0]["file"]
    with safe_open(str(shard), framework="pt") as f:
        ids = json.loads(f.metadata()["sample_ids"])
        offsets = f.get_tensor("sample_offsets")
        aux = f.get_tensor("aux_hidden_states")
        for i, sid in enumerate(ids):
            ref = samples[int(sid[1:])]
            assert torch.equal(aux[offsets[i] : offsets[i + 1]], ref.aux_hidden_states)


def test_items_are_zero_copy_views(tmp_path):
    with ShardWriter(tmp_path, make_metadata()) as writer:
        writer.add_many(make_sample(f"s{i}", 7) for i in range(3))
    ds = open_dataset(tmp_path)
    whole = ds.shard(0).tensor("aux_hidden_states")
    item = ds[1]
    assert item["aux_hidden_states"].untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    assert item["aux_hidden_states"].data_ptr() == whole[7:14].data_ptr()


def test_fp8_encoding_roundtrip_is_close_and_recorded(tmp_path):
    samples = [make_sample(f"s{i}", 9, seed=i) for i in range(5)]
    with ShardWriter(tmp_path, make_metadata(), storage="fp8") as writer:
        writer.add_many(samples)
    ds = open_dataset(tmp_path, verify_hashes=True)
    assert ds.manifest.tensors["aux_hidden_states"]["encoding"] == "fp8_e4m3_per_token"
    for item, ref in zip(ds, samples):
        assert item["aux_hidden_states"].dtype == torch.bfloat16
        err = (item["aux_hidden_states"].float() - ref.aux_hidden_states.float()).norm() / ref.aux_hidden_states.float().norm()
        assert err < 0.05, err
    assert verify_dataset(tmp_path).ok


def test_read_into_copies_exactly_the_view_bytes(tmp_path):
    samples = [make_sample(f"s{i}", 3 + 5 * i, seed=i) for i in range(4)]
    with ShardWriter(tmp_path, make_metadata(), shard_bytes=2_000) as writer:
        writer.add_many(samples)
    ds = open_dataset(tmp_path)
    for index in range(len(ds)):
        shard, local = ds.locate(index)
        reader = ds.shard(shard)
        item = reader.sample(local)
        for key in ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_state"):
            want = item[key].reshape(-1).view(torch.uint8).numpy().tobytes()
            assert reader.sample_nbytes(local, key) == len(want)
            out = bytearray(len(want))
            got, start = memoryview(out), 0
            while start < len(want):  # in pieces of 7 bytes, as a consumer with a small buffer would
                piece = bytearray(7)
                n = reader.read_into(local, key, memoryview(piece), start)
                got[start : start + n] = piece[:n]
                start += n
            assert bytes(out) == want, (index, key)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fp8_quantizer_matches_its_defining_formula_bit_for_bit(dtype):
    """The quantizer reads x once for max |x| and divides in one mixed-dtype kernel; stored bytes must not change.

    The reference is the encoding's definition (float32 copy, max |x| per token, scale =
    max / 448 or 1, divide, clamp, cast), which datasets written before were encoded with.
    """
    from hs_dataset.codecs.fp8 import FP8_MAX, quantize_fp8_per_token

    def reference(x):
        as_float = x.float()
        amax = as_float.abs().amax(dim=-1)
        scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
        return (as_float / scale.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale

    g = torch.Generator().manual_seed(7)
    for _ in range(10):
        x = (torch.randn(9, 3, 129, generator=g) * torch.exp(torch.randn(9, 3, 1, generator=g) * 8)).to(dtype)
        x[0, 0], x[0, 1] = 0.0, -0.0  # all-zero rows: scale 1
        x[1, 0, 5], x[2, 1, 3], x[3, 2, 7] = float("nan"), float("inf"), -float("inf")
        x[4, 0] = -x[4, 0].abs()  # the largest magnitude is negative
        x[5, 1] = torch.finfo(dtype).max
        x[6, 2] = torch.finfo(dtype).tiny / 4  # subnormal
        data, scale = quantize_fp8_per_token(x)
        want_data, want_scale = reference(x)
        assert torch.equal(data.view(torch.uint8), want_data.view(torch.uint8))
        assert torch.equal(scale.view(torch.int32), want_scale.view(torch.int32))


_SCALE_VALUES = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 7.595e35, 7.596e35, 3.4028235e38, float("nan"), float("inf"), -float("inf")]),
)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(_SCALE_VALUES, min_size=1, max_size=40), transpose=st.booleans())
def test_fp8_scale_check_matches_its_defining_formula(values, transpose):
    """The writer's GIL-free check of server-sent scales answers exactly as the torch formula does."""
    from hs_dataset.codecs.fp8 import FP8_MAX
    from hs_dataset.formats.encoding import _scales_valid

    scale = torch.tensor(values, dtype=torch.float32)
    if transpose and len(values) % 2 == 0:
        scale = scale.view(2, -1).t()  # not contiguous: the torch path
    defining = bool(((scale > 0) & torch.isfinite(scale * FP8_MAX)).all())
    assert _scales_valid(scale) == defining


# ---------------------------------------------------------------------- the one header builder
OLD_LAYOUT = FIXTURES / "old_layout"  # written by the writer before it used the one header builder
OLD_SAMPLES = [("old-0", 5), ("old-1", 3), ("old-2", 7), ("old-3", 4), ("old-4", 6)]


def _tensor_order(path) -> list[str]:
    import json
    import struct

    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return [name for name in json.loads(data[8 : 8 + n]) if name != "__metadata__"]


def test_new_shards_are_laid_out_as_safetensors_lays_them_out(tmp_path):
    """The shard header is the one builder's: safetensors' own tensor order, offsets and bytes."""
    import json
    import struct

    from safetensors.torch import save

    samples = [make_sample(f"s{i}", 5 + i) for i in range(3)]
    with ShardWriter(tmp_path, make_metadata(), storage="fp8") as writer:
        writer.add_many(samples)
    shard = tmp_path / json.loads((tmp_path / "manifest.json").read_text())["shards"][0]["file"]
    data = shard.read_bytes()
    with safe_open(str(shard), framework="pt") as f:
        tensors, metadata = {name: f.get_tensor(name) for name in f.keys()}, f.metadata()
    reference = save(tensors, metadata={"only": "one key"})
    (n_ref,) = struct.unpack("<Q", reference[:8])
    (n,) = struct.unpack("<Q", data[:8])
    ref_header, header = json.loads(reference[8 : 8 + n_ref]), json.loads(data[8 : 8 + n])
    assert header.pop("__metadata__") == metadata and ref_header.pop("__metadata__") == {"only": "one key"}
    assert list(header.items()) == list(ref_header.items())  # tensor order, dtypes, shapes, offsets
    assert data[8 + n :] == reference[8 + n_ref :] and (8 + n) % 8 == 0


@pytest.mark.parametrize("storage", ["native", "fp8"])
def test_shards_of_the_old_layout_still_read_verify_and_resume(tmp_path, storage):
    """Shards written before the one header builder (``sample_offsets`` first) read, verify and take new shards."""
    import shutil

    from hs_dataset.codecs.registry import get_encoding
    from hs_dataset.formats.encoding import decode_state, encode_state

    root = tmp_path / storage
    shutil.copytree(OLD_LAYOUT / storage, root)
    assert _tensor_order(root / "shard-000000.safetensors")[0] == "sample_offsets"
    assert verify_dataset(root).ok
    encoding = get_encoding("bf16" if storage == "native" else "fp8_e4m3_per_token")

    def expected_states(sample):
        return [decode_state(*encode_state(state, encoding), encoding) for state in (sample.aux_hidden_states, sample.final_hidden_state)]

    def check(ds, samples):
        assert ds.sample_ids == [s.sample_id for s in samples]
        for item, ref in zip(ds, samples):
            assert torch.equal(item["input_ids"], ref.input_ids) and torch.equal(item["loss_mask"], ref.loss_mask)
            aux, final = expected_states(ref)
            assert torch.equal(item["aux_hidden_states"], aux) and torch.equal(item["final_hidden_state"], final)

    old = [make_sample(sid, n, k=2, h=8) for sid, n in OLD_SAMPLES]
    check(open_dataset(root, verify_hashes=True), old)
    new = [make_sample(f"new-{i}", 4 + i, k=2, h=8) for i in range(3)]
    with ShardWriter(root, make_metadata(k=2, h=8), storage=storage, shard_bytes=600, writer_threads=1) as writer:
        assert not writer.add(old[0])  # already stored in an old shard
        writer.add_many(new)
    assert verify_dataset(root).ok
    check(open_dataset(root, verify_hashes=True), old + new)
    newest = sorted(root.glob("shard-*.safetensors"))[-1]
    assert _tensor_order(newest)[:2] == ["input_ids", "sample_offsets"]


@pytest.mark.parametrize("storage", ["native", "fp8", "nf4"])
def test_a_final_only_dataset_holds_no_aux_tensor_and_every_reader_reads_it(tmp_path, storage):
    """``aux_layer_ids: []`` (an MTP capture): shards and manifest hold the final state only; readers see K = 0."""
    import json

    from hs_dataset.builder import _shard_tables, row_features
    from hs_dataset.formats.stats import compute_stats
    from hs_dataset.training import make_loader

    samples = [make_sample(f"s{i}", 6 + i, k=0, h=32, seed=i) for i in range(6)]
    with ShardWriter(tmp_path, make_metadata(k=0, h=32), storage=storage, shard_bytes=2_000) as writer:
        writer.add_many(samples[:4])
    with ShardWriter(tmp_path, make_metadata(k=0, h=32), storage=storage, shard_bytes=2_000) as writer:  # resumed
        writer.add_many(samples)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert "aux_hidden_states" not in manifest["tensors"] and manifest["metadata"]["aux_layer_ids"] == []
    for record in manifest["shards"]:
        with safe_open(str(tmp_path / record["file"]), framework="pt") as f:
            assert not [k for k in f.keys() if k.startswith("aux_hidden_states")], list(f.keys())
    ds = open_dataset(tmp_path, verify_hashes=True)
    assert len(ds) == 6 and verify_dataset(tmp_path).ok
    for item, ref in zip(ds, samples):
        assert item["aux_hidden_states"].shape == (ref.num_tokens, 0, 32)
        err = (item["final_hidden_state"].float() - ref.final_hidden_state.float()).norm() / ref.final_hidden_state.float().norm()
        assert err < (1e-7 if storage == "native" else 0.2), err
    batch = next(iter(make_loader(tmp_path, max_tokens=64)))  # the EAGLE-3 pairs of training.py
    assert batch["aux_hidden_states"].shape[2] == 0 and batch["final_hidden_state"].shape[-1] == 32
    rows = [row for table in _shard_tables(ds.shard(0), row_features(0, 32)) for row in table.to_pylist()]
    assert rows and "aux_hidden_states" not in rows[0] and len(rows[0]["final_hidden_state"][0]) == 32  # the datasets rows
    assert [layer.name for layer in compute_stats(tmp_path).layers] == ["final (pre_norm)"]


def test_a_manifest_whose_tensor_table_contradicts_its_layers_is_refused(tmp_path):
    import json

    from hs_dataset.errors import FormatError

    with ShardWriter(tmp_path, make_metadata(k=0)) as writer:
        writer.add_many(make_sample(f"s{i}", 5, k=0) for i in range(2))
    raw = json.loads((tmp_path / "manifest.json").read_text())
    raw["tensors"]["aux_hidden_states"] = dict(raw["tensors"]["final_hidden_state"])
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(FormatError, match="tensors.aux_hidden_states is listed but metadata.aux_layer_ids is empty"):
        open_dataset(tmp_path)
