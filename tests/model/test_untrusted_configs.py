"""Untrusted input: a model's config.json against its own weights, before any forward.

Each case is the tiny DeepseekV3 (its own weights, linked) with one hostile ``config.json``,
tried through every entry point that reads a model: ``card init``, the in-process build
(``HFBackend``), ``serve`` (the plan, before the server starts) and the SGLang client
(before its probe request). Each must end in one line naming the file and the field,
never a traceback (exit 70), a build from random layers (SILENT:) or an allocation the
config asked for (MEMORY:, measured in a child process).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hs_dataset.errors import HsDatasetError
from tests.fixtures.assertions import one_line
from tests.fixtures.child_memory import run_child

CONFIG_CASES = {  # config.json edit -> the words the refusal must hold
    "7 layers for 6": ({"num_hidden_layers": 7}, "num_hidden_layers is 7 but the weights hold layers 0..5"),
    "1024 layers for 6": ({"num_hidden_layers": 1024}, "num_hidden_layers is 1024 but the weights hold layers 0..5"),
    "5 layers for 6": ({"num_hidden_layers": 5}, "unexpected layers from model.layers.5"),
    "hidden 131072": ({"hidden_size": 131072}, "model.embed_tokens.weight is [129536, 64]"),
    "intermediate 1048576": ({"intermediate_size": 1048576}, "intermediate_size 1048576 does not match the weights"),
    "heads 8192": ({"num_attention_heads": 8192}, "num_attention_heads 8192"),
    "vocab 16777216": ({"vocab_size": 16777216}, "vocab_size 16777216"),
    "kv_lora_rank -5": ({"kv_lora_rank": -5}, "kv_lora_rank is -5, outside"),
    "kv_lora_rank 40": ({"kv_lora_rank": 40}, "kv_lora_rank 40 + qk_rope_head_dim 16 does not match"),
    "q_lora_rank a string": ({"q_lora_rank": "48"}, "q_lora_rank must be an integer"),
    "rms_norm_eps x": ({"rms_norm_eps": "x"}, "rms_norm_eps must be a number"),
    "rms_norm_eps 0": ({"rms_norm_eps": 0}, "rms_norm_eps is 0, outside"),
    "rope_theta inf": ({"rope_theta": 1e400}, "rope_theta is inf"),
    "16 routed experts for 8": ({"n_routed_experts": 8 * 2}, "routed expert count (16) does not match the weights"),
    "moe_intermediate_size 4096": ({"moe_intermediate_size": 4096}, "moe_intermediate_size 4096"),
    "n_shared_experts 3": ({"n_shared_experts": 3}, "n_shared_experts 3"),
    "tie_word_embeddings a string": ({"tie_word_embeddings": "no"}, "tie_word_embeddings must be a bool"),
    "architectures a string": ({"architectures": "DeepseekV3ForCausalLM"}, "architectures must be a list"),
}
LOADER_CASES = {  # config edits only transformers' own code can judge: refused when the model is built, in one line
    "unknown model_type": ({"model_type": "no_such_model"}, "transformers cannot build the model config"),
    "unknown hidden_act": ({"hidden_act": "no_such_activation"}, "transformers cannot build the model"),
}


def variant(root: Path, model_dir: Path, edits: dict, *, weights: Path | None = None) -> Path:
    """The model in ``model_dir`` with ``edits`` applied to its config.json; every other file linked, not copied."""
    root.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(model_dir):
        if name != "config.json" and not (weights is not None and name == "model.safetensors"):
            os.symlink(model_dir / name, root / name)
    if weights is not None:
        os.symlink(weights, root / "model.safetensors")
    config = json.loads((model_dir / "config.json").read_text())
    config.update(edits)
    (root / "config.json").write_text(json.dumps(config))
    return root


def refusal(call) -> str:
    with pytest.raises(HsDatasetError) as caught:
        call()
    return one_line(caught.value)


def hf_backend_for(directory: Path):
    from hs_dataset.capture.base import CaptureTarget
    from hs_dataset.capture.hf import HFBackend
    from hs_dataset.config import HFBackendSection

    return HFBackend(HFBackendSection(name="hf", device="cpu"), CaptureTarget(str(directory), (2, 3, 4), dtype="float32"))


@pytest.mark.parametrize("name", list(CONFIG_CASES))
def test_config_against_its_weights_in_card_init(tmp_path, tiny_model_dir, capsys, name):
    from hs_dataset.cli.main import main

    edits, words = CONFIG_CASES[name]
    directory = variant(tmp_path / "m", tiny_model_dir, edits)
    rc = main(["card", "init", "--model", str(directory)])
    captured = capsys.readouterr()
    assert rc == 2, f"SILENT: card init wrote a card for {name} (rc {rc}): {captured.out[:200]}"
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and str(directory / "config.json") in err and words in err, err


@pytest.mark.parametrize("name", list(CONFIG_CASES))
def test_config_against_its_weights_in_the_hf_build(tmp_path, tiny_model_dir, name):
    edits, words = CONFIG_CASES[name]
    directory = variant(tmp_path / "m", tiny_model_dir, edits)
    message = refusal(lambda: hf_backend_for(directory))  # 7 or 1024 layers: built from random layers and verified
    assert str(directory / "config.json") in message and words in message, message


@pytest.mark.parametrize("name", list(LOADER_CASES))
def test_config_transformers_refuses_is_one_line(tmp_path, tiny_model_dir, name):
    edits, words = LOADER_CASES[name]
    directory = variant(tmp_path / "m", tiny_model_dir, edits)
    message = refusal(lambda: hf_backend_for(directory))  # was a traceback: exit 70
    assert words in message and "config.json" in message, message


@pytest.mark.parametrize("name", ["7 layers for 6", "hidden 131072", "kv_lora_rank -5"])
def test_config_against_its_weights_before_serve_starts_a_server(tmp_path, tiny_model_dir, tiny_card, name):
    from hs_dataset.capture.serve.plan import plan_server

    edits, words = CONFIG_CASES[name]
    directory = variant(tmp_path / "m", tiny_model_dir, edits)
    missing_python = str(tmp_path / "no-python")  # never reached: the model is refused first
    message = refusal(lambda: plan_server(tiny_card, model_path=str(directory), python=missing_python))
    assert words in message and "config.json" in message, message


@pytest.mark.parametrize("name", ["1024 layers for 6", "heads 8192"])
def test_config_against_its_weights_before_the_sglang_probe(tmp_path, tiny_model_dir, name, monkeypatch):
    """The client checks the local snapshot before its probe request (the server's own checks stood in for: they
    compare the served model with this one, which a real server of the same snapshot passes)."""
    from hs_dataset.capture.base import CaptureTarget
    from hs_dataset.capture.sglang import backend as client
    from hs_dataset.config import SGLangBackendSection

    edits, words = CONFIG_CASES[name]
    directory = variant(tmp_path / "m", tiny_model_dir, edits)
    probes = []

    async def server_checks_pass(*args, **kwargs):
        return None

    async def probe_request(self, sample, *, endpoints=None):
        probes.append(sample)
        raise AssertionError("SILENT: the probe request was sent for a model whose config does not match its weights")

    monkeypatch.setattr(client, "check_server", server_checks_pass)
    monkeypatch.setattr(client.SGLangBackend, "_capture_one", probe_request)
    backend = client.SGLangBackend(
        SGLangBackendSection(name="sglang"), CaptureTarget(str(directory), (2, 3, 4)), servers="http://127.0.0.1:9"
    )
    try:
        message = refusal(backend.validate)
    finally:
        backend.close()
    assert words in message and not probes, message


def edited_weights(tmp_path: Path, model_dir: Path, drop: str | None = None, add: str | None = None) -> Path:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(model_dir / "model.safetensors"))
    if drop:
        del tensors[drop]
    if add:
        tensors[add] = tensors["model.layers.0.input_layernorm.weight"].clone()
    path = tmp_path / "edited.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def test_missing_weight_is_refused_naming_the_key(tmp_path, tiny_model_dir):
    weights = edited_weights(tmp_path, tiny_model_dir, drop="model.layers.3.self_attn.o_proj.weight")
    directory = variant(tmp_path / "m", tiny_model_dir, {}, weights=weights)
    message = refusal(lambda: hf_backend_for(directory))  # transformers would initialise it randomly, and the build verify
    assert "missing weights: model.layers.3.self_attn.o_proj.weight" in message, message
    from hs_dataset.cli.main import main

    assert main(["card", "init", "--model", str(directory)]) == 2


def test_unexpected_weight_is_refused_naming_the_key(tmp_path, tiny_model_dir):
    weights = edited_weights(tmp_path, tiny_model_dir, add="model.layers.0.mlp.extra_norm.weight")
    directory = variant(tmp_path / "m", tiny_model_dir, {}, weights=weights)
    message = refusal(lambda: hf_backend_for(directory))  # transformers only warned, and the weight went unused
    assert "unexpected weights" in message and "model.layers.0.mlp.extra_norm.weight" in message, message


def test_index_naming_a_file_outside_is_refused(tmp_path, tiny_model_dir):
    from hs_dataset.model.weights import weight_shapes

    directory = variant(tmp_path / "m", tiny_model_dir, {})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"model.norm.weight": "../../etc/x.safetensors"}}))
    message = refusal(lambda: weight_shapes(directory))
    assert "not a .safetensors file beside it" in message, f"ESCAPE: {message}"


def test_the_real_snapshots_still_pass(tiny_model_dir):
    from hs_dataset.model.model_config import read_model_config
    from hs_dataset.model.weights import check_weights
    from tests.fixtures.remote_code_snapshot import build_kimi_like_snapshot

    for directory in (tiny_model_dir, build_kimi_like_snapshot()):
        assert check_weights(directory, read_model_config(directory)) > 100, directory


def test_vocab_at_the_allowed_maximum_memory_is_bounded_in_a_child(tmp_path, tiny_model_dir):
    """vocab_size 16777216 (the range table's maximum) cost 8.5 GB, then exit 70."""
    directory = variant(tmp_path / "m", tiny_model_dir, {"vocab_size": 16777216})
    code = f"""
from hs_dataset.capture.base import CaptureTarget
from hs_dataset.capture.hf import HFBackend
from hs_dataset.config import HFBackendSection
from hs_dataset.errors import HsDatasetError
import transformers, transformers.models.deepseek_v3.modeling_deepseek_v3
BASE = _rss('VmRSS:')
try:
    HFBackend(HFBackendSection(name="hf", device="cpu"), CaptureTarget({str(directory)!r}, (2, 3, 4), dtype="float32"))
    RESULT = {{"error": ""}}
except HsDatasetError as exc:
    RESULT = {{"error": str(exc)}}
"""
    result, _elapsed = run_child(code, timeout=120)
    assert "vocab_size 16777216" in result["error"], result
    assert result["growth_mb"] < 300, f"MEMORY: +{result['growth_mb']:.0f} MB for vocab_size 16777216 (bound 300 MB)"


def test_config_only_directory_still_derives_a_card(tmp_path, tiny_model_dir):
    """No weights to compare with (a config-only download): the config's own checks apply, nothing more."""
    from hs_dataset.model.card_from_model import model_card_dict

    directory = tmp_path / "m"
    directory.mkdir()
    shutil.copy(tiny_model_dir / "config.json", directory / "config.json")
    assert model_card_dict(str(directory))["layers"]["aux"] == [2, 3, 4]
