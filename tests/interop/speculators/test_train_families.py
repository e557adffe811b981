"""Every drafter family speculators 0.9.0 trains, from our shards: EAGLE-3 (Eagle 3.1 norms), P-EAGLE, DFlash, DFlash2,
DSpark, XPress and MTP.

Each type trains a few steps on CPU from our data twice: from the speculators export
(its ``file`` backend), with the flags the export record says to pass, and through
``hs-dataset train speculators`` (the ``hs_dataset`` backend), told nothing about
layers, type or verifier: those come from the manifest. Both see the same bytes, so
their losses agree; the losses are finite and fall. The data is the trained tiny Qwen3
(``tests/fixtures/tiny_qwen3.py``) on task conversations, one dataset per layer preset
(``tests/fixtures/families.py``); MTP's holds the final state only. A DFlash drafter
trained on a copy whose taps are one layer off is worse on our data than one trained
on it; the trainer's refusals are one line each.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from tests.fixtures.families import PRESET_OF, family_card
from tests.fixtures.interop import require_interop

STEPS = 16


def _flags(*, seed: int = 0, ratio: float = 0.95, dtype: str = "float32", lr: str = "3e-3") -> list[str]:
    """What every run here shares: CPU-sized loaders, one seed, the eager loss (the fused one needs Triton), a log line per step."""
    return [
        "--hidden-states-dtype",
        dtype,
        "--num-workers",
        "0",
        "--no-resume-from-checkpoint",
        "--on-missing",
        "raise",
        "--seed",
        str(seed),
        "--log-freq",
        "1",
        "--train-data-ratio",
        str(ratio),
        "--lr",
        lr,
        "--loss-implementation",
        "eager",
    ]


SHORT = [*_flags(), "--total-seq-len", "256", "--max-anchors", "16", "--epochs", "1"]  # 16 steps of 256 tokens
JUDGE_SEEDS = (0, 1)


@pytest.fixture(scope="module")
def trainer():
    require_interop("speculators.train.trainer")
    from hs_dataset.interop.speculators.backend import register
    from tests.fixtures import speculators_cpu

    register()  # before speculators' train config is imported: it reads the backends' flags once
    return speculators_cpu


def _draft(kind: str) -> list[str]:
    """A 1-layer draft on CPU (sdpa: flex attention has no CPU backward); MTP's head is the verifier's own, its attention fixed."""
    return [] if kind == "mtp" else ["--num-layers", "1", "--draft-attn-impl", "sdpa"]


def _with_type(flags: list[str], kind: str) -> list[str]:
    """The export's flags for another type of the same data (P-EAGLE on EAGLE-3's, DSpark and XPress on DFlash's)."""
    out = list(flags)
    out[out.index("--speculator-type") + 1] = kind
    return out


def _run_yaml(save: Path) -> dict:
    """What the trainer resolved and ran with (speculators writes it next to the checkpoints)."""
    import yaml

    return yaml.safe_load((save / "run.yaml").read_text())


def _find(tree, key: str):
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for value in tree.values():
            found = _find(value, key)
            if found is not None:
                return found
    return None


