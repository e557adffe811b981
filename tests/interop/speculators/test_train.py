"""speculators 0.9.0's own trainer, through the hs_dataset backend and through the speculators export: same losses.

A 1-layer EAGLE-3 drafter is trained on the embedded default (tiny DeepseekV3, 42
samples) for two epochs of packed batches, same seed, once from the export
(speculators' ``file`` backend reading ``hs_{idx}.safetensors``) and once through
``hs-dataset train speculators`` (the ``hs_dataset`` backend reading our shards). CPU
shims: ``tests/speculators_cpu.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hs_dataset.interop import export_speculators
from tests.fixtures.interop import require_interop

STEPS_ARGS = ["--epochs", "2", "--total-seq-len", "512", "--seed", "0", "--log-freq", "1"]


@pytest.fixture(scope="module")
def trainer():
    require_interop("speculators.train.trainer")
    from tests.fixtures import speculators_cpu

    return speculators_cpu


def _args(model_dir: Path, save: Path) -> list[str]:
    return [
        "--verifier-name-or-path",
        str(model_dir),
        "--speculator-type",
        "eagle3",
        "--num-layers",
        "1",
        "--hidden-states-dtype",
        "float32",
        "--num-workers",
        "0",
        "--draft-vocab-size",
        "1024",
        "--no-resume-from-checkpoint",
        "--save-path",
        str(save),
        "--on-missing",
        "raise",
        *STEPS_ARGS,
    ]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_backend_route_trains_like_the_export(trainer, tiny_default_dataset: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    from hs_dataset.cli.main import main
    from hs_dataset.interop.speculators.backend import BACKEND_NAME, register, trainer_entry

    register()
    export = tmp_path / "export"
    export_speculators(tiny_default_dataset, export)
    with trainer.cpu_trainer(), trainer.step_losses() as via_export:
        trainer_entry()(
            [
                *_args(tiny_model_dir, tmp_path / "ckpt-export"),
                "--data-path",
                str(export),
                "--target-layer-ids",
                "2",
                "3",
                "4",
                *trainer.CPU_FLAGS,
            ]
        )

    before = _files(tiny_default_dataset)
    rows = tmp_path / "rows"
    with trainer.cpu_trainer(), trainer.step_losses() as via_backend:
        rc = main(
            [
                "train",
                "speculators",
                "--rows-dir",
                str(rows),
                str(tiny_default_dataset),
                "--",
                *_args(tiny_model_dir, tmp_path / "ckpt-backend"),
                *trainer.CPU_FLAGS,
            ]
        )
    assert rc == 0
    assert len(via_export) >= 24 and len(via_backend) == len(via_export)
    worst = max(abs(a - b) for a, b in zip(via_export, via_backend))
    print(f"\n{len(via_export)} steps, max |loss difference| backend vs export: {worst:.3e}")
    assert worst <= 1e-4
    # no state file anywhere on the backend route: rows hold ids and masks, the dataset is untouched
    assert _files(tiny_default_dataset) == before
    written = _files(rows)
    assert not [f for f in written if f.endswith((".safetensors", ".pt")) and f != "token_freq.pt"], written
    assert sum((rows / f).stat().st_size for f in written) < sum(p.stat().st_size for p in (export / "hidden_states").iterdir()) / 20
    from hs_connectors import HiddenStatesBackend

    assert BACKEND_NAME in HiddenStatesBackend.registry


def test_interface_mismatch_is_refused(monkeypatch) -> None:
    pytest.importorskip("hs_connectors")
    from hs_connectors import HiddenStatesTransfer

    from hs_dataset.errors import UsageError
    from hs_dataset.interop.speculators import backend as speculators_backend

    monkeypatch.setattr(HiddenStatesTransfer, "__abstractmethods__", frozenset({"get_cached", "get_generated", "get_batch"}))
    with pytest.raises(UsageError, match="interface differs.*hs-connectors 0.9.0"):
        speculators_backend.check_interface()
