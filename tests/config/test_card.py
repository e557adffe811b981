"""The typed card: every shipped card loads, every mistake is refused by key path with a fix, docs/CARDS.md is current."""

from __future__ import annotations

import importlib.util
import re
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from hs_dataset.config import Card, CardError, card_from_dict, list_cards, load_card
from hs_dataset.dtypes import STATE_DTYPES
from hs_dataset.errors import HsDatasetError
from tests.fixtures.paths import REPO as ROOT


def _render_module():
    spec = importlib.util.spec_from_file_location("render_card_docs", ROOT / "scripts" / "render_card_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _refusal(tmp_path: Path, raw: dict) -> str:
    path = _write(tmp_path, raw)
    with pytest.raises(CardError) as info:
        load_card(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    return message


@pytest.fixture
def sglang_raw() -> dict:
    return yaml.safe_load((ROOT / "cards" / "tiny-deepseek-sglang.yaml").read_text())


def test_docs_cards_md_is_rendered_from_the_models():
    current = (ROOT / "docs" / "CARDS.md").read_text(encoding="utf-8")
    assert current == _render_module().render(), "docs/CARDS.md is stale: run .venv/bin/python scripts/render_card_docs.py"


def test_every_field_is_documented():
    for _heading, model in _render_module().SECTIONS:
        for name, field in model.model_fields.items():
            assert field.description and len(field.description) > 10, f"{model.__name__}.{name} has no description"


@pytest.mark.parametrize("name", list_cards())
def test_every_shipped_card_loads(name):
    card = load_card(name)
    assert card.name == name and card.source_path == f"cards/{name}.yaml"
    assert card_from_dict(card.to_dict()).fingerprint == card.fingerprint


def test_shipped_cards_read_as_typed_values():
    kimi = load_card("kimi-k25-sglang")
    assert kimi.layers.aux == [2, 30, 58] and kimi.dtype == "bfloat16" and kimi.backend.name == "sglang"
    assert kimi.backend.concurrency == 64 and kimi.backend.request_timeout_s == 600.0 and kimi.backend.retries == 2
    assert kimi.sglang.tp == 8 and kimi.sglang.staging.max_bytes == 32 * 2**30 and kimi.sglang.args[-1] == "0.85"
    assert kimi.dataset_card.front_matter() == {
        "license": "other",
        "license_name": "modified-mit",
        "license_link": "https://huggingface.co/moonshotai/Kimi-K2.5/blob/main/LICENSE",
        "pretty_name": "Kimi-K2.5 EAGLE-3 hidden states",
    }
    tiny = load_card("tiny-deepseek-hf")
    assert tiny.backend.name == "hf" and tiny.backend.batch_size == 4 and tiny.sglang.port == 30000
    with pytest.raises(ValidationError, match="frozen"):
        tiny.max_length = 3  # frozen


def test_card_dtypes_are_the_dtype_tables():
    assert set(typing.get_args(Card.model_fields["dtype"].annotation)) == set(STATE_DTYPES)


@pytest.mark.parametrize(
    "edit, path, suggestion",
    [
        (lambda raw: raw.update(max_lenght=512), "max_lenght", "max_length"),
        (lambda raw: raw["layers"].update(auxx=[1]), "layers.auxx", "aux"),
        (lambda raw: raw["backend"].update(concurency=3), "backend.concurency", "concurrency"),
        (lambda raw: raw["sglang"]["staging"].update(max_byte=3), "sglang.staging.max_byte", "max_bytes"),
        (lambda raw: raw["model"].update(revison="main"), "model.revison", "revision"),
    ],
)
def test_a_mistyped_key_is_refused_with_its_path_and_the_right_spelling(tmp_path, sglang_raw, edit, path, suggestion):
    edit(sglang_raw)
    message = _refusal(tmp_path, sglang_raw)
    assert f": {path}: unknown key; did you mean {suggestion!r}?" in message
    assert "docs/CARDS.md" in message


def test_a_key_nothing_resembles_lists_the_known_keys(tmp_path, sglang_raw):
    sglang_raw["shards"]["zzz"] = 1
    assert "shards.zzz: unknown key; known keys here: bytes, storage" in _refusal(tmp_path, sglang_raw)


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda raw: raw["layers"].update(aux=[3, 2]), "layers.aux: must be ascending distinct HF hidden_states indexes, got [3, 2]"),
        (lambda raw: raw["layers"].update(aux=[2, 2]), "layers.aux: must be ascending distinct HF hidden_states indexes, got [2, 2]"),
        # aux: [] is a valid card now (the final state only, issue #38); naming no layers at all is what is refused
        (lambda raw: raw["layers"].pop("aux"), "layers: name the captured layers: `aux: [2, 30, 58]`"),
        (lambda raw: raw["layers"].update(aux=None, preset="dflash3"), "layers.preset: must be one of 'eagle3'"),
        (
            lambda raw: raw["layers"].update(preset="eagle3", taps=3),
            "layers: taps applies to the presets dflash, dflash2, dspark, xpress only",
        ),
        (lambda raw: raw["layers"].update(aux=[-1, 2]), "layers.aux: must be HF hidden_states indexes >= 0"),
        (lambda raw: raw["layers"].update(aux=[1, "2"]), "layers.aux[1]: must be an integer, got '2'"),
        (lambda raw: raw["layers"].update(final="mid_norm"), "layers.final: must be one of 'pre_norm' or 'post_norm', got 'mid_norm'"),
        (lambda raw: raw.update(max_length="512"), "max_length: must be an integer, got '512'"),
        (lambda raw: raw.update(max_length=0), "max_length: must be > 0, got 0"),
        (lambda raw: raw.update(dtype="fp32"), "dtype: must be one of 'float32', 'bfloat16' or 'float16', got 'fp32'"),
        (lambda raw: raw.update(overflow="wrap"), "overflow: must be one of 'truncate' or 'drop', got 'wrap'"),
        (lambda raw: raw["shards"].update(bytes=5 * 2**30), "shards.bytes: must be <= 4294967295"),
        (lambda raw: raw["shards"].update(storage="fp4"), "shards.storage: must be one of"),
        (lambda raw: raw["backend"].update(concurrency=0), "backend.concurrency: must be >= 1, got 0"),
        (lambda raw: raw["backend"].update(retries=1.5), "backend.retries: must be an integer, got 1.5"),
        (lambda raw: raw["backend"].update(urls="http://a:1"), "backend.urls: must be a list"),
        (lambda raw: raw["backend"].update(allow_radix_cache="yes"), "backend.allow_radix_cache: must be true or false"),
        (lambda raw: raw["sglang"].update(port=70000), "sglang.port: must be <= 65535, got 70000"),
        (lambda raw: raw["sglang"].update(mechanism="magic"), "sglang.mechanism: must be one of"),
        (lambda raw: raw["sglang"]["staging"].update(rid_prefix="x-"), "sglang.staging.rid_prefix: must match"),
        (lambda raw: raw["sglang"]["env"].update(FLAG=True), "sglang.env.FLAG: must be a string"),
        (lambda raw: raw.update(layers=[2, 3]), "layers: must be a mapping (a YAML section)"),
        (lambda raw: raw.pop("dtype"), "dtype: required key is missing"),
        (lambda raw: raw["backend"].update(name="vllm"), "backend.name: unknown backend 'vllm'; use one of 'hf', 'sglang'"),
        (lambda raw: raw["backend"].pop("name"), "backend.name: missing; use one of 'hf', 'sglang'"),
        (lambda raw: raw["backend"].update(name="hf"), "backend.concurrency: unknown key"),  # hf has no concurrency
    ],
)
def test_wrong_values_are_refused_with_the_key_path(tmp_path, sglang_raw, edit, expected):
    edit(sglang_raw)
    assert expected in _refusal(tmp_path, sglang_raw)


