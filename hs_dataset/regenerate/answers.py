"""An answer is what the model generated, and no more: cut at its first stop id and at ``max_new_tokens``.

A generator's answer is not trusted to end where the model did: a server may return more
ids than ``max_new_tokens`` asked for, or run past its end-of-turn token (another stop
setting, ``ignore_eos`` left on by a wrapper, a proxy that merges responses). Everything
after the first stop id is not this turn, and a template's end-of-turn followed by a user
role marker and text would forge a user turn inside the assistant's, which the loss mask
trains on. So every answer is cut here, once, for both generators (the in-process model
and the SGLang servers, the one-pass path included) before the sample's ids are fixed.

What remains must not hold the template's *structure tokens* (role markers, turn
separators): special tokens the template emits around turns but never inside an
assistant message. An answer that holds one before its end is refused as malformed: its
conversation is not stored. An answer that runs to ``max_new_tokens`` without a stop id is
legitimate (``ignore_eos`` benchmarks do it on purpose) and is kept, cut there.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from hs_dataset.sources.chat import ChatTokenizer
from hs_dataset.sources.messages import Conversation
from hs_dataset.sources.report import MalformedRowError

__all__ = ["CUT_AFTER_STOP", "CUT_AT_MAX_NEW_TOKENS", "Cut", "cut_answer", "first_structure_token", "structure_tokens"]

CUT_AFTER_STOP = "after its stop id"
CUT_AT_MAX_NEW_TOKENS = "at max_new_tokens"
_PROBE = [{"role": "user", "content": "A"}, {"role": "assistant", "content": "B"}, {"role": "user", "content": "C"}]


@dataclass(frozen=True)
class Cut:
    """An answer's ids after cutting, whether it ended on a stop id, and what was cut (None: nothing)."""

    ids: list[int]
    stopped: bool
    cut: str | None


def cut_answer(ids: list[int], stop_ids: Collection[int], max_new_tokens: int) -> Cut:
    """``ids`` through the first stop id (kept: it ends the turn), and never more than ``max_new_tokens`` of them."""
    head = ids[:max_new_tokens]
    for k, token in enumerate(head):
        if token in stop_ids:
            return Cut(head[: k + 1], True, CUT_AFTER_STOP if k + 1 < len(ids) else None)
    return Cut(head, False, CUT_AT_MAX_NEW_TOKENS if len(ids) > max_new_tokens else None)


def first_structure_token(ids: list[int], structure: Mapping[int, str]) -> tuple[int, int] | None:
    """(position, id) of the first structure token in ``ids``, or None."""
    return next(((k, t) for k, t in enumerate(ids) if t in structure), None)


def _special_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens (added tokens marked special, and the named ones: bos, eos, pad, ...)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids = {int(i) for i, token in decoder.items() if getattr(token, "special", False)}
    return ids | {int(i) for i in getattr(tokenizer, "all_special_ids", None) or ()}


def structure_tokens(chat: ChatTokenizer, stop_ids: Collection[int]) -> dict[int, str]:
    """The template's structure tokens (id -> text): special tokens it renders around turns, never inside an answer.

    Found by rendering a probe conversation (user, assistant, user) with the chat's own template and mask:
    special tokens outside the assistant spans, less those also inside one (``<think>`` placeholders a
    template puts in the assistant's own text) and the stop ids (cut at, not refused). A template that
    cannot render the probe gives none: answers are then only cut, never refused.
    """
    try:
        ids, mask = chat.encode(Conversation(messages=[dict(m) for m in _PROBE], tools=None))
    except MalformedRowError:
        return {}
    special = _special_ids(chat.tokenizer)
    inside = {t for t, m in zip(ids, mask) if m}
    found = {t for t, m in zip(ids, mask) if not m and t in special} - inside - set(stop_ids)
    return {t: chat.tokenizer.convert_ids_to_tokens(t) for t in sorted(found)}
