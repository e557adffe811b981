"""The typed manifest metadata (formats/metadata.py): JSON round trip, old manifests, unknown keys, identity, writer ownership."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hs_dataset.errors import FormatError
from hs_dataset.formats.identity import identity_fingerprint, legacy_identity_fingerprint
from hs_dataset.formats.manifest import Manifest
from hs_dataset.formats.metadata import (
    BackendRecord,
    DatasetMetadata,
    FinalNorm,
    LayerPreset,
    ModelRecord,
    RegeneratedFile,
    RegenerationRecord,
    TokenizerRecord,
)
from hs_dataset.formats.writer import ShardWriter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
OLD_DATASETS = [
    FIXTURES / "old_layout" / "native",
    FIXTURES / "old_layout" / "fp8",
    FIXTURES / "pre_fp4" / "native",
    FIXTURES / "pre_fp4" / "fp8",
]

# What session.dataset_metadata wrote as a dict before the metadata was typed: keys, order and values.
BUILD_JSON = {
    "config_name": "tiny",
    "config_fingerprint": "c" * 64,
    "model": {"path": "/models/tiny", "id": "org/tiny", "revision": None, "fingerprint": "f" * 64},
    "aux_layer_ids": [2, 3, 4],
    "layer_preset": None,
    "layer_convention": "hf_hidden_states_index",
    "final_state": "pre_norm",
    "final_norm": {"kind": "rmsnorm", "eps": 1e-6},
    "dtype": "float32",
    "hidden_size": 64,
    "num_hidden_layers": 6,
    "vocab_size": 1000,
    "tokenizer": {
        "path": "/models/tiny",
        "class": "PreTrainedTokenizerFast",
        "vocab_size": 1000,
        "fingerprint": "t" * 64,
        "chat_template_sha256": None,
    },
    "max_length": 512,
    "overflow": "truncate",
    "backend": {"name": "hf", "device": "cpu"},
    "capture": {"checked": True},
}


def _built() -> DatasetMetadata:
    """The metadata as session.dataset_metadata builds it in code."""
    return DatasetMetadata(
        config_name="tiny",
        config_fingerprint="c" * 64,
        model=ModelRecord(path="/models/tiny", id="org/tiny", fingerprint="f" * 64),
        aux_layer_ids=(2, 3, 4),
        layer_preset=None,
        layer_convention="hf_hidden_states_index",
        final_state="pre_norm",
        final_norm=FinalNorm(kind="rmsnorm", eps=1e-6),
        dtype="float32",
        hidden_size=64,
        num_hidden_layers=6,
        vocab_size=1000,
        tokenizer=TokenizerRecord(path="/models/tiny", class_name="PreTrainedTokenizerFast", vocab_size=1000, fingerprint="t" * 64),
        max_length=512,
        overflow="truncate",
        backend=BackendRecord(name="hf", extra={"device": "cpu"}),
        capture={"checked": True},
    )


def _dumped(value: object) -> str:
    return json.dumps(value)  # key order included


def test_metadata_built_in_code_writes_the_json_the_dict_did():
    assert _dumped(_built().to_json()) == _dumped(BUILD_JSON)


def test_a_set_field_is_appended_as_the_dict_update_did():
    regen = RegenerationRecord(
        file="r.jsonl",
        max_new_tokens=8,
        temperature=0.0,
        top_p=1.0,
        seed=0,
        stop_token_ids=(1, 2),
        structure_token_ids=(5, 6),
        thinking=None,
        turns=None,
        policy="drop",
        concurrency=None,
        generator={"engine": "transformers"},
    )
    out = replace(_built(), regeneration=regen, stream_cache=True).to_json()
    assert list(out)[-2:] == ["regeneration", "stream_cache"]
    assert _dumped(out["regeneration"]) == _dumped(
        {
            "file": "r.jsonl",
            "max_new_tokens": 8,
            "temperature": 0.0,
            "top_p": 1.0,
            "seed": 0,
            "stop_token_ids": [1, 2],
            "structure_token_ids": [5, 6],
            "thinking": None,
            "turns": None,
            "policy": "drop",
            "concurrency": None,
            "generator": {"engine": "transformers"},
        }
    )
    with_file = regen.with_file("r.jsonl", RegeneratedFile(sha256="a" * 64, records=3)).to_json()
    assert list(with_file)[-1] == "files" and with_file["files"] == {"r.jsonl": {"sha256": "a" * 64, "records": 3}}


@pytest.mark.parametrize("root", OLD_DATASETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_old_manifests_load_and_write_their_metadata_back_unchanged(root):
    raw = json.loads((root / "manifest.json").read_text())
    manifest = Manifest.load(root)  # checks the recorded identity against the typed metadata
    assert _dumped(manifest.metadata.to_json()) == _dumped(raw["metadata"])
    # they record the identity of before it was narrowed to what defines the data (formats/identity.py)
    assert manifest.identity == legacy_identity_fingerprint(raw["metadata"]) == legacy_identity_fingerprint(manifest.metadata)
    assert manifest.aux_layer_ids == raw["metadata"]["aux_layer_ids"] and manifest.hidden_size == raw["metadata"]["hidden_size"]


def test_the_identity_is_the_one_the_dict_gave():
    assert identity_fingerprint(_built()) == identity_fingerprint(BUILD_JSON)
    moved = replace(_built(), model=replace(_built().model, path="/elsewhere"))  # where the weights lie is not the identity
    assert identity_fingerprint(moved) == identity_fingerprint(BUILD_JSON)


def test_unknown_keys_are_kept_and_written_back():
    raw = {**BUILD_JSON, "model": {**BUILD_JSON["model"], "sha": "x"}, "from_a_newer_writer": {"k": [1, 2]}}
    metadata = DatasetMetadata.from_json(raw, "m.json")
    assert metadata.extra == {"from_a_newer_writer": {"k": [1, 2]}} and metadata.model.extra == {"sha": "x"}
    assert _dumped(metadata.to_json()) == _dumped(raw)
    assert identity_fingerprint(metadata) == identity_fingerprint(BUILD_JSON)  # unknown keys are not the identity


def test_null_and_absent_keys_stay_as_they_were():
    raw = {"aux_layer_ids": [1], "hidden_size": 8, "model": {"id": None}}
    assert _dumped(DatasetMetadata.from_json(raw, "m.json").to_json()) == _dumped(raw)
    assert DatasetMetadata.from_json(raw, "m.json").model.without("id").to_json() == {}


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("hidden_size", "16", "metadata.hidden_size"),
        ("aux_layer_ids", "abc", "metadata.aux_layer_ids"),
        ("final_norm", "x", "metadata.final_norm"),
        ("model", {"id": 3}, "metadata.model.id"),
        ("tokenizer", {"class": 1}, "metadata.tokenizer.class"),
        ("stream_cache", "yes", "metadata.stream_cache"),
        ("regeneration", {"files": {"r.jsonl": {"records": "2"}}}, r"metadata.regeneration.files\['r.jsonl'\].records"),
        ("regeneration", {"structure_token_ids": [3, -1]}, "metadata.regeneration.structure_token_ids"),
        ("regeneration", {"structure_token_ids": ["<|im_user|>"]}, "metadata.regeneration.structure_token_ids"),
        ("regeneration", {"stop_token_ids": [True]}, "metadata.regeneration.stop_token_ids"),
    ],
)
def test_a_known_key_of_the_wrong_type_is_refused_by_name(field, value, named):
    with pytest.raises(FormatError, match=f"m.json: {named} must be"):
        DatasetMetadata.from_json({**BUILD_JSON, field: value}, "m.json")


@pytest.mark.parametrize("name", ["../outside", None])
def test_the_norm_weight_file_is_checked_as_it_is_read(name):
    with pytest.raises(FormatError, match=r"final_norm\.weight_file"):
        DatasetMetadata.from_json({**BUILD_JSON, "final_norm": {"eps": 1e-6, "weight_file": name}}, "m.json")


_names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(_names, c, max_size=3),
    max_leaves=6,
)
_optional_str = st.none() | st.text(max_size=8)
_known = {
    "config_name": _optional_str,
    "dtype": _optional_str,
    "final_state": _optional_str,
    "hidden_size": st.none() | st.integers(1, 1 << 20),
    "aux_layer_ids": st.none() | st.lists(st.integers(0, 100), max_size=4),
    "num_hidden_layers": st.none() | st.integers(0, 100),
    "model": st.none() | st.fixed_dictionaries({}, optional={"path": _optional_str, "id": _optional_str, "fingerprint": _optional_str}),
    "layer_preset": st.none() | st.fixed_dictionaries({}, optional={"name": _optional_str, "taps": st.none() | st.integers(0, 9)}),
    "final_norm": st.none() | st.fixed_dictionaries({}, optional={"kind": _optional_str, "eps": st.floats(0, 0.1)}),
    "tokenizer": st.none() | st.fixed_dictionaries({}, optional={"class": _optional_str, "vocab_size": st.integers(0, 9)}),
    "backend": st.none() | st.dictionaries(_names, _json, max_size=3).map(lambda d: {k: v for k, v in d.items() if k != "name"}),
    "capture": st.none() | st.dictionaries(_names, _json, max_size=3),
    "regeneration": st.none()
    | st.fixed_dictionaries(
        {},
        optional={
            "file": _optional_str,
            "seed": st.integers(0, 9),
            "stop_token_ids": st.lists(st.integers(0, 9), max_size=3),
            "structure_token_ids": st.lists(st.integers(10, 19), max_size=3),
            "files": st.dictionaries(_names, st.fixed_dictionaries({"sha256": _optional_str, "records": st.integers(0, 9)}), max_size=2),
        },
    ),
    "stream_cache": st.none() | st.booleans(),
}


@st.composite
def _metadata_json(draw: st.DrawFn) -> dict:
    keys = draw(st.permutations(sorted(_known)))[: draw(st.integers(0, len(_known)))]
    raw = {key: draw(_known[key]) for key in keys}
    raw.update(draw(st.dictionaries(_names.map(lambda n: f"x_{n}"), _json, max_size=2)))
    return raw


@settings(max_examples=150, deadline=None)
@given(_metadata_json())
def test_any_metadata_json_round_trips_with_its_key_order(raw):
    metadata = DatasetMetadata.from_json(raw, "m.json")
    assert _dumped(metadata.to_json()) == _dumped(raw)
    assert DatasetMetadata.from_json(metadata.to_json(), "m.json") == metadata
    assert identity_fingerprint(metadata) == identity_fingerprint(raw)


# ---------------------------------------------------------------------------- the writer owns the manifest
def _regeneration(file: str) -> RegenerationRecord:
    return RegenerationRecord(file=file, max_new_tokens=8, seed=0, generator={"engine": "transformers"})


def test_a_regeneration_record_without_structure_ids_reads_and_writes_back_without_them():
    """Manifests written before the structure ids were recorded: read as None (not recorded), never given a null key."""
    raw = {**BUILD_JSON, "regeneration": {"file": "r.jsonl", "max_new_tokens": 8, "stop_token_ids": [7, 9], "thinking": None}}
    metadata = DatasetMetadata.from_json(raw, "m.json")
    assert metadata.regeneration.stop_token_ids == (7, 9) and metadata.regeneration.structure_token_ids is None
    assert _dumped(metadata.to_json()) == _dumped(raw)
    recorded = replace(metadata, regeneration=replace(metadata.regeneration, structure_token_ids=(3, 4)))
    assert list(recorded.to_json()["regeneration"].items())[-1] == ("structure_token_ids", [3, 4])
    assert identity_fingerprint(recorded) == identity_fingerprint(raw)  # derived from the template, which the identity holds


def test_the_regenerated_file_reaches_the_manifest_through_the_writer(tmp_path):
    metadata = replace(_built(), regeneration=_regeneration("r0.jsonl"))
    with ShardWriter(tmp_path / "ds", metadata) as writer:
        writer.record_regenerated_file("r0.jsonl", RegeneratedFile(sha256="a" * 64, records=2), regeneration=_regeneration("r0.jsonl"))
        assert writer.manifest.metadata.regeneration.files == {"r0.jsonl": RegeneratedFile(sha256="a" * 64, records=2)}
    on_disk = Manifest.load(tmp_path / "ds")
    assert on_disk.metadata.regeneration.files == {"r0.jsonl": RegeneratedFile(sha256="a" * 64, records=2)}
    assert on_disk.metadata.regeneration.file == "r0.jsonl" and on_disk.identity == identity_fingerprint(metadata)
    with pytest.raises(RuntimeError, match="closed"):
        writer.record_regenerated_file("r1.jsonl", RegeneratedFile(records=0), regeneration=_regeneration("r1.jsonl"))


def test_a_resumed_writer_keeps_the_first_record_and_adds_its_file(tmp_path):
    with ShardWriter(tmp_path / "ds", replace(_built(), regeneration=_regeneration("r0.jsonl"))) as writer:
        writer.record_regenerated_file("r0.jsonl", RegeneratedFile(sha256="a" * 64, records=2), regeneration=_regeneration("r0.jsonl"))
    with ShardWriter(tmp_path / "ds", replace(_built(), regeneration=_regeneration("r1.jsonl"))) as writer:
        writer.record_regenerated_file("r1.jsonl", RegeneratedFile(sha256="b" * 64, records=1), regeneration=_regeneration("r1.jsonl"))
    entry = Manifest.load(tmp_path / "ds").metadata.regeneration
    assert entry.file == "r0.jsonl" and sorted(entry.files) == ["r0.jsonl", "r1.jsonl"]


def test_the_writer_takes_the_json_form_too(tmp_path):
    with ShardWriter(tmp_path / "ds", BUILD_JSON) as writer:
        assert writer.metadata == _built()
    assert _dumped(json.loads((tmp_path / "ds" / "manifest.json").read_text())["metadata"]) == _dumped(BUILD_JSON)


def test_the_layer_preset_record_round_trips():
    preset = LayerPreset(name="dflash2", taps=5, ids_from="preset")
    assert replace(_built(), layer_preset=preset).to_json()["layer_preset"] == {"name": "dflash2", "taps": 5, "ids_from": "preset"}
