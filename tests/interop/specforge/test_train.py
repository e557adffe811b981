"""A SpecForge export of the embedded default trains with SpecForge 0.2.0's own EAGLE-3 step.

SpecForge's offline reader, normalizer and collator feed its ``Eagle3TrainStrategy``
(frozen ``TargetHead`` in bfloat16 over the stored post-norm state, ``OnlineEagle3Model``
TTT forward with a 1-layer ``LlamaForCausalLMEagle3``), on CPU through the shims in
``tests/specforge_cpu.py``. The embedded default is float32: the default export writes
bfloat16, which is what the target head needs; ``keep_dtype`` keeps float32 and warns.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hs_dataset.interop import export_specforge
from hs_dataset.interop.specforge.settings import SpecForgeExportSettings
from tests.fixtures.interop import require_interop

MAX_LEN = 48  # tokens per sample fed to the step: the full vocab (129,536) makes logits the cost
TTT_LENGTH = 2


@pytest.fixture(scope="module")
def specforge():
    require_interop("specforge.algorithms.eagle3.data")
    from tests.fixtures import specforge_cpu

    specforge_cpu.install()
    return specforge_cpu


def _first_batch(dest: Path):
    from specforge.algorithms.eagle3.data import build_offline_collator, build_offline_normalizer, build_offline_reader
    from specforge.runtime.data_plane.feature_dataloader import FeatureDataLoader
    from specforge.runtime.data_plane.feature_store import LocalFeatureStore

    refs = build_offline_reader(str(dest), run_id="hs-dataset-test", ttt_length=TTT_LENGTH, max_len=MAX_LEN).read()
    loader = FeatureDataLoader(
        LocalFeatureStore(),
        refs=refs[:2],
        batch_size=2,
        collate_fn=build_offline_collator(),
        per_sample_transform=build_offline_normalizer(MAX_LEN),
        drop_last=False,
        gc_interval_s=None,
    )
    return next(iter(loader))


def _strategy(model_dir: Path, hidden: int, vocab: int):
    """SpecForge's EAGLE-3 training parts as its assembler builds them (model_providers.build_eagle3_*), dtype bfloat16."""
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.algorithms.eagle3.providers import build_step
    from specforge.modeling.draft import LlamaForCausalLMEagle3
    from specforge.modeling.target.target_head import TargetHead
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=hidden // 4,
        num_hidden_layers=1,
        vocab_size=vocab,
        draft_vocab_size=vocab,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        target_hidden_size=hidden,
    )
    torch.manual_seed(0)
    draft = LlamaForCausalLMEagle3(config, attention_backend="sdpa")
    draft.freeze_embedding()
    model = OnlineEagle3Model(draft, length=TTT_LENGTH, attention_backend="sdpa").to(dtype=torch.bfloat16)
    head = TargetHead.from_pretrained(str(model_dir))
    return build_step(model, target_head=head)


def test_specforge_trains_on_default_export(specforge, tiny_default_dataset: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    from hs_dataset.formats.reader import open_dataset

    ds = open_dataset(tiny_default_dataset)
    assert ds.manifest.metadata.to_json()["dtype"] == "float32"
    dest = tmp_path / "forge"
    report = export_specforge(tiny_default_dataset, dest)
    assert not report.notes or all("warning" not in n for n in report.notes)
    batch = _first_batch(dest)
    assert batch.tensors["target"].dtype == torch.bfloat16 and batch.tensors["hidden_state"].dtype == torch.bfloat16
    head_dir = specforge.sharded_view(tiny_model_dir, tmp_path / "target")
    strategy = _strategy(head_dir, int(ds.manifest.hidden_size), int(ds.manifest.metadata.to_json()["vocab_size"]))
    out = strategy.forward_loss(batch)
    out.loss.backward()
    loss = float(out.loss.detach())
    assert math.isfinite(loss) and loss > 0
    grads = [p.grad for p in strategy.trainable_module().parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


def test_specforge_keep_dtype_warns_and_cannot_train(specforge, tiny_default_dataset: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """The documented failure the default avoids: float32 files reach SpecForge's bfloat16 target head."""
    dest = tmp_path / "forge32"
    with pytest.warns(UserWarning, match="cannot train"):
        report = export_specforge(tiny_default_dataset, dest, SpecForgeExportSettings(keep_dtype=True))
    assert any("--keep-dtype" in n for n in report.notes)
    batch = _first_batch(dest)
    assert batch.tensors["target"].dtype == torch.float32
    from specforge.modeling.target.target_head import TargetHead

    head = TargetHead.from_pretrained(str(specforge.sharded_view(tiny_model_dir, tmp_path / "target")))
    with pytest.raises(RuntimeError, match="same dtype"):
        head(batch.tensors["target"])
