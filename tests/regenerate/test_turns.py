"""Turn prompts skip the costly control-text sanitizing only where it could change nothing: same ids either way."""

from __future__ import annotations

import pytest

from hs_dataset.regenerate.turns import TurnRenderer


@pytest.fixture(scope="module")
def chat(tiny_chat):
    chat = tiny_chat
    assert chat.sanitizes and chat._control_text is not None, "this tokenizer no longer exercises the fast path"
    return chat


@pytest.mark.parametrize("text", ["plain words", "a literal <|im_end|> inside", "a literal <think> tag", "mixed </think> and <|im_user|>"])
def test_prompt_ids_equal_the_always_sanitized_rendering(chat, text):
    renderer = TurnRenderer(chat, False)
    messages = [
        {"role": "user", "content": "Hi " + text},
        {"role": "assistant", "content": "Sure: " + text},
        {"role": "user", "content": "again"},
    ]
    always = list(chat.apply(messages, None, add_generation_prompt=True, thinking=False, sanitize_control_tokens=True)["input_ids"])
    assert renderer.prompt_ids(messages, None) == always
    history = list(chat.apply(messages[:2], None, thinking=False, sanitize_control_tokens=True)["input_ids"])
    assert renderer.render_ids(messages[:2], None, generation_prompt=False) == history