@pytest.mark.parametrize("kind", list(PRESET_OF))
def test_every_family_trains_from_the_export_and_from_the_backend(trainer, kind, preset_dataset, preset_export, tmp_path):
    from hs_dataset.cli.main import main
    from hs_dataset.formats.reader import open_dataset
    from hs_dataset.interop.speculators.backend import trainer_entry

    preset = PRESET_OF[kind]
    data, export = preset_dataset(preset), preset_export(preset)
    manifest = open_dataset(data).manifest
    flags = json.loads((export / "hs_dataset_export.json").read_text())["layers"]["train_flags"]
    steps = ["--max-steps", str(STEPS)]
    with trainer.cpu_trainer(), trainer.step_losses() as via_export:
        trainer_entry()(
            [*_with_type(flags, kind), "--data-path", str(export), "--save-path", str(tmp_path / "export"), *SHORT, *steps, *_draft(kind)]
        )
    own_type = [] if kind == preset else ["--speculator-type", kind]  # no layer ids, no verifier: the manifest's
    with trainer.cpu_trainer(), trainer.step_losses() as via_backend:
        rc = main(
            ["train", "speculators", str(data), "--", *own_type, "--save-path", str(tmp_path / "backend"), *SHORT, *steps, *_draft(kind)]
        )
    assert rc == 0
    first, last = sum(via_backend[:4]) / 4, sum(via_backend[-4:]) / 4
    print(f"\n{kind} on the {preset} preset {manifest.aux_layer_ids}: loss {first:.3f} -> {last:.3f} over {len(via_backend)} steps")
    assert len(via_export) == len(via_backend) == STEPS
    assert all(math.isfinite(x) for x in via_export + via_backend)
    assert max(abs(a - b) for a, b in zip(via_export, via_backend)) <= 1e-4  # the same bytes either way
    assert last < first
    ran = _run_yaml(tmp_path / "backend")
    assert _find(ran, "speculator_type") == kind
    assert _find(ran, "verifier_name_or_path") == manifest.metadata.to_json()["model"]["path"]
    assert _find(ran, "target_layer_ids") == (manifest.aux_layer_ids if kind != "mtp" else None)
    if kind == "mtp":
        assert manifest.aux_layer_ids == [] and manifest.metadata.to_json()["layer_preset"]["name"] == "mtp"


def test_the_layer_ids_reach_the_drafter_from_the_manifest(trainer, preset_dataset, tmp_path):
    """Nothing passed by hand: the DFlash2 preset's 5 taps are the drafter's layers (speculators' own default would be [2, 3, 3])."""
    from hs_dataset.cli.main import main
    from hs_dataset.formats.reader import open_dataset

    data = preset_dataset("dflash2")
    manifest = open_dataset(data).manifest
    assert (
        manifest.metadata.to_json()["layer_preset"] == {"name": "dflash2", "taps": 5, "ids_from": "preset"}
        and len(manifest.aux_layer_ids) == 5
    )
    with trainer.cpu_trainer():
        assert (
            main(
                [
                    "train",
                    "speculators",
                    str(data),
                    "--",
                    "--save-path",
                    str(tmp_path / "ckpt"),
                    *SHORT,
                    "--max-steps",
                    "1",
                    *_draft("dflash2"),
                ]
            )
            == 0
        )
    saved = json.loads((tmp_path / "ckpt" / "0" / "config.json").read_text())
    assert saved["speculators_model_type"] == "dflash2" and saved["aux_hidden_state_layer_ids"] == manifest.aux_layer_ids


def test_an_mtp_dataset_stores_only_the_final_state(preset_dataset):
    from hs_dataset.formats.reader import open_dataset

    sizes = {}
    for preset in ("eagle3", "mtp"):
        manifest = open_dataset(preset_dataset(preset)).manifest
        sizes[preset] = manifest.num_bytes / manifest.num_tokens
        print(f"\n{preset}: aux layers {manifest.aux_layer_ids}, {sizes[preset]:.0f} bytes per token (states, ids, mask, headers)")
    print(f"mtp / eagle3 bytes per token: {sizes['mtp'] / sizes['eagle3']:.3f}")
    assert "aux_hidden_states" not in open_dataset(preset_dataset("mtp")).manifest.tensors
    assert sizes["mtp"] < sizes["eagle3"] / 3.5  # 1 state per token against 4 (float32, hidden 64)


