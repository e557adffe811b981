"""4-bit datasets (``mxfp4``, ``nf4``) everywhere data is read, and damaged ones refused.

Every reader and export hands out what the reader decodes (hypothesis over sample
lengths): the exports to speculators and SpecForge, the ``datasets`` builder's Arrow
rows, the speculators backend's transfer and the stream cache. ``verify`` and the reader
refuse damaged scales, codes and headers; datasets written before the 4-bit encodings
(``tests/fixtures/pre_fp4``) still read, verify and resume.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.torch import load_file

from hs_dataset.codecs.fp4 import MX_MAX_EXPONENT_BYTE, MXFP4_ENCODING, NF4_ENCODING
from hs_dataset.codecs.registry import get_encoding
from hs_dataset.errors import HsDatasetError
from hs_dataset.formats.encoding import decode_state, encode_state
from hs_dataset.formats.reader import open_dataset
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.interop import derive_post_norm, export_specforge, export_speculators
from tests.fixtures.damage import rewrite_shard
from tests.fixtures.paths import REPO
from tests.fixtures.samples import make_metadata, make_sample

K, H, L = 3, 64, 6
STORAGES = ("mxfp4", "nf4")
_FIXED = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _write(root: Path, storage: str, lengths=(7, 12, 5, 9)) -> Path:
    md = make_metadata(k=K, h=H, num_hidden_layers=L)
    with ShardWriter(root, md, final_norm_weight=torch.linspace(0.5, 1.5, H), storage=storage, shard_bytes=1500) as w:
        for i, t in enumerate(lengths):
            w.add(make_sample(f"s{i}", t, k=K, h=H))
    return root


def _expected(root: Path) -> list[dict]:
    """The captured states as the 4-bit encoding stores them: encode, then decode, with the one codec."""
    encoding = get_encoding(open_dataset(root).manifest.tensors["aux_hidden_states"]["encoding"])
    out = []
    for item in open_dataset(root):
        ref = make_sample(item["sample_id"], int(item["input_ids"].shape[0]), k=K, h=H)
        aux, final = (decode_state(*encode_state(x, encoding), encoding) for x in (ref.aux_hidden_states, ref.final_hidden_state))
        assert torch.equal(item["aux_hidden_states"], aux) and torch.equal(item["final_hidden_state"], final)
        out.append(item)
    return out


@_FIXED
@given(lengths=st.lists(st.integers(1, 14), min_size=1, max_size=5), storage=st.sampled_from(STORAGES))
def test_exports_carry_the_decoded_states(tmp_path_factory, lengths, storage):
    tmp = tmp_path_factory.mktemp("exp")
    src = _write(tmp / "src", storage, lengths)
    items = _expected(src)
    export_speculators(src, tmp / "spec")
    export_specforge(src, tmp / "forge")
    weight, eps = open_dataset(src).final_norm()
    for idx, sample in enumerate(items):
        hs = load_file(tmp / "spec" / "hidden_states" / f"hs_{idx}.safetensors")["hidden_states"]
        assert hs.dtype == torch.bfloat16
        assert torch.equal(hs[:, :-1], sample["aux_hidden_states"]) and torch.equal(hs[:, -1], sample["final_hidden_state"])
        raw = torch.load(tmp / "forge" / "rows_0-2000" / f"data_{idx}.ckpt", weights_only=True)
        assert torch.equal(raw["aux_hidden_state"][0], sample["aux_hidden_states"].flatten(1))
        assert torch.equal(raw["hidden_state"][0], derive_post_norm(sample["final_hidden_state"], weight, eps))


@_FIXED
@given(lengths=st.lists(st.integers(1, 14), min_size=1, max_size=5), storage=st.sampled_from(STORAGES))
def test_builder_rows_backend_transfer_and_stream_cache_read_the_decoded_states(tmp_path_factory, lengths, storage):
    from hs_dataset.builder import _shard_tables, row_features
    from hs_dataset.interop.speculators.backend import HsDatasetTransfer
    from hs_dataset.streaming.cache import StreamCache

    tmp = tmp_path_factory.mktemp("read")
    src = _write(tmp / "src", storage, lengths)
    items = {s["sample_id"]: s for s in _expected(src)}
    data = open_dataset(src)
    rows = [
        row
        for i in range(len(data.manifest.shards))
        for table in _shard_tables(data.shard(i), row_features(K, H))
        for row in table.to_pylist()
    ]
    for row in rows:
        item = items[row["sample_id"]]
        assert torch.equal(torch.tensor(row["aux_hidden_states"]), item["aux_hidden_states"].float())
        assert torch.equal(torch.tensor(row["final_hidden_state"]), item["final_hidden_state"].float())
    transfer = HsDatasetTransfer(str(src), [0, 1, 2])
    transfer.setup()
    for idx, item in enumerate(items.values()):
        got = transfer.get_cached(idx)["hidden_states"]
        assert torch.equal(got[:, :-1], item["aux_hidden_states"]) and torch.equal(got[:, -1], item["final_hidden_state"])
    samples = [make_sample(sid, int(item["input_ids"].shape[0]), k=K, h=H) for sid, item in items.items()]
    cache = StreamCache(
        tmp / "cache",
        1 << 30,
        make_metadata(k=K, h=H),
        final_norm_weight=torch.ones(H),
        storage=storage,
        dtype=torch.bfloat16,
        card_name="unit-test",
    )
    cache.open()
    cache.write(samples)
    _manifest, where = cache.index()
    for sample in samples:
        stored, promised = cache.read(where[sample.sample_id]), cache.as_stored(sample)
        for key in ("aux_hidden_states", "final_hidden_state"):
            assert torch.equal(stored[key], promised[key]) and torch.equal(stored[key], items[sample.sample_id][key])
    assert cache.shard_estimate(samples) >= sum(r.bytes for r in _manifest.shards)


# ---------------------------------------------------------------------------- damage
def _split(data: bytes) -> tuple[dict, int]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), 8 + n


def _set_bytes(name: str, value: bytes):
    """Overwrite the first element(s) of tensor ``name`` in shard 0."""

    def mutate(data: bytes) -> bytes:
        header, start = _split(data)
        begin = start + header[name]["data_offsets"][0]
        return data[:begin] + value + data[begin + len(value) :]

    return mutate


def _edit_header(edit):
    def mutate(data: bytes) -> bytes:
        header, start = _split(data)
        edit(header)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text + data[start:]

    return mutate


def _bf16(value: float) -> bytes:
    return struct.pack("<f", value)[2:]  # the high half of the float32: bfloat16, little-endian


DAMAGE = [
    ("mx-exponent-255", "mxfp4", _set_bytes("final_hidden_state.scale", b"\xff"), r"final_hidden_state\.scale 255 .*exponent bytes <= 252"),
    (
        "mx-exponent-overflows",
        "mxfp4",
        _set_bytes("aux_hidden_states.scale", bytes([MX_MAX_EXPONENT_BYTE + 1])),
        r"aux_hidden_states\.scale 253",
    ),
    ("nf4-scale-nan", "nf4", _set_bytes("aux_hidden_states.scale", _bf16(float("nan"))), r"aux_hidden_states\.scale nan"),
    ("nf4-scale-inf", "nf4", _set_bytes("final_hidden_state.scale", _bf16(float("inf"))), r"final_hidden_state\.scale inf"),
    (
        "nf4-scale-negative",
        "nf4",
        _set_bytes("final_hidden_state.scale", _bf16(-1.0)),
        r"final_hidden_state\.scale -1\.0 .*finite and >= 0",
    ),
    (
        "scales-wrong-dtype",
        "mxfp4",
        _edit_header(lambda h: h["aux_hidden_states.scale"].update(dtype="BOOL")),
        r"aux_hidden_states\.scale' is BOOL",
    ),
    (
        "nf4-scales-as-f16",
        "nf4",
        _edit_header(lambda h: h["final_hidden_state.scale"].update(dtype="F16")),
        r"final_hidden_state\.scale.*is F16",
    ),
    ("codes-wrong-dtype", "mxfp4", _edit_header(lambda h: h["final_hidden_state"].update(dtype="BOOL")), r"final_hidden_state' is BOOL"),
    (
        "codes-reshaped",
        "nf4",
        _edit_header(lambda h: h["final_hidden_state"].update(shape=[h["final_hidden_state"]["shape"][0], 1, H // 2])),
        r"final_hidden_state has shape",
    ),
    (
        "scales-per-token-shape",
        "mxfp4",
        _edit_header(lambda h: h["aux_hidden_states.scale"].update(shape=[h["aux_hidden_states.scale"]["shape"][0] * 2, K])),
        r"aux_hidden_states\.scale is of shape",
    ),
    (
        "scales-missing",
        "nf4",
        _edit_header(lambda h: h.update({"final_hidden_state.scales": h.pop("final_hidden_state.scale")})),
        r"final_hidden_state\.scale is missing",
    ),
]


@pytest.mark.parametrize("name, storage, damage, match", DAMAGE, ids=[row[0] for row in DAMAGE])
def test_damaged_scales_and_headers_are_refused(tmp_path, name, storage, damage, match):
    root = _write(tmp_path / "ds", storage)
    rewrite_shard(root, 0, damage)
    result = verify_dataset(root)
    assert not result.ok and any(re.search(match, p) for p in result.problems), result.problems
    with pytest.raises(HsDatasetError, match=match):
        for _ in open_dataset(root):
            pass


@pytest.mark.parametrize("storage", STORAGES)
def test_damaged_codes_fail_the_hash(tmp_path, storage):
    """Every 4-bit pattern is a valid code, so a flipped code is caught by the shard's hash (verify, verify_hashes)."""
    root = _write(tmp_path / "ds", storage)
    shard = root / json.loads((root / "manifest.json").read_text())["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    header, start = _split(bytes(data))
    data[start + header["aux_hidden_states"]["data_offsets"][0]] ^= 0x11
    shard.write_bytes(bytes(data))
    result = verify_dataset(root)
    assert not result.ok and "corrupted shard" in result.problems[0]
    with pytest.raises(HsDatasetError, match="corrupted shard"):
        open_dataset(root, verify_hashes=True)[0]


# ---------------------------------------------------------------------------- old datasets
PRE_FP4 = REPO / "tests" / "fixtures" / "pre_fp4"


@pytest.mark.parametrize("storage", ["native", "fp8"])
def test_datasets_written_before_the_4bit_encodings_read_verify_and_resume(tmp_path, storage):
    root = tmp_path / storage
    shutil.copytree(PRE_FP4 / storage, root)
    assert verify_dataset(root).ok
    encoding = get_encoding("bf16" if storage == "native" else "fp8_e4m3_per_token")
    old = [make_sample(f"pre-{i}", n, k=2, h=32) for i, n in enumerate((5, 3, 7, 4))]
    new = [make_sample(f"new-{i}", 3 + i, k=2, h=32) for i in range(2)]
    with ShardWriter(root, make_metadata(k=2, h=32), storage=storage, shard_bytes=1200, writer_threads=1) as writer:
        assert not writer.add(old[0])
        writer.add_many(new)
    assert verify_dataset(root).ok
    ds = open_dataset(root, verify_hashes=True)
    assert ds.sample_ids == [s.sample_id for s in old + new]
    for item, ref in zip(ds, old + new):
        for key, state in (("aux_hidden_states", ref.aux_hidden_states), ("final_hidden_state", ref.final_hidden_state)):
            assert torch.equal(item[key], decode_state(*encode_state(state, encoding), encoding))
    with pytest.raises(HsDatasetError, match="shards.storage"):
        ShardWriter(root, make_metadata(k=2, h=32), storage="mxfp4")


def test_manifest_records_the_4bit_encodings(tmp_path):
    for storage, name in (("mxfp4", MXFP4_ENCODING), ("nf4", NF4_ENCODING)):
        manifest = json.loads((_write(tmp_path / storage, storage) / "manifest.json").read_text())
        assert manifest["tensors"]["aux_hidden_states"] == {"encoding": name, "shape": ["tokens", K, H]}
        assert manifest["tensors"]["final_hidden_state"] == {"encoding": name, "shape": ["tokens", H]}
