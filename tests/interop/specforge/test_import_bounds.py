"""A SpecForge import checks each file's declared shapes before it copies a byte: shared storage and overlong samples are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hs_dataset.interop import ImportDataError, ImportSettings, export_specforge, import_specforge
from tests.fixtures.untrusted_dataset import LENGTHS, build

CARD = ImportSettings(config="tiny-deepseek-hf", aux_layer_ids=[2, 3, 4], num_hidden_layers=8)  # max_length 1024, float32


def zero_stride_ckpt(path: Path, tokens: int = 2_000_000) -> None:
    """A 1.3 kB file declaring ``tokens`` x 3 x 64 float32 states: every element the same 4 bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "input_ids": torch.zeros(1, dtype=torch.int64).expand(1, tokens),
            "loss_mask": torch.ones(1, dtype=torch.int64).expand(1, tokens),
            "aux_hidden_state": torch.zeros(1).expand(tokens, 3, 64),
            "hidden_state": torch.zeros(1).expand(1, tokens, 64),
        },
        path,
    )


def real_ckpt(path: Path, tokens: int, hidden: int = 8) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "input_ids": torch.arange(tokens).reshape(1, tokens),
            "loss_mask": torch.ones(1, tokens, dtype=torch.int64),
            "aux_hidden_state": torch.randn(1, tokens, 3 * hidden),
            "hidden_state": torch.randn(1, tokens, hidden),
        },
        path,
    )


def test_a_zero_stride_ckpt_is_refused_in_one_line_before_any_copy(tmp_path, monkeypatch):
    path = tmp_path / "sf" / "rows_0-1" / "data_0.ckpt"
    zero_stride_ckpt(path)
    assert path.stat().st_size < 4096
    copies: list[tuple[int, ...]] = []
    real_contiguous = torch.Tensor.contiguous
    monkeypatch.setattr(
        torch.Tensor, "contiguous", lambda self, *a, **k: copies.append(tuple(self.shape)) or real_contiguous(self, *a, **k)
    )
    with pytest.raises(ImportDataError) as caught:
        import_specforge(tmp_path / "sf", tmp_path / "dest", CARD)
    assert str(caught.value) == (
        f"{path}: tensor aux_hidden_state declares shape [2000000, 3, 64] with strides [0, 0, 0] over a 4-byte storage "
        "(elements share bytes: a zero-stride or overlapping tensor, not data); re-save it with .contiguous() or remove the file"
    )
    assert copies == []
    assert not (tmp_path / "dest" / "manifest.json").exists()


def test_a_sample_longer_than_the_cards_max_length_is_refused_naming_it(tmp_path):
    path = tmp_path / "sf" / "rows_0-1" / "data_0.ckpt"
    real_ckpt(path, 1025)
    with pytest.raises(ImportDataError) as caught:
        import_specforge(tmp_path / "sf", tmp_path / "dest", CARD)
    assert str(caught.value) == (
        f"{path}: tensor aux_hidden_state declares shape [1, 1025, 24]: 1025 tokens, over max_length 1024 "
        "(config tiny-deepseek-hf max_length); pass --max-length N to import longer samples, or remove the file"
    )


def test_max_length_bounds_an_import_without_a_card(tmp_path):
    exported = tmp_path / "sf"
    export_specforge(build(tmp_path / "src"), exported)
    with pytest.raises(ImportDataError, match=r"\d+ tokens, over max_length 8 \(--max-length\); pass --max-length N"):
        import_specforge(exported, tmp_path / "short", ImportSettings(config="unit-test", max_length=8))
    report = import_specforge(exported, tmp_path / "fits", ImportSettings(config="unit-test", max_length=max(LENGTHS)))
    assert report.samples_written == len(LENGTHS)


def test_the_default_bound_applies_without_card_or_model(tmp_path):
    from hs_dataset.interop.importing import DEFAULT_MAX_TOKENS

    path = tmp_path / "sf" / "data_0.ckpt"
    real_ckpt(path, DEFAULT_MAX_TOKENS + 1, hidden=1)
    with pytest.raises(ImportDataError) as caught:
        import_specforge(tmp_path / "sf", tmp_path / "dest", ImportSettings(config="unit-test"))
    assert str(caught.value).endswith(
        f"tensor aux_hidden_state declares shape [1, {DEFAULT_MAX_TOKENS + 1}, 3]: {DEFAULT_MAX_TOKENS + 1} tokens, over max_length "
        f"{DEFAULT_MAX_TOKENS} (the import's default bound); pass --max-length N to import longer samples, or remove the file"
    )
