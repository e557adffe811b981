"""A build resumes after a card edit that defines no data (Hub metadata, the model's directory, a timeout),
and refuses one that does, naming each field that differs with both values."""

from __future__ import annotations

import json
import shutil

import pytest

from hs_dataset.errors import ForeignDatasetError
from hs_dataset.formats.identity import legacy_identity_fingerprint
from hs_dataset.formats.manifest import Manifest
from hs_dataset.pipeline.build import build_dataset


def _resumed(card, out, **options):
    """Build two samples, then resume to three with ``card``: the third is the only one written."""
    report = build_dataset(card, out, num_samples=3, **options)
    assert (report.skipped_existing, report.samples_written) == (2, 1)
    assert Manifest.load(out).num_samples == 3


@pytest.fixture
def two_samples(tmp_path, tiny_card, hf_backend):
    out = tmp_path / "ds"
    build_dataset(tiny_card, out, backend=hf_backend, num_samples=2)
    return out


def test_resume_after_renaming_the_hub_title(two_samples, tiny_card, hf_backend):
    renamed = tiny_card.with_overrides(dataset_card={"pretty_name": "another title"}, description="edited")
    _resumed(renamed, two_samples, backend=hf_backend)


def test_resume_after_changing_a_timeout_of_the_backend(two_samples, tiny_card, hf_backend):
    # the card now names an SGLang backend with another timeout; the states still come from the same model
    served = tiny_card.with_overrides(backend={"name": "sglang", "request_timeout_s": 7.0, "retries": 5, "concurrency": 3})
    _resumed(served, two_samples, backend=hf_backend)


def test_resume_after_moving_the_model(two_samples, tiny_card, tiny_model_dir, tmp_path):
    moved = shutil.copytree(tiny_model_dir, tmp_path / "elsewhere" / "tiny")
    _resumed(tiny_card, two_samples, model_path=moved, device="cpu")
    assert Manifest.load(two_samples).metadata.model.path == str(tiny_model_dir)  # the first build's record is kept


def test_other_aux_layers_are_refused_naming_the_field_and_both_values(two_samples, tiny_card):
    other = tiny_card.with_overrides(layers={"aux": [2, 3, 5]})
    with pytest.raises(ForeignDatasetError) as err:  # a backend opened from the card: it captures the card's layers
        build_dataset(other, two_samples, device="cpu", num_samples=3)
    message = str(err.value)
    assert "  layers.aux: [2, 3, 4] (stored) vs [2, 3, 5] (card)" in message.splitlines()
    assert "new --out" in message and "{" not in message  # the fix, and no raw dict
    assert Manifest.load(two_samples).num_samples == 2


def test_other_source_selection_is_refused(two_samples, tiny_card, hf_backend):
    other = tiny_card.with_overrides(max_length=512, limits={"row_turns": 8})
    with pytest.raises(ForeignDatasetError) as err:
        build_dataset(other, two_samples, backend=hf_backend, num_samples=3)
    lines = str(err.value).splitlines()
    assert "  max_length: 1024 (stored) vs 512 (card)" in lines and "  limits.row_turns: 1024 (stored) vs 8 (card)" in lines


def _as_older_writers_left_it(out) -> None:
    """Rewrite the manifest as hs_dataset wrote it before the narrowed identity: no source or limits, the old hash."""
    path = out / "manifest.json"
    raw = json.loads(path.read_text())
    for key in ("source", "limits"):
        del raw["metadata"][key]
    raw["metadata"]["config_fingerprint"] = "0" * 64  # a card edited since: the old identity covered the whole card
    raw["identity"] = legacy_identity_fingerprint(raw["metadata"])
    path.write_text(json.dumps(raw, indent=1))


def test_an_older_dataset_resumes_under_a_card_with_the_same_data_settings(two_samples, tiny_card, hf_backend):
    _as_older_writers_left_it(two_samples)
    renamed = tiny_card.with_overrides(dataset_card={"pretty_name": "another title"})
    _resumed(renamed, two_samples, backend=hf_backend)
    manifest = Manifest.load(two_samples)  # still checks: the recorded (older) identity is kept
    assert manifest.identity == legacy_identity_fingerprint(manifest.metadata) and manifest.metadata.source is None


def test_an_older_dataset_of_other_layers_is_refused(two_samples, tiny_card):
    _as_older_writers_left_it(two_samples)
    with pytest.raises(ForeignDatasetError, match=r"layers\.aux: \[2, 3, 4\] \(stored\) vs \[2, 4\] \(card\)"):
        build_dataset(tiny_card.with_overrides(layers={"aux": [2, 4]}), two_samples, device="cpu", num_samples=3)