def test_a_drafter_trained_on_taps_one_layer_off_is_worse_on_our_data(
    trainer, qwen3_verifier, family_rows, preset_dataset, preset_export, tmp_path
):
    """DFlash on our 5 taps vs on a copy captured one layer lower ([0..4] under the same ids), both then judged on our data.

    Trained, both reach about the same loss on their own data (a tiny model's layers
    are much alike); served the layers the manifest names, the drafter of the shifted
    copy is worse: the data must hold the layers it says. Judged on 32 held-out samples
    over 4 validation passes, for two seeds (the margin varies with the seed).
    """
    from hs_dataset.interop import export_speculators
    from hs_dataset.interop.speculators.backend import trainer_entry
    from hs_dataset.pipeline.build import build_dataset

    real = preset_export("dflash")
    ids = json.loads((real / "hs_dataset_export.json").read_text())["layers"]["target_layer_ids"]
    assert ids == [1, 2, 3, 4, 5]
    shifted = tmp_path / "shifted"
    build_dataset(family_card(qwen3_verifier, family_rows, aux=[i - 1 for i in ids]), shifted, progress=False)
    export_speculators(shifted, tmp_path / "shifted-export")
    layers = [
        "--verifier-name-or-path",
        str(qwen3_verifier),
        "--speculator-type",
        "dflash",
        "--target-layer-ids",
        *map(str, ids),
        "--total-seq-len",
        "512",
        "--max-anchors",
        "32",
        "--draft-attn-impl",
        "sdpa",
    ]
    for seed in JUDGE_SEEDS:
        judged, own = {}, {}
        for name, export in (("ours", real), ("one layer off", tmp_path / "shifted-export")):
            save = tmp_path / f"seed{seed}-{name.replace(' ', '-')}"
            with trainer.cpu_trainer(), trainer.val_losses() as val:  # two epochs of about 20 steps, validated on its own data
                trainer_entry()(
                    [
                        *layers,
                        *_flags(seed=seed, ratio=0.8),
                        "--data-path",
                        str(export),
                        "--save-path",
                        str(save),
                        "--epochs",
                        "2",
                        "--num-layers",
                        "1",
                    ]
                )
            own[name] = val[-1]
            # a no-op step per epoch (lr 1e-12), then the validation pass on our data; the checkpoint is bfloat16, so are the states
            with trainer.cpu_trainer(), trainer.val_losses() as val:
                trainer_entry()(
                    [
                        *layers,
                        *_flags(seed=seed, ratio=0.8, dtype="bfloat16", lr="1e-12"),
                        "--data-path",
                        str(real),
                        "--save-path",
                        f"{save}-judged",
                        "--from-pretrained",
                        str(save / "1"),
                        "--epochs",
                        "4",
                        "--max-steps",
                        "1",
                    ]
                )
            judged[name] = sum(val) / len(val)
        print(
            f"\nseed {seed}: DFlash validation loss on our data: trained on ours {judged['ours']:.4f}, "
            f"on the copy one layer off {judged['one layer off']:.4f} (each on its own data: {own['ours']:.4f}, {own['one layer off']:.4f})"
        )
        assert judged["ours"] < judged["one layer off"]


def test_what_stops_the_trainer_is_one_line_and_exit_2(trainer, tiny_default_dataset, preset_dataset, qwen3_verifier, tmp_path, capsys):
    import torch

    from hs_dataset.cli.main import main

    def refusal(*argv: str) -> str:
        capsys.readouterr()
        assert main(["train", "speculators", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("hs-dataset train: error: "), err
        return err[0]

    save = ["--save-path", str(tmp_path / "ckpt")]
    assert "layer(s) [9] are not in" in refusal(str(preset_dataset("eagle3")), "--", "--target-layer-ids", "2", "9", *save)
    assert "holds the final state only" in refusal(str(preset_dataset("mtp")), "--", "--speculator-type", "dflash", *save)
    # DeepSeek-V3 (and Kimi-K2.5) keep their MTP layers as model.layers.N.*, which speculators' MTP does not know
    assert "'deepseek_v3'" in refusal(str(tiny_default_dataset), "--", "--speculator-type", "mtp", *save)
    no_weights = tmp_path / "config-only"
    shutil.copytree(qwen3_verifier, no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    assert "no weights" in refusal(str(preset_dataset("eagle3")), "--", "--verifier-name-or-path", str(no_weights), *save)
    if not torch.accelerator.is_available():  # speculators' trainer places the draft on a GPU: said before any work
        assert "speculators' trainer needs a GPU" in refusal(str(tiny_default_dataset), "--", *save)