def test_every_problem_is_reported_at_once(tmp_path, sglang_raw):
    sglang_raw.update(max_length=-1, dtype="int8")
    message = _refusal(tmp_path, sglang_raw)
    assert "max_length: must be > 0" in message and "dtype: must be one of" in message


def test_card_errors_are_library_errors_and_never_pydantic(tmp_path):
    assert issubclass(CardError, HsDatasetError) and issubclass(CardError, ValueError)
    with pytest.raises(CardError, match="must be a YAML mapping"):
        load_card(_write(tmp_path, ["not", "a", "card"]))  # type: ignore[arg-type]
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(CardError, match="not valid YAML"):
        load_card(tmp_path / "bad.yaml")
    with pytest.raises(CardError, match="unknown config 'nope'"):
        load_card("nope")


def test_a_card_path_that_does_not_exist_is_named_as_a_missing_file(tmp_path):
    for missing in (tmp_path / "typo.yaml", tmp_path / "cards" / "kimi"):
        with pytest.raises(CardError, match=rf"^no such file: {re.escape(str(missing))}; pass an existing .yaml card") as err:
            load_card(missing)
        assert "unknown config" not in str(err.value) and "\n" not in str(err.value)


def test_numbers_in_server_env_and_args_become_strings(tmp_path, sglang_raw):
    sglang_raw["sglang"]["env"]["OMP_NUM_THREADS"] = 2
    sglang_raw["sglang"]["args"] += ["--max-running-requests", 4]
    card = load_card(_write(tmp_path, sglang_raw))
    assert card.sglang.env["OMP_NUM_THREADS"] == "2" and card.sglang.args[-1] == "4"


