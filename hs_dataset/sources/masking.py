"""Assistant-only loss masks, computed on token ids rather than on text offsets.

Two ways to find what the assistant wrote:

* :class:`MarkerSpanRule` - the template opens every assistant message with a fixed
  header and closes it with one end token. We look for the header's token ids and
  supervise from the token right after it through the end token, inclusive. This
  is the Kimi-K2.5 rule (``KIMI_K25_RULE``). Working on ids is exact because the
  header and end are special tokens: text never merges across them, and control
  tokens typed inside message text are encoded as plain text (see ``chat.py``), so
  a user cannot fake a header.
* ``"generation"`` - the template marks assistant text with ``{% generation %}``
  and transformers returns the mask (``return_assistant_tokens_mask``).

``resolve_mask_rule`` picks one for a tokenizer when the caller says ``"auto"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from hs_dataset.errors import SourceError
from hs_dataset.sources.report import MalformedRowError

__all__ = ["KIMI_K25_RULE", "CompiledMarkerRule", "MarkerSpanRule", "MaskRule", "has_generation_markers", "resolve_mask_rule"]

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True)
class MarkerSpanRule:
    """Supervise each span that starts right after ``header`` and ends at ``end`` (inclusive)."""

    name: str
    header: str
    end: str

    def compile(self, tokenizer) -> CompiledMarkerRule:
        header_ids = tuple(tokenizer.encode(self.header, add_special_tokens=False))
        end_ids = tokenizer.encode(self.end, add_special_tokens=False)
        if not header_ids:
            raise SourceError(f"mask rule {self.name}: header {self.header!r} encodes to no tokens")
        if len(end_ids) != 1:
            raise SourceError(
                f"mask rule {self.name}: end marker {self.end!r} must be a single token of this tokenizer, "
                f"got {len(end_ids)} tokens; add it as a special token or pick another rule"
            )
        return CompiledMarkerRule(self, header_ids, end_ids[0])


KIMI_K25_RULE = MarkerSpanRule(name="kimi-k2.5", header="<|im_assistant|>assistant<|im_middle|>", end="<|im_end|>")


@dataclass(frozen=True)
class CompiledMarkerRule:
    """A :class:`MarkerSpanRule` bound to one tokenizer's ids."""

    rule: MarkerSpanRule
    header_ids: tuple[int, ...]
    end_id: int

    def spans(self, ids: list[int]) -> list[tuple[int, int]]:
        """Half-open ``[start, stop)`` supervised spans; every header must be closed before the next one."""
        spans: list[tuple[int, int]] = []
        h, n, i = self.header_ids, len(self.header_ids), 0
        first = h[0]
        while True:
            try:
                i = ids.index(first, i)
            except ValueError:
                return spans
            if tuple(ids[i : i + n]) != h:
                i += 1
                continue
            start = i + n
            try:
                stop = ids.index(self.end_id, start) + 1
            except ValueError:
                raise MalformedRowError(f"assistant turn at token {start} has no {self.rule.end!r}") from None
            if first in ids[start:stop] and _contains(ids, h, start, stop):
                raise MalformedRowError(f"assistant turn at token {start} is not closed by {self.rule.end!r} before the next one")
            spans.append((start, stop))
            i = stop

    def mask(self, ids: list[int], expected_turns: int | None = None) -> list[bool]:
        """The loss mask; ``expected_turns`` (assistant messages) guards against a template/rule mismatch."""
        spans = self.spans(ids)
        if expected_turns is not None and len(spans) != expected_turns:
            raise MalformedRowError(
                f"found {len(spans)} assistant headers {self.rule.header!r} for {expected_turns} assistant messages; "
                f"the chat template does not match mask rule {self.rule.name}"
            )
        mask = [False] * len(ids)
        for start, stop in spans:
            mask[start:stop] = [True] * (stop - start)
        return mask


def _contains(ids: list[int], pattern: tuple[int, ...], start: int, stop: int) -> bool:
    n = len(pattern)
    return any(tuple(ids[j : j + n]) == pattern for j in range(start, stop - n + 1))


MaskRule = Literal["auto", "kimi", "generation"] | MarkerSpanRule


def has_generation_markers(template: str | None) -> bool:
    return bool(template) and bool(_GENERATION_TAG.search(template))


def _template_text(tokenizer, chat_template: str | None) -> str | None:
    if chat_template is not None:
        return chat_template
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates; transformers uses "default" unless tools are given
        template = template.get("default") or next(iter(template.values()), None)
    return template


def _has_tokens(tokenizer, tokens: tuple[str, ...]) -> bool:
    """``all(t in tokenizer.get_vocab())`` without building the vocabulary (slow for a large one) in the common case.

    A token counts as present when it maps to an id that maps back to it; unknown tokens give None, the unk id or an
    exception depending on the tokenizer, so anything short of that round trip is settled by ``get_vocab()``.
    """
    try:
        if all(_round_trips(tokenizer, token) for token in tokens):
            return True
    except Exception:  # slow tokenizers may raise (KeyError, ...) for a token they do not know
        pass
    vocab = tokenizer.get_vocab()
    return all(token in vocab for token in tokens)


def _round_trips(tokenizer, token: str) -> bool:
    token_id = tokenizer.convert_tokens_to_ids(token)
    return isinstance(token_id, int) and tokenizer.convert_ids_to_tokens(token_id) == token


def resolve_mask_rule(tokenizer, rule: MaskRule = "auto", chat_template: str | None = None) -> Literal["generation"] | MarkerSpanRule:
    """Turn ``"auto"``/``"kimi"`` into a concrete rule, checking the tokenizer can use it."""
    template = _template_text(tokenizer, chat_template)
    if not template:
        raise SourceError(
            "the tokenizer has no chat template, so conversations cannot be rendered; "
            "pass chat_template=... or use pre-tokenized rows (input_ids [+ loss_mask])"
        )
    if isinstance(rule, MarkerSpanRule):
        return rule
    if rule == "kimi":
        return KIMI_K25_RULE
    if rule == "generation":
        if not has_generation_markers(template):
            raise SourceError("mask='generation' needs a chat template with {% generation %} markers; this one has none")
        return "generation"
    if rule != "auto":
        raise ValueError(f"mask must be 'auto', 'kimi', 'generation' or a MarkerSpanRule, got {rule!r}")
    if has_generation_markers(template):
        return "generation"
    if "<|im_assistant|>" in template and _has_tokens(tokenizer, ("<|im_assistant|>", "<|im_middle|>", "<|im_end|>")):
        return KIMI_K25_RULE
    raise SourceError(
        "cannot tell which tokens of this chat template belong to the assistant: it has no {% generation %} "
        "markers and is not Kimi-shaped; pass mask=MarkerSpanRule(name, header, end) with the assistant header "
        "text and the end-of-turn token"
    )
