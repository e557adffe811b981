"""The shared import loop: one sample id in two files is a named conflict (or, same content, stored once); a resume still skips."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from hs_dataset.interop import ImportDataError, ImportSettings, export_specforge, export_speculators, import_specforge, import_speculators
from tests.fixtures.untrusted_dataset import LENGTHS, build

SETTINGS = ImportSettings(config="unit-test")


def specforge_export(tmp_path: Path) -> Path:
    exported = tmp_path / "sf"
    export_specforge(build(tmp_path / "src"), exported)
    return exported


def conflicting_export(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A SpecForge export whose second file carries the first file's sample id over other content; (dir, first, second)."""
    exported = specforge_export(tmp_path)
    first, second = next(exported.rglob("data_0.ckpt")), next(exported.rglob("data_1.ckpt"))
    data = torch.load(second, weights_only=True)
    data["sample_id"] = torch.load(first, weights_only=True)["sample_id"]
    torch.save(data, second)
    return exported, first, second


def test_two_files_with_one_sample_id_and_different_content_are_a_named_conflict(tmp_path):
    exported, first, second = conflicting_export(tmp_path)
    with pytest.raises(ImportDataError) as caught:
        import_specforge(exported, tmp_path / "in", SETTINGS)
    assert str(caught.value) == (
        f"sample id 's0' is in two files with different content: {first} and {second}; "
        "give one of them another sample_id, or remove the wrong file"
    )


def test_the_same_sample_in_two_files_is_stored_once_and_reported(tmp_path):
    exported = specforge_export(tmp_path)
    first = next(exported.rglob("data_0.ckpt"))
    copy = first.with_name("data_99.ckpt")
    shutil.copyfile(first, copy)
    report = import_specforge(exported, tmp_path / "in", SETTINGS)
    assert report.samples_written == len(LENGTHS) and report.skipped_existing == 0
    assert report.duplicates == [{"sample_id": "s0", "file": str(copy), "same_as": str(first)}]
    assert f"duplicate files (same sample id, same content; stored once): 1 (e.g. {copy} = {first}, id 's0')" in report.summary()


def test_a_rerun_of_the_same_import_still_skips_what_is_stored(tmp_path):
    exported = specforge_export(tmp_path)
    shutil.copyfile(next(exported.rglob("data_0.ckpt")), next(exported.rglob("data_0.ckpt")).with_name("data_99.ckpt"))
    import_specforge(exported, tmp_path / "in", SETTINGS)
    again = import_specforge(exported, tmp_path / "in", SETTINGS)
    assert (again.samples_written, again.skipped_existing, len(again.duplicates)) == (0, len(LENGTHS), 1)


def test_a_speculators_row_longer_than_max_length_is_refused_before_its_file_is_read(tmp_path):
    exported = tmp_path / "spec"
    export_speculators(build(tmp_path / "src"), exported)
    longest = LENGTHS.index(max(LENGTHS))
    with pytest.raises(ImportDataError) as caught:
        import_speculators(exported, tmp_path / "in", ImportSettings(config="unit-test", max_length=max(LENGTHS) - 1))
    assert str(caught.value) == (
        f"{exported} row {longest}: tensor input_ids declares shape [{max(LENGTHS)}]: {max(LENGTHS)} tokens, over max_length "
        f"{max(LENGTHS) - 1} (--max-length); pass --max-length N to import longer samples, or remove the file"
    )


def peer_specforge(tmp_path: Path) -> Path:
    """A SpecForge directory as a peer writes it: no hs_dataset_export.json, so nothing records the model's depth."""
    exported = specforge_export(tmp_path)
    (exported / "hs_dataset_export.json").unlink()
    return exported


def test_without_the_models_depth_aux_ids_are_bounded_by_the_deepest_model_a_config_may_describe(tmp_path):
    from hs_dataset.formats.claims import MAX_NUM_HIDDEN_LAYERS
    from hs_dataset.formats.manifest import Manifest

    exported = peer_specforge(tmp_path)
    with pytest.raises(ImportDataError) as caught:
        import_specforge(exported, tmp_path / "in", ImportSettings(config="peer", aux_layer_ids=[2, 3, MAX_NUM_HIDDEN_LAYERS]))
    assert str(caught.value) == (
        f"aux layer ids [2, 3, {MAX_NUM_HIDDEN_LAYERS}] reaches id {MAX_NUM_HIDDEN_LAYERS}, past {MAX_NUM_HIDDEN_LAYERS - 1}, the last "
        f"aux id of the deepest model a config may describe ({MAX_NUM_HIDDEN_LAYERS} layers; no num_hidden_layers is known to bound "
        "them closer); pass --aux-layer-ids as HF hidden_states indexes of the model, or give the model's depth with "
        "--num-hidden-layers L or --model-path DIR"
    )
    assert not (tmp_path / "in").exists()
    report = import_specforge(exported, tmp_path / "in", ImportSettings(config="peer", aux_layer_ids=[2, 3, MAX_NUM_HIDDEN_LAYERS - 1]))
    assert report.samples_written == len(LENGTHS)
    stored = Manifest.load(tmp_path / "in").metadata  # the manifest's claim check accepts what the import accepted
    assert stored.num_hidden_layers is None and stored.aux_layer_ids == (2, 3, MAX_NUM_HIDDEN_LAYERS - 1)


def test_a_given_depth_bounds_aux_ids_on_import(tmp_path):
    exported = peer_specforge(tmp_path)
    settings = ImportSettings(config="peer", aux_layer_ids=[2, 3, 8], num_hidden_layers=8)
    with pytest.raises(ImportDataError, match=r"^aux layer ids \[2, 3, 8\] reaches id 8, past the model's num_hidden_layers 8 "):
        import_specforge(exported, tmp_path / "in", settings)
    with pytest.raises(ImportDataError, match=r"^aux layer ids \[3, 3, 4\] is not strictly increasing"):
        import_specforge(exported, tmp_path / "in", ImportSettings(config="peer", aux_layer_ids=[3, 3, 4]))


def test_the_import_docs_state_the_bound_and_the_duplicate_rule_as_the_code_has_them(tmp_path):
    """docs/EXPORTS.md documents the Python API's max_length and the duplicate-id conflict: its words are the code's."""
    import re

    from hs_dataset.interop.importing import DEFAULT_MAX_TOKENS

    text = (Path(__file__).resolve().parents[2] / "docs" / "EXPORTS.md").read_text(encoding="utf-8")
    assert "max_length=None," in text and "--max-length N" in text
    assert f"{DEFAULT_MAX_TOKENS:,} tokens" in text and "importing.DEFAULT_MAX_TOKENS" in text
    documented = " ".join(re.search(r'ImportDataError\("(.+?)"\)', text, re.S).group(1).split())
    exported, first, second = conflicting_export(tmp_path)
    with pytest.raises(ImportDataError) as caught:
        import_specforge(exported, tmp_path / "in", SETTINGS)
    assert str(caught.value).replace(str(first), "A").replace(str(second), "B") == documented
