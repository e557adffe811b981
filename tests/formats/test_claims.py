"""Manifest claims no hash covers (formats/claims.py): each written as a build would, identity re-hashed, refused by verify."""

from __future__ import annotations

from pathlib import Path

import pytest

from hs_dataset.errors import FormatError
from hs_dataset.formats.claims import MAX_NUM_HIDDEN_LAYERS
from hs_dataset.formats.identity import identity_fingerprint
from hs_dataset.formats.manifest import Manifest
from hs_dataset.formats.metadata import DatasetMetadata
from hs_dataset.formats.verify import verify_dataset
from tests.fixtures.untrusted_dataset import build, load_manifest, save_manifest


def claim(root: Path, **metadata: object) -> None:
    """Rewrite the manifest's metadata fields and re-hash its identity, so only the claim itself is wrong."""
    raw = load_manifest(root)
    raw["metadata"].update(metadata)
    for key in [k for k, v in metadata.items() if v is None]:
        del raw["metadata"][key]
    raw["identity"] = identity_fingerprint(DatasetMetadata.from_json(raw["metadata"], "test"))
    save_manifest(root, raw)


def one_problem(root: Path) -> str:
    result = verify_dataset(root)
    assert len(result.problems) == 1, result.problems
    problem = result.problems[0]
    assert "\n" not in problem
    assert str(root / "manifest.json") in problem
    return problem


def test_a_built_dataset_still_verifies(tmp_path):
    root = build(tmp_path / "ds")
    assert verify_dataset(root).ok
    claim(root, aux_layer_ids=[0, 1, 7])  # the lowest and highest ids an 8-layer model has
    assert verify_dataset(root).ok


@pytest.mark.parametrize(
    ("ids", "says"),
    [
        ([2, 2, 2], "is not strictly increasing"),
        ([4, 3, 2], "is not strictly increasing"),
        ([99, 100, 101], "past the model's metadata.num_hidden_layers 8"),
        ([2, 5, 8], "id 8 is the final state"),
    ],
)
def test_aux_layer_ids_a_model_cannot_have_fail_verify(tmp_path, ids, says):
    root = build(tmp_path / "ds")
    claim(root, aux_layer_ids=ids)
    problem = one_problem(root)
    assert f"metadata.aux_layer_ids {ids}" in problem and says in problem
    assert "restore the manifest from a copy or rebuild the dataset" in problem
    with pytest.raises(FormatError):
        Manifest.load(root)  # refused where the manifest is read, not only by verify


def test_without_num_hidden_layers_ids_are_bounded_by_the_deepest_model_a_config_may_describe(tmp_path):
    """An import may not record the model's depth: the order is judged, and ids below 1024 (model_config.py's bound)."""
    root = build(tmp_path / "ds")
    claim(root, num_hidden_layers=None, aux_layer_ids=[99, 100, MAX_NUM_HIDDEN_LAYERS - 1])
    assert verify_dataset(root).ok
    claim(root, aux_layer_ids=[3, 2, 1])
    assert "is not strictly increasing" in one_problem(root)
    claim(root, aux_layer_ids=[2, 3, MAX_NUM_HIDDEN_LAYERS])
    assert "metadata.aux_layer_ids [2, 3, 1024] reaches id 1024, past 1023, the last aux id of the deepest model" in one_problem(root)
    with pytest.raises(FormatError, match="no metadata.num_hidden_layers is known to bound them closer"):
        Manifest.load(root)


def test_the_bounds_formats_holds_are_the_model_configs():
    """formats cannot import model (one layer): its copies of model_config.py's bounds are held equal here."""
    from hs_dataset.formats.vocabulary import MAX_VOCAB_SIZE
    from hs_dataset.model.model_config import FIELD_RANGES

    assert FIELD_RANGES["num_hidden_layers"][1] == MAX_NUM_HIDDEN_LAYERS
    assert FIELD_RANGES["vocab_size"][1] == MAX_VOCAB_SIZE


def test_a_dtype_the_shards_do_not_store_fails_verify(tmp_path):
    root = build(tmp_path / "ds")  # bf16 shards
    claim(root, dtype="float16")
    problem = one_problem(root)
    assert "metadata.dtype 'float16' disagrees with the shards, which store bfloat16" in problem


def test_a_dtype_that_is_no_state_dtype_fails_verify(tmp_path):
    root = build(tmp_path / "ds")
    claim(root, dtype="int64")
    assert "metadata.dtype 'int64' is not a hidden-state dtype" in one_problem(root)


def test_a_dtype_and_encoding_both_edited_are_caught_at_the_shard_headers(tmp_path):
    root = build(tmp_path / "ds")
    claim(root, dtype="float16")
    raw = load_manifest(root)
    for key in ("aux_hidden_states", "final_hidden_state"):
        raw["tensors"][key]["encoding"] = "f16"
    save_manifest(root, raw)
    problems = verify_dataset(root).problems
    assert problems and all("is BF16, the manifest's encoding stores F16" in p for p in problems), problems


def test_a_scaled_encoding_holds_any_capture_dtype(tmp_path):
    """fp8 quantizes what was captured: a float32 capture stored as fp8 is a true claim."""
    root = build(tmp_path / "ds", storage="fp8")
    assert verify_dataset(root).ok
    claim(root, dtype="float32")
    assert verify_dataset(root).ok


REGENERATION = {"file": "regenerated.jsonl", "max_new_tokens": 8, "stop_token_ids": [163586, 163585]}


@pytest.mark.parametrize(
    ("record", "says"),
    [
        (
            {"structure_token_ids": [163587, 163600]},
            "metadata.regeneration.structure_token_ids[1] = 163600 is outside the vocabulary [0, 163600)",
        ),
        (
            {"stop_token_ids": [163586, 10**12]},
            "metadata.regeneration.stop_token_ids[1] = 1000000000000 is outside the vocabulary [0, 163600)",
        ),
        (
            {"structure_token_ids": [163584, 163585]},
            "structure_token_ids holds stop id(s) [163585] of metadata.regeneration.stop_token_ids",
        ),
    ],
    ids=["structure-past-vocab", "stop-past-vocab", "stop-and-structure"],
)
def test_regeneration_ids_no_build_applied_fail_verify(tmp_path, record, says):
    """A record whose stop or structure ids are no token of the model, or both at once, describes rules no build applied."""
    root = build(tmp_path / "ds")
    claim(root, vocab_size=163600, regeneration={**REGENERATION, **record})
    problem = one_problem(root)
    assert says in problem and "restore the manifest from a copy or rebuild the dataset" in problem
    with pytest.raises(FormatError, match="metadata.regeneration"):
        Manifest.load(root)


def test_regeneration_ids_are_read_typed_and_an_old_record_without_structure_ids_still_reads(tmp_path):
    root = build(tmp_path / "ds")
    claim(root, vocab_size=163600, regeneration={**REGENERATION, "structure_token_ids": [163584, 163587]})
    record = Manifest.load(root).metadata.regeneration
    assert record.stop_token_ids == (163586, 163585) and record.structure_token_ids == (163584, 163587)
    claim(root, regeneration=REGENERATION)  # written before structure ids were recorded
    assert Manifest.load(root).metadata.regeneration.structure_token_ids is None
