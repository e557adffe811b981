"""The dataset identity covers what defines the data, re-reads older manifests, and names each field that differs."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings, strategies as st

from hs_dataset.formats.identity import (
    describe_differences,
    identity_differences,
    identity_fields,
    identity_fingerprint,
    legacy_identity_fingerprint,
)
from hs_dataset.formats.metadata import DatasetMetadata

# What a build of today records (session.dataset_metadata), with a regenerated source.
BUILT: dict[str, Any] = {
    "config_name": "kimi",
    "config_fingerprint": "c" * 64,
    "model": {"path": "/models/kimi", "id": "moonshotai/Kimi-K2.5", "revision": "main", "fingerprint": "f" * 64},
    "aux_layer_ids": [2, 30, 58],
    "layer_preset": {"name": "eagle3", "taps": None, "ids_from": "aux"},
    "layer_convention": "hf_hidden_states_index",
    "final_state": "pre_norm",
    "final_norm": {"kind": "rmsnorm", "eps": 1e-6},
    "dtype": "bfloat16",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "vocab_size": 163840,
    "tokenizer": {"path": "/models/kimi", "class": "TikTokenTokenizer", "vocab_size": 163840, "fingerprint": "t" * 64},
    "max_length": 4096,
    "overflow": "truncate",
    "source": {"name": "hf:HuggingFaceH4/ultrachat_200k", "subset": None, "split": "train_sft", "revision": None, "columns": {}},
    "limits": {"row_turns": 1024, "row_chars": None, "row_depth": 64},
    "backend": {"name": "sglang", "server_args": ["--port", "30000"], "urls": ["http://h:30000"]},
    "capture": {"verified": True},
    "regeneration": {"file": "regenerated.jsonl", "max_new_tokens": 512, "temperature": 0.0, "seed": 0, "concurrency": 64},
}

# Paths into BUILT that do not define the data, and values to put there.
NOT_IDENTITY = [
    ("config_name", st.text(min_size=1, max_size=12)),
    ("config_fingerprint", st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)),
    ("model.path", st.text(min_size=1, max_size=30)),
    ("model.id", st.none() | st.text(min_size=1, max_size=30)),
    ("model.revision", st.none() | st.text(min_size=1, max_size=10)),
    ("tokenizer.path", st.text(min_size=1, max_size=30)),
    ("tokenizer.class", st.text(min_size=1, max_size=20)),
    ("layer_preset", st.none() | st.fixed_dictionaries({"name": st.sampled_from(["eagle3", "dflash"])})),
    ("backend", st.fixed_dictionaries({"name": st.sampled_from(["hf", "sglang"]), "port": st.integers(1, 65535)})),
    ("capture", st.dictionaries(st.text(max_size=5), st.integers(), max_size=3)),
    ("regeneration.file", st.text(min_size=1, max_size=20)),
    ("regeneration.concurrency", st.none() | st.integers(1, 512)),
    ("regeneration.generator", st.fixed_dictionaries({"servers": st.lists(st.text(max_size=20), max_size=2)})),
    ("stream_cache", st.booleans()),
]


def _set(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    *parents, last = path.split(".")
    target = out
    for key in parents:
        target = target[key]
    target[last] = value
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(NOT_IDENTITY).flatmap(lambda f: st.tuples(st.just(f[0]), f[1])), min_size=1, max_size=6))
def test_fields_outside_the_identity_never_change_it(edits):
    edited = BUILT
    for path, value in edits:
        edited = _set(edited, path, value)
    metadata = DatasetMetadata.from_json(edited, "m.json")
    assert identity_fingerprint(metadata) == identity_fingerprint(BUILT)
    assert identity_differences(identity_fields(BUILT), identity_fields(metadata)) == []


def test_each_data_defining_field_changes_it_and_is_named():
    for path, value, name in [
        ("aux_layer_ids", [2, 30, 57], "layers.aux"),
        ("model.fingerprint", "e" * 64, "model.fingerprint"),
        ("tokenizer.fingerprint", "u" * 64, "tokenizer.fingerprint"),
        ("dtype", "float32", "dtype"),
        ("max_length", 2048, "max_length"),
        ("source.split", "test_sft", "source.split"),
        ("limits.row_turns", 8, "limits.row_turns"),
        ("regeneration.temperature", 0.7, "regenerate.temperature"),
    ]:
        edited = _set(BUILT, path, value)
        assert identity_fingerprint(edited) != identity_fingerprint(BUILT), path
        assert [d[0] for d in identity_differences(identity_fields(BUILT), identity_fields(edited))] == [name]


def test_a_difference_is_one_line_per_field_with_both_values():
    edited = _set(_set(BUILT, "aux_layer_ids", [2, 30, 57]), "regeneration", None)
    lines = describe_differences(identity_differences(identity_fields(BUILT), identity_fields(edited))).splitlines()
    assert lines == [
        "  layers.aux: [2, 30, 58] (stored) vs [2, 30, 57] (card)",
        "  regenerate.enabled: true (stored) vs false (card)",  # the settings of a regeneration one side lacks are not listed
    ]


def _as_older_writers_wrote_it(raw: dict[str, Any]) -> dict[str, Any]:
    """The metadata without the fields added with the narrowed identity (source, limits)."""
    return {k: v for k, v in raw.items() if k not in ("source", "limits")}


def test_an_older_manifest_is_re_projected_onto_the_identity_fields():
    older = _as_older_writers_wrote_it(_set(BUILT, "config_fingerprint", "0" * 64))
    assert legacy_identity_fingerprint(older) != legacy_identity_fingerprint(BUILT)  # the old hash covered the whole card
    assert identity_differences(identity_fields(older), identity_fields(BUILT)) == []  # unrecorded groups are not compared
    moved = _set(older, "aux_layer_ids", [1, 2, 3])
    assert [d[0] for d in identity_differences(identity_fields(moved), identity_fields(BUILT))] == ["layers.aux"]


def test_recorded_source_columns_are_compared_even_when_one_side_has_none():
    edited = _set(BUILT, "source.columns", {"messages": "dialog"})
    assert identity_differences(identity_fields(BUILT), identity_fields(edited)) == [("source.columns", {}, {"messages": "dialog"})]
