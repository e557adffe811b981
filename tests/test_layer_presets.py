"""Layer presets per drafter family (``layers.preset``), and what a dataset tells speculators' trainer about them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from hs_dataset.config import CardError, load_card
from hs_dataset.errors import UsageError
from hs_dataset.formats.metadata import DatasetMetadata, LayerPreset
from hs_dataset.layer_presets import LAYER_PRESETS, dflash2_aux_layers, dflash_aux_layers, eagle3_default_aux_layers, preset_aux_layers


def test_each_preset_reproduces_its_published_source():
    # speculators' default [2, L//2, L-3] (vLLM ids = HF hidden_states indexes); Kimi-K2.5 has 61 layers
    assert preset_aux_layers("eagle3", 61) == preset_aux_layers("peagle", 61) == [2, 30, 58]
    # z-lab's build_target_layer_ids, layer outputs + 1: Qwen3-8B (36 layers) -> outputs [1, 9, 17, 25, 33]
    assert dflash_aux_layers(36) == [j + 1 for j in (1, 9, 17, 25, 33)]
    assert dflash_aux_layers(48, 8) == [j + 1 for j in (1, 7, 14, 20, 26, 32, 39, 45)]  # an 8-tap recipe on 48 layers
    assert preset_aux_layers("dspark", 36) == preset_aux_layers("xpress", 36) == dflash_aux_layers(36)
    # SpecForge PR #869's DFlash2 recipe: layer outputs 5/19/33/47/61 of a 64-layer model
    assert dflash2_aux_layers(64) == [j + 1 for j in (5, 19, 33, 47, 61)]
    assert preset_aux_layers("mtp", 61) == []
    assert all(preset.source for preset in LAYER_PRESETS.values())


@pytest.mark.parametrize("name", sorted(LAYER_PRESETS))
def test_ids_are_distinct_ascending_aux_ids_of_the_model(name):
    for layers in range(2, 130):
        for taps in (1, 3, 5, 8) if LAYER_PRESETS[name].tapped else (None,):
            if taps and taps > layers - 1:
                with pytest.raises(ValueError, match="ask for fewer taps"):
                    preset_aux_layers(name, layers, taps)
                continue
            ids = preset_aux_layers(name, layers, taps)
            assert ids == sorted(set(ids)) and all(0 <= i < layers for i in ids), (layers, taps, ids)  # id L is the final state
            assert len(ids) == {"mtp": 0, "eagle3": min(3, layers), "peagle": min(3, layers)}.get(name, taps)


def test_small_models_get_the_nearest_free_layers():
    assert eagle3_default_aux_layers(6) == [2, 3, 4]
    assert dflash_aux_layers(6) == dflash2_aux_layers(6) == [1, 2, 3, 4, 5]  # 5 taps of a 6-layer model: every layer output
    assert dflash_aux_layers(4, 3) == [1, 2, 3]


def _card(**layers):
    return load_card("tiny-deepseek-hf").with_overrides(layers={"aux": None, **layers})


def test_a_card_resolves_its_preset_for_the_model_and_explicit_aux_wins():
    card = _card(preset="dflash2", taps=4)
    assert card.aux_layers_for(64) == dflash2_aux_layers(64, 4)
    assert card.layers.preset_record() == {"name": "dflash2", "taps": 4, "ids_from": "preset"}
    assert _card(preset="dflash").layers.preset_record()["taps"] == 5
    pinned = _card(preset="dflash", aux=[3, 9])
    assert pinned.aux_layers_for(64) == [3, 9] and pinned.layers.preset_record()["ids_from"] == "aux"
    assert _card(preset="mtp").aux_layers_for(6) == [] and _card(aux=[]).aux_layers_for(6) == []
    with pytest.raises(CardError, match="layers.preset dflash: 7 taps do not fit a 6-layer model"):
        _card(preset="dflash", taps=7).aux_layers_for(6)
    with pytest.raises(CardError, match="depend on the model's layer count"):
        _ = _card(preset="eagle3").aux_layer_ids


def test_the_capture_target_and_the_manifest_record_take_the_preset(tiny_model_dir):
    from hs_dataset.capture.base import CaptureTarget
    from hs_dataset.pipeline.session import layer_preset_record

    card = _card(preset="dflash2")
    target = CaptureTarget.from_card(card, model_path=str(tiny_model_dir))
    assert target.aux_layer_ids == (1, 2, 3, 4, 5)  # 5 taps of the 6-layer tiny model
    info = SimpleNamespace(num_hidden_layers=6, aux_layer_ids=[1, 2, 3, 4, 5])
    assert layer_preset_record(card, info) == LayerPreset(name="dflash2", taps=5, ids_from="preset")
    with pytest.raises(UsageError, match=r"gives aux layers \[1, 2, 3, 4, 5\].*backend captures \[2, 3, 4\]"):
        layer_preset_record(card, SimpleNamespace(num_hidden_layers=6, aux_layer_ids=[2, 3, 4]))


def test_the_command_line_preset_replaces_the_derived_layers(tiny_model_dir, capsys):
    import yaml

    from hs_dataset.cli.main import main

    assert main(["card", "init", "--model", str(tiny_model_dir), "--layer-preset", "dflash2", "--taps", "4"]) == 0
    layers = yaml.safe_load(capsys.readouterr().out)["layers"]
    assert (layers["preset"], layers["taps"], layers["aux"]) == ("dflash2", 4, None)


# ---------------------------------------------------------------------------- what reaches speculators' trainer
def _manifest(ids, preset=None, model="/models/m"):
    return SimpleNamespace(
        aux_layer_ids=ids,
        metadata=DatasetMetadata.from_json(
            {"layer_preset": {"name": preset} if preset else None, "model": {"path": model}, "num_hidden_layers": 6}, "test manifest"
        ),
    )


def test_the_trainer_gets_the_datasets_layers_type_and_verifier_unless_told_otherwise():
    from hs_dataset.interop.speculators.launch import flag_values, trainer_argv

    argv = trainer_argv("ds", Path("rows"), ["--", "--save-path", "ckpt"], _manifest([1, 2, 3, 4, 5], "dflash2"))
    assert flag_values(argv, "--speculator-type") == ["dflash2"]
    assert flag_values(argv, "--target-layer-ids") == ["1", "2", "3", "4", "5"]
    assert flag_values(argv, "--verifier-name-or-path") == ["/models/m"]
    assert flag_values(argv, "--hs-dataset-path") == ["ds"] and flag_values(argv, "--save-path") == ["ckpt"]
    mine = trainer_argv(
        "ds",
        Path("rows"),
        ["--speculator-type=eagle3", "--target-layer-ids", "2", "4", "--verifier-name-or-path", "v"],
        _manifest([1, 2, 3, 4, 5], "dflash2"),
    )
    assert flag_values(mine, "--speculator-type") == ["eagle3"] and flag_values(mine, "--target-layer-ids") == ["2", "4"]
    assert flag_values(mine, "--verifier-name-or-path") == ["v"]
    mtp = trainer_argv("ds", Path("rows"), [], _manifest([], "mtp"))
    assert flag_values(mtp, "--speculator-type") == ["mtp"] and flag_values(mtp, "--target-layer-ids") is None


def test_what_the_trainer_cannot_do_is_one_line():
    from hs_dataset.interop.speculators.launch import TrainerUnavailableError, trainer_argv

    with pytest.raises(TrainerUnavailableError, match=r"layer\(s\) \[6\] are not in ds, which holds aux layers \[1, 2, 3\]"):
        trainer_argv("ds", Path("r"), ["--target-layer-ids", "2", "6"], _manifest([1, 2, 3]))
    with pytest.raises(TrainerUnavailableError, match="final state only.*--speculator-type mtp"):
        trainer_argv("ds", Path("r"), ["--speculator-type", "dflash"], _manifest([], "mtp"))
    with pytest.raises(TrainerUnavailableError, match="records no verifier"):
        trainer_argv("ds", Path("r"), [], _manifest([1, 2, 3], model=None))
    with pytest.raises(UsageError, match="--data-path is set by hs-dataset train"):
        trainer_argv("ds", Path("r"), ["--data-path", "x"], _manifest([1, 2, 3]))
