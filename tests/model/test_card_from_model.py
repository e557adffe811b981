"""Any model without writing a card, and the Kimi-K2.5-shaped remote-code snapshot (tiktoken tokenizer, wrapper config).

One build per model is shared by the tests (session fixtures): the tiny DeepseekV3
built from a derived card and from the ``card init`` output, and the remote-code
snapshot through the HF backend, checked against an independent transformers forward.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from hs_dataset.cli.main import main
from hs_dataset.formats.reader import open_dataset
from hs_dataset.layer_presets import eagle3_default_aux_layers
from hs_dataset.model.card_from_model import card_from_model
from hs_dataset.model.processor import ProcessorFilesError, check_processor_files
from hs_dataset.model.remote_code import RemoteCodeError
from hs_dataset.model.snapshot import ModelPathError, resolve_model_path
from tests.fixtures.remote_code_snapshot import independent_text_forward

pytest.importorskip("tiktoken")
N = 6


@pytest.fixture(scope="session")
def kimi_dir() -> Path:
    from tests.fixtures.remote_code_snapshot import build_kimi_like_snapshot

    return build_kimi_like_snapshot()


@pytest.fixture(scope="session")
def derived_builds(tiny_model_dir, tmp_path_factory):
    """``build --model DIR`` and ``build --config <card init output>``, N samples each."""
    root = tmp_path_factory.mktemp("derived")
    assert main(["build", "--model", str(tiny_model_dir), "--out", str(root / "a"), "--num-samples", str(N), "--no-progress"]) == 0
    card = root / "card.yaml"
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["card", "init", "--model", str(tiny_model_dir)]) == 0
    card.write_text(out.getvalue())
    assert main(["build", "--config", str(card), "--out", str(root / "b"), "--num-samples", str(N), "--no-progress"]) == 0
    return root, card.read_text()


@pytest.fixture(scope="session")
def kimi_build(kimi_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("kimi") / "ds"
    assert main(["build", "--model", str(kimi_dir), "--trust-remote-code", "--out", str(out), "--no-progress"]) == 0
    return open_dataset(out)


def test_eagle3_default_layers_match_both_trainers():
    assert eagle3_default_aux_layers(61) == [2, 30, 58]  # Kimi-K2.5
    for layers in (32, 48, 61, 80):
        speculators = [2, layers // 2, layers - 3]  # vLLM ids: HF hidden_states indexes as they are
        specforge = [i + 1 for i in (1, layers // 2 - 1, layers - 4)]  # SGLang ids name layer outputs: +1
        assert eagle3_default_aux_layers(layers) == speculators == specforge
    assert eagle3_default_aux_layers(6) == [2, 3, 4] and eagle3_default_aux_layers(2) == [0, 1]


def test_card_init_comments_every_field_and_builds_the_same_bytes(derived_builds):
    root, text = derived_builds
    keys = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for index, line in enumerate(text.splitlines()):
        if line.strip() and not line.lstrip().startswith("#"):
            assert text.splitlines()[index - 1].lstrip().startswith("#"), f"no comment above {line!r}"
    assert any(line.strip() == "aux: [2, 3, 4]" for line in keys)
    a, b = open_dataset(root / "a"), open_dataset(root / "b")
    meta_a, meta_b = a.manifest.metadata.to_json(), b.manifest.metadata.to_json()
    assert meta_a == meta_b and meta_a["aux_layer_ids"] == [2, 3, 4]
    assert len(a) == len(b) == N
    for i in range(N):
        x, y = a[i], b[i]
        for key in ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_state"):
            assert x[key].numpy().tobytes() == y[key].numpy().tobytes(), key


def test_command_line_overrides_every_capture_field(tiny_model_dir, tmp_path, capsys):
    template = tmp_path / "t.jinja"
    template.write_text("x")
    argv = [
        "card",
        "init",
        "--model",
        str(tiny_model_dir),
        "--aux-layer-ids",
        "1",
        "5",
        "--max-length",
        "64",
        "--dtype",
        "bfloat16",
        "--chat-template",
        str(template),
        "--final-state",
        "post_norm",
        "--trust-remote-code",
    ]
    assert main(argv) == 0
    import yaml

    card = yaml.safe_load(capsys.readouterr().out)
    # preset/taps: the layer-preset keys (issue #38), printed null because --aux-layer-ids names the layers
    assert card["layers"] == {"convention": "hf_hidden_states_index", "preset": None, "taps": None, "aux": [1, 5], "final": "post_norm"}
    assert (card["max_length"], card["dtype"], card["model"]["chat_template"], card["model"]["trust_remote_code"]) == (
        64,
        "bfloat16",
        str(template),
        True,
    )


def test_hub_id_resolves_from_the_local_cache_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelPathError, match="hf download someorg/missing-model"):
        resolve_model_path("someorg/missing-model")
    repo = tmp_path / "models--someorg--tiny"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    assert resolve_model_path("someorg/tiny") == (repo / "snapshots" / "abc123").resolve()


def test_remote_code_off_is_one_line_naming_the_flag(kimi_dir, tmp_path, capsys):
    card = card_from_model(str(kimi_dir))
    assert card.model.trust_remote_code is False and card.model.text_module == "language_model.model"
    path = tmp_path / "card.yaml"
    from hs_dataset.cli.card import card_yaml

    path.write_text(card_yaml(card))
    code = main(["build", "--config", str(path), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "tokenizer_config.json" in err[0] and "--trust-remote-code" in err[0] and "model.trust_remote_code" in err[0]


def test_remote_code_snapshot_tokens_masks_and_states(kimi_dir, kimi_build, tmp_path):
    from hs_dataset.model.tokenizer import load_tokenizer

    tok = load_tokenizer(kimi_dir, trust_remote_code=True)
    assert type(tok).__name__ == "TikTokenTokenizer" and not (kimi_dir / "tokenizer.json").exists()
    header = tok.convert_tokens_to_ids(["<|im_assistant|>"])[0]
    end = tok.convert_tokens_to_ids(["<|im_end|>"])[0]
    meta = kimi_build.manifest.metadata.to_json()
    assert meta["aux_layer_ids"] == [2, 3, 4] and meta["tokenizer"]["class"] == "TikTokenTokenizer"
    model = independent_text_forward(kimi_dir, tmp_path)
    norm_in = {}
    model.model.norm.register_forward_pre_hook(lambda _m, args: norm_in.__setitem__("x", args[0]))
    worst = 0.0
    for i in range(len(kimi_build)):
        row = kimi_build[i]
        ids, mask = row["input_ids"].long(), row["loss_mask"].bool()
        # masks: every supervised span starts right after an assistant header and ends with <|im_end|>
        starts = [j for j in range(1, len(ids)) if mask[j] and not mask[j - 1]]
        for j in starts:
            p = max(q for q in range(j) if int(ids[q]) == header)
            assert tok.decode(ids[p:j].tolist()) == "<|im_assistant|>assistant<|im_middle|>", i
        ends = [j for j in range(len(ids)) if mask[j] and (j + 1 == len(ids) or not mask[j + 1])]
        assert all(int(ids[j]) == end for j in ends), i
        assert tok.decode(ids.tolist()).count("<|im_assistant|>") == len(starts)
        with torch.no_grad():
            out = model.model(input_ids=ids[None], output_hidden_states=True)
        for k, layer in enumerate(meta["aux_layer_ids"]):
            ref = out.hidden_states[layer][0]
            worst = max(worst, float((row["aux_hidden_states"][:, k] - ref).norm() / ref.norm()))
        worst = max(worst, float((row["final_hidden_state"] - norm_in["x"][0]).norm() / norm_in["x"][0].norm()))
    print(f"remote-code snapshot, {len(kimi_build)} samples: max relative error vs independent forward {worst:.2e}")
    assert worst < 1e-6


def test_serve_check_names_missing_processor_files(kimi_dir, tmp_path):
    copy = tmp_path / "snap"
    shutil.copytree(kimi_dir, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(RemoteCodeError, match="preprocessor_config.json"):
        check_processor_files(copy, trust_remote_code=False)
    check_processor_files(copy, trust_remote_code=True)
    (copy / "processing_kimi.py").unlink()
    with pytest.raises(ProcessorFilesError, match="processing_kimi.py is missing"):
        check_processor_files(copy, trust_remote_code=True)
    (copy / "preprocessor_config.json").unlink()
    with pytest.raises(ProcessorFilesError, match="preprocessor_config.json"):
        check_processor_files(copy, trust_remote_code=True)


def _snapshot_copy(kimi_dir: Path, where: Path) -> Path:
    """The snapshot without its weights (the processor check reads configs and code only)."""
    shutil.copytree(kimi_dir, where, ignore=shutil.ignore_patterns("*.safetensors"))
    return where


def test_processor_that_does_not_load_is_named_in_one_line(kimi_dir, tmp_path):
    """What SGLang would hit minutes into its start-up: shipped processor code that does not load, or lacks what SGLang reads."""
    check_processor_files(_snapshot_copy(kimi_dir, tmp_path / "kimi-intact"), trust_remote_code=True)
    cases = {
        "syntax": ("class KimiLikeProcessor(ProcessorMixin):", "class KimiLikeProcessor(ProcessorMixin)\n", "does not load: SyntaxError"),
        "missing-package": (
            "from transformers import ProcessorMixin",
            "import moonshot_media_utils_not_installed\nfrom transformers import ProcessorMixin",
            "moonshot_media_utils_not_installed",
        ),
        "init-raises": (
            "        self.media_processor = image_processor",
            "        raise RuntimeError('broken on purpose')\n        self.media_processor = image_processor",
            "AutoProcessor.from_pretrained",
        ),
        "no-media-processor": ("        self.media_processor = image_processor", "        pass", "has no 'media_processor.media_proc_cfg'"),
    }
    for name, (old, new, expected) in cases.items():
        copy = _snapshot_copy(kimi_dir, tmp_path / f"kimi-{name}")
        code = (copy / "processing_kimi.py").read_text()
        assert old in code, name
        (copy / "processing_kimi.py").write_text(code.replace(old, new))
        with pytest.raises(ProcessorFilesError) as info:
            check_processor_files(copy, trust_remote_code=True)
        message = str(info.value)
        assert "\n" not in message and str(copy / "processing_kimi.py") in message and expected in message, (name, message)


def test_sources_load_a_tokenizer_by_path_through_the_one_loader(kimi_dir):
    """``iter_samples(source, PATH)``: remote code runs only when the card allows it; otherwise one line naming the flag."""
    from hs_dataset.sources import SampleRules, load_samples

    rows = [{"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]}]
    samples, report = load_samples(rows, str(kimi_dir), SampleRules(max_length=256), trust_remote_code=True)
    assert report.samples_out == 1 and samples[0].loss_mask.any()
    from hs_dataset.model.tokenizer import load_tokenizer

    assert samples[0].input_ids.tolist() == load_tokenizer(kimi_dir, trust_remote_code=True).apply_chat_template(
        rows[0]["messages"], tokenize=True, return_dict=False
    )
    with pytest.raises(RemoteCodeError) as info:
        load_samples(rows, str(kimi_dir), SampleRules(max_length=256))
    message = str(info.value)
    assert "\n" not in message and "--trust-remote-code" in message and str(kimi_dir / "tokenizer_config.json") in message
