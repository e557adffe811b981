"""Render a normalized conversation with the tokenizer's own chat template, and mask it.

All formatting is done by ``tokenizer.apply_chat_template``: the template is the
single source of truth for what the served model sees, so we never format turns in
Python. For marker rules we ask transformers to encode control tokens that occur
*inside* message text as plain text (``sanitize_control_tokens``, where the
installed transformers has it); otherwise a user message containing the literal
string ``<|im_end|>`` would become the real control token and corrupt both the
prompt and the mask. Where it is unavailable, such rows are rejected instead.

Sanitizing costs transformers two rebuilds of ``added_tokens_decoder`` per call, and
it changes nothing for a row whose strings hold no control token and no marker
character, so such rows skip it (``_control_text_pattern``, ``_needs_sanitize``;
:meth:`ChatTokenizer.may_need_sanitizing` asks it for one rendering).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from hs_dataset.config import LimitsSection
from hs_dataset.sources.masking import CompiledMarkerRule, MarkerSpanRule
from hs_dataset.sources.messages import Conversation
from hs_dataset.sources.report import MalformedRowError
from hs_dataset.sources.template_guard import RowBudget, bounded_render, harden_template

__all__ = ["ChatTokenizer", "TemplateFailedError"]


class TemplateFailedError(MalformedRowError):
    """The chat template itself refused the row (``raise_exception``, a type it cannot handle, ...)."""


@cache
def _supports_sanitize(cls: type) -> bool:
    try:
        return "sanitize_control_tokens" in inspect.signature(cls.apply_chat_template).parameters
    except (TypeError, ValueError):
        return False


def _control_text_pattern(tokenizer: Any, templates: list[Any]) -> re.Pattern[str] | None:
    """A regex for every string that may make ``sanitize_control_tokens`` change a row; None: always sanitize.

    transformers' control tokens (``_get_control_tokens``) are the special added tokens plus non-special added tokens
    that the template contains (non-whitespace) or ``chat_control_tokens`` lists; we take a superset of them, computed
    once, plus the private marker characters, which ``mark_control_tokens`` strips from user strings. A template or
    token holding a marker character would be split by ``encode_marked_chat`` even in a clean row: no fast path then.
    """
    try:
        from transformers.utils.chat_template_utils import _CONTROL_TOKEN_END, _CONTROL_TOKEN_START
    except ImportError:  # a transformers whose sanitizing we have not checked
        return None
    markers = (_CONTROL_TOKEN_START, _CONTROL_TOKEN_END)
    listed = set(getattr(tokenizer, "chat_control_tokens", None) or ())
    tokens = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special or not t.content.isspace() or t.content in listed}
    texts = [*tokens, *(v for t in templates for v in (t.values() if isinstance(t, Mapping) else [t]) if isinstance(v, str))]
    if any(m in text for text in texts for m in markers):
        return None
    return re.compile("|".join(map(re.escape, [*sorted(tokens, key=len, reverse=True), *markers])))


def _needs_sanitize(value: Any, pattern: re.Pattern[str]) -> bool:
    """Whether ``mark_control_tokens`` could change ``value``: a matching string, or a type it would rebuild.

    Tuples become lists there (and render differently); anything but plain JSON values is walked by transformers in
    ways we do not mirror, so it takes the sanitize path too.
    """
    if isinstance(value, str):
        return pattern.search(value) is not None
    if isinstance(value, Mapping):
        return any(_needs_sanitize(v, pattern) for v in value.values())
    if isinstance(value, list):
        return any(_needs_sanitize(v, pattern) for v in value)
    return not (value is None or isinstance(value, (bool, int, float)))


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


@dataclass
class ChatTokenizer:
    """Bind a tokenizer, a concrete mask rule and template options; turn conversations into (ids, mask)."""

    tokenizer: Any
    rule: Literal["generation"] | MarkerSpanRule
    chat_template: str | None = None
    template_kwargs: Mapping[str, Any] | None = None
    limits: LimitsSection = field(default_factory=LimitsSection)
    max_output_chars: int | None = None  # what one render may output (None: limits.template_chars)

    def __post_init__(self) -> None:
        self._hardened: set[str] = set()
        self._compiled: CompiledMarkerRule | None = None
        if isinstance(self.rule, MarkerSpanRule):
            self._compiled = self.rule.compile(self.tokenizer)
        self._sanitize = self._compiled is not None and _supports_sanitize(type(self.tokenizer))
        # Rows matching nothing here render and encode identically without sanitizing (see _control_text_pattern).
        self._control_text: re.Pattern[str] | None = None
        if self._sanitize:
            templates = [self.chat_template, getattr(self.tokenizer, "chat_template", None)]
            pattern = _control_text_pattern(self.tokenizer, templates)
            if pattern is not None and not _needs_sanitize(dict(self.template_kwargs or {}), pattern):
                self._control_text = pattern

    @property
    def rule_name(self) -> str:
        return "generation" if self.rule == "generation" else self.rule.name

    @property
    def end_of_turn_id(self) -> int | None:
        """The marker rule's end-of-turn token id (``<|im_end|>``); None under the ``generation`` rule."""
        return self._compiled.end_id if self._compiled is not None else None

    @property
    def sanitizes(self) -> bool:
        """Whether control tokens inside message text are encoded as plain text (``sanitize_control_tokens``)."""
        return self._sanitize

    def may_need_sanitizing(self, messages: Any, tools: Any) -> bool:
        """Whether sanitizing could change the rendering of ``messages`` and ``tools``: it is costly, so asked first."""
        pattern = self._control_text
        return pattern is None or _needs_sanitize(messages, pattern) or _needs_sanitize(tools, pattern)

    def _harden(self, tools: Any) -> None:
        """Put the size guard into the template transformers will render for these tools (once per template)."""
        get = getattr(self.tokenizer, "get_chat_template", None)
        source = get(self.chat_template, tools) if get is not None else self.chat_template
        if isinstance(source, str) and source not in self._hardened:
            harden_template(source, self.limits)
            self._hardened.add(source)

    def apply(
        self,
        messages: list[dict[str, Any]],
        tools: Any,
        *,
        what: str = "this row",
        budget: RowBudget | None = None,
        **extra: Any,
    ) -> Mapping[str, Any]:
        """``apply_chat_template`` (tokenized, as a dict) within the card's template bounds; one-line errors naming ``what``.

        ``budget``: the row's template time, shared by all of its renders (default: this render's own).
        """
        extra.setdefault("add_generation_prompt", False)
        kwargs = {**(self.template_kwargs or {}), **extra}
        try:
            self._harden(tools)
            return bounded_render(
                self.limits,
                lambda: self.tokenizer.apply_chat_template(
                    messages,
                    tools=tools,
                    chat_template=self.chat_template,
                    tokenize=True,
                    return_dict=True,
                    **kwargs,
                ),
                budget=budget,
                output_chars=self.max_output_chars,
            )
        except MalformedRowError:
            raise
        except Exception as exc:  # the template itself refused the row (raise_exception, bad types, ...)
            text = str(exc).strip().splitlines()
            raise TemplateFailedError(f"the chat template failed on {what}: {type(exc).__name__}: {text[0][:500] if text else ''}") from exc

    def _apply(self, conv: Conversation, budget: RowBudget | None, **extra: Any) -> Mapping[str, Any]:
        return self.apply(conv.messages, conv.tools, budget=budget, **extra)

    def _reject_control_text(self, conv: Conversation) -> None:
        markers = (self.rule.header, self.rule.end)
        for text in _strings({"messages": conv.messages, "tools": conv.tools}):
            for marker in markers:
                if marker in text:
                    raise MalformedRowError(
                        f"message text contains the control marker {marker!r}; this transformers version cannot "
                        "encode it as plain text (needs apply_chat_template(sanitize_control_tokens=...))"
                    )

    def encode(self, conv: Conversation, budget: RowBudget | None = None) -> tuple[list[int], list[bool]]:
        """Token ids and the assistant-only mask of the full (untruncated) conversation (``budget``: see :meth:`apply`)."""
        if self._compiled is None:
            out = self._apply(conv, budget, return_assistant_tokens_mask=True)
            ids = list(out["input_ids"])
            return ids, [bool(x) for x in out["assistant_masks"]]
        if self._sanitize:
            if self.may_need_sanitizing(conv.messages, conv.tools):
                out = self._apply(conv, budget, sanitize_control_tokens=True)
            else:
                out = self._apply(conv, budget)
        else:
            self._reject_control_text(conv)
            out = self._apply(conv, budget)
        ids = list(out["input_ids"])
        return ids, self._compiled.mask(ids, expected_turns=conv.num_assistant)
