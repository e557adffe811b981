"""Cut a conversation's text to a per-row character cap *before* tokenizing it.

Only the first ``max_length`` tokens of a row are ever stored, so tokenizing a
50 MB message to keep 4096 tokens would make memory (and time) follow the text's size
instead of the sample's. Rows with more than :func:`row_char_cap` characters of text
(message contents, reasoning, tool-call arguments and tool schemas, counted in
render order) are cut there: the message holding the cut keeps its text up to it,
later messages keep their roles and tool calls but lose their text. The structure
(who speaks when) is kept because templates decide things from it, e.g. which
assistant turns keep their reasoning.

A cut is only accepted when it provably does not reach the stored window: the row is
rendered twice, cut at the cap and :data:`MARGIN_FRACTION` earlier, and the first
``max_length`` tokens and mask entries must be identical (and both renders longer
than ``max_length``). Otherwise the row is an ``oversized`` issue, never a silently
different sample. A cut inside a tool schema or tool-call arguments (JSON that cannot
be cut) is ``oversized`` too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hs_dataset.sources.messages import Conversation
from hs_dataset.sources.report import OversizedRowError

__all__ = [
    "CHARS_PER_TOKEN",
    "MARGIN_FRACTION",
    "MIN_ROW_CHARS",
    "OUTPUT_FACTOR",
    "conversation_chars",
    "encode_capped",
    "output_char_cap",
    "row_char_cap",
]

CHARS_PER_TOKEN = 16  # far above any real tokenizer's average (about 3-5 for text, 1-2 for CJK)
MIN_ROW_CHARS = 65_536  # small max_length values keep whole ordinary rows
MARGIN_FRACTION = 8  # the second render is cut cap // 8 characters earlier
OUTPUT_FACTOR = 4  # a render may output this many times the row cap: the row's text plus the template's markup around it

Encode = Callable[[Conversation], tuple[list[int], list[bool]]]


def row_char_cap(max_length: int) -> int:
    """Characters of text a row may have before it is cut: ``max(65536, 16 * max_length)``."""
    return max(MIN_ROW_CHARS, CHARS_PER_TOKEN * max_length)


def output_char_cap(max_length: int) -> int:
    """Characters one render of a row may output before it is refused untokenized: ``4 * row_char_cap(max_length)``.

    A row's text is cut to :func:`row_char_cap` first, so its render is that text plus the
    template's markup (roles, turn markers, tool schemas written out); an output several
    times longer holds nothing the first ``max_length`` tokens can use, and tokenizing it
    would cost memory and time by its own length (16M characters: gigabytes).
    """
    return OUTPUT_FACTOR * row_char_cap(max_length)


def _args_len(call: dict[str, Any]) -> int:
    args = call.get("function", {}).get("arguments", "")
    return len(args) if isinstance(args, str) else len(json.dumps(args))


def conversation_chars(conv: Conversation) -> int:
    """Characters of text in ``conv`` (what the cap counts)."""
    total = len(json.dumps(conv.tools)) if conv.tools else 0
    for msg in conv.messages:
        total += len(msg.get("reasoning_content", "")) + len(msg.get("content", ""))
        total += sum(_args_len(c) for c in msg.get("tool_calls", ()))
    return total


def _emptied(msg: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in msg.items() if k != "reasoning_content"}
    out["content"] = ""
    if "tool_calls" in out:
        out["tool_calls"] = [_empty_args(c) for c in out["tool_calls"]]
    return out


def _empty_args(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function", {}))
    function["arguments"] = "{}" if isinstance(function.get("arguments", ""), str) else {}
    return {**call, "function": function}


def _cut_message(msg: dict[str, Any], budget: int) -> dict[str, Any]:
    """``msg`` with at most ``budget`` characters of text (reasoning first, then content: render order)."""
    out = dict(msg)
    for key in ("reasoning_content", "content"):
        if key in out and len(out[key]) > budget:
            out[key] = out[key][:budget]
            if key == "reasoning_content":
                out["content"] = ""
            if "tool_calls" in out:  # after the cut: structure kept, text dropped
                out["tool_calls"] = [_empty_args(c) for c in out["tool_calls"]]
            return out
        budget -= len(out.get(key, ""))
    raise OversizedRowError("the character cap falls inside tool-call arguments, which cannot be cut")


def cut_conversation(conv: Conversation, limit: int) -> Conversation:
    """``conv`` with at most ``limit`` characters of text, structure kept (see the module doc)."""
    budget = limit - (len(json.dumps(conv.tools)) if conv.tools else 0)
    if budget < 0:
        raise OversizedRowError(f"the tool schemas alone exceed the {limit}-character row cap")
    messages: list[dict[str, Any]] = []
    for msg in conv.messages:
        size = conversation_chars(Conversation([msg], None))
        if size <= budget:
            messages.append(msg)
        elif budget <= 0:
            messages.append(_emptied(msg))
        else:
            messages.append(_cut_message(msg, budget))
        budget -= size
    return Conversation(messages=messages, tools=conv.tools)


def encode_capped(encode: Encode, conv: Conversation, limit: int, max_length: int) -> tuple[list[int], list[bool]]:
    """Token ids and mask of ``conv`` cut to ``limit`` characters, or :class:`OversizedRowError`."""
    ids, mask = encode(cut_conversation(conv, limit))
    early_ids, early_mask = encode(cut_conversation(conv, limit - limit // MARGIN_FRACTION))
    stable = len(early_ids) > max_length and early_ids[:max_length] == ids[:max_length] and early_mask[:max_length] == mask[:max_length]
    if not stable:
        raise OversizedRowError(
            f"row has more than {limit} characters of text and its first {max_length} tokens reach that cut "
            f"(over {CHARS_PER_TOKEN} characters per token); shorten the row's text"
        )
    return ids, mask