def test_fingerprint_ignores_key_order_and_stated_defaults_but_not_values(sglang_raw):
    base = card_from_dict(sglang_raw)
    reordered = card_from_dict(
        {k: sglang_raw[k] for k in reversed(list(sglang_raw))} | {"layers": dict(reversed(list(sglang_raw["layers"].items())))}
    )
    assert reordered.fingerprint == base.fingerprint
    explicit = card_from_dict(
        {**sglang_raw, "backend": {**sglang_raw["backend"], "backoff_s": 0.5}, "source": {**sglang_raw["source"], "kind": "conversations"}}
    )
    assert explicit.fingerprint == base.fingerprint
    assert card_from_dict(base.to_dict()).fingerprint == base.fingerprint
    assert card_from_dict({**sglang_raw, "max_length": 1023}).fingerprint != base.fingerprint
    assert base.with_overrides(layers={"aux": [2, 3]}).fingerprint != base.fingerprint
    assert len(base.fingerprint) == 64 and base.fingerprint == card_from_dict(sglang_raw).fingerprint


def test_with_overrides_returns_a_new_validated_card():
    card = load_card("tiny-deepseek-sglang")
    changed = card.with_overrides(model={"path": "/models/x"}, sglang={"port": 31000}, max_length=64)
    assert changed.model.path == "/models/x" and changed.model.revision is None and changed.sglang.port == 31000
    assert changed.sglang.device == "cpu" and changed.max_length == 64 and card.max_length == 1024  # the original is untouched
    assert changed.source_path == card.source_path
    assert card.with_overrides(backend={"name": "hf"}).backend.name == "hf"  # another backend replaces the section
    with pytest.raises(CardError, match=r"layers\.aux: must be ascending"):
        card.with_overrides(layers={"aux": [3, 2]})
    with pytest.raises(CardError, match=r"sglang\.prot: unknown key; did you mean 'port'\?"):
        card.with_overrides(sglang={"prot": 1})
    with pytest.raises(CardError, match=r"max_lenght: unknown key"):
        card.with_overrides(max_lenght=3)


def test_generation_requests_get_time_for_their_longest_answer():
    """The capture requests' timeout (prefill only) would cut long answers; the default grows with max_new_tokens."""
    from hs_dataset.config.sections import SLOWEST_DECODE_TOKENS_PER_S

    card = load_card("tiny-deepseek-sglang")
    backend_timeout = card.backend.request_timeout_s
    long = card.with_overrides(regenerate={"max_new_tokens": 32768}).regenerate
    assert long.generation_timeout_s(backend_timeout) == backend_timeout + 32768 / SLOWEST_DECODE_TOKENS_PER_S
    assert long.generation_timeout_s(backend_timeout) > 6000  # 32k tokens at 5 tokens/s: no 120 s cut
    fixed = card.with_overrides(regenerate={"max_new_tokens": 32768, "request_timeout_s": 900}).regenerate
    assert fixed.generation_timeout_s(backend_timeout) == 900
    with pytest.raises(CardError, match=r"regenerate\.request_timeout_s: must be > 0"):
        card.with_overrides(regenerate={"request_timeout_s": 0})


def test_a_shipped_card_must_carry_its_file_name(monkeypatch, sglang_raw):
    import hs_dataset.config.loading as loading

    class Entry:
        name = "other-name.yaml"

        def read_text(self, encoding="utf-8"):
            return yaml.safe_dump(sglang_raw)

    monkeypatch.setattr(loading, "_builtin_cards", lambda: {"other-name": Entry()})
    with pytest.raises(CardError, match="cards/other-name.yaml: name: 'tiny-deepseek-sglang' must match the file name"):
        load_card("other-name")


def test_card_import_needs_no_torch():
    import subprocess
    import sys

    code = "import sys, hs_dataset.config as c; c.load_card('kimi-k25-sglang'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
