"""``iter_samples``: rows in, :class:`TokenizedSample` s out, every other outcome counted.

This is the one place where the per-row policies meet: sample ids and duplicates,
resume skipping, chat vs. pre-tokenized rows, ``max_length`` overflow, the line and
character caps that keep memory bounded by ``max_length`` (docs/SOURCES.md, "Size
limits"), rows with nothing to learn, and strict vs. lenient handling of bad rows.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, Literal

import torch

from hs_dataset.config import LimitsSection
from hs_dataset.errors import SourceError
from hs_dataset.formats.vocabulary import describe_outside, outside_vocabulary
from hs_dataset.model.tokenizer import load_tokenizer
from hs_dataset.sample import TokenizedSample
from hs_dataset.sources.char_cap import conversation_chars, encode_capped, output_char_cap, row_char_cap
from hs_dataset.sources.chat import ChatTokenizer, TemplateFailedError
from hs_dataset.sources.masking import MaskRule, resolve_mask_rule
from hs_dataset.sources.messages import has_chat, normalize_conversation
from hs_dataset.sources.pretokenized import MissingMaskPolicy, is_pretokenized, read_pretokenized
from hs_dataset.sources.report import IssueKind, MalformedRowError, OversizedRowError, RowIssue, SourceReport
from hs_dataset.sources.row_bounds import check_row_bounds
from hs_dataset.sources.rows import BadRow, RowSource, Source, open_source
from hs_dataset.sources.sample_ids import IdPolicy, sample_id_for
from hs_dataset.sources.shapes import apply_columns, detect_shape, to_chat_row
from hs_dataset.sources.template_guard import RowBudget, TemplateBoundError

__all__ = ["BYTES_PER_CHAR", "Overflow", "SampleRules", "iter_samples", "line_byte_cap", "load_samples"]

BYTES_PER_CHAR = 64  # a JSONL line may hold this many bytes per capped character (escapes, markup)
MIN_LINE_BYTES = 16 << 20

Overflow = Literal["truncate", "drop"]
_DEFAULT_MASK_NOTE = (
    "pre-tokenized rows without loss_mask are supervised on every token (missing_loss_mask='all'); their count is pretokenized_default_mask"
)


class _Skip(Exception):
    """Internal: this row is accounted for in the report and yields nothing."""


def _load_tokenizer(tokenizer: Any, trust_remote_code: bool) -> Any:
    """A tokenizer object as is; a path through the one loader (remote code only when the caller allows it)."""
    if isinstance(tokenizer, (str, PathLike)):
        return load_tokenizer(tokenizer, trust_remote_code=trust_remote_code)
    return tokenizer


def line_byte_cap(max_length: int) -> int:
    """Bytes a JSONL line may have before it is skipped unread: ``max(16 MiB, 64 * row_char_cap(max_length))``."""
    return max(MIN_LINE_BYTES, BYTES_PER_CHAR * row_char_cap(max_length))


@dataclass(frozen=True)
class SampleRules:
    """How rows become samples: length policy, strictness, ids, loss-mask rule, template, columns.

    ``max_length`` (default 4096, the card's default): rows longer than it are cut to it
    (``overflow="truncate"``, sample marked ``truncated``) or dropped (``"drop"``).
    ``strict``: the first bad row raises :class:`SourceError` instead of being reported.
    ``id_policy``: how sample ids are formed (``index`` or ``content``). ``mask``: the
    loss-mask rule (``auto``: from the template). ``chat_template``/``template_kwargs``:
    rendering instead of the tokenizer's own. ``missing_loss_mask``: pre-tokenized rows
    without a mask are supervised on every token (``all``) or refused (``reject``).
    ``vocab_size``: ids must be below it (the model's vocabulary). ``columns`` maps our
    field names to the source's (``{"messages": "dialog"}``; docs/SOURCES.md).
    ``keep_conversation`` puts the normalized conversation in ``meta["conversation"]``
    (for regeneration). ``limits``: the card's per-row and per-template bounds
    (turns, characters, nesting, template output and time; docs/LIMITS.md).
    ``template_source`` names the template in the message that stops a run whose
    rows all fail in it (default: the tokenizer's).
    """

    max_length: int = 4096
    overflow: Overflow = "truncate"
    strict: bool = False
    id_policy: IdPolicy = "index"
    mask: MaskRule = "auto"
    chat_template: str | None = None
    template_kwargs: Mapping[str, Any] | None = None
    missing_loss_mask: MissingMaskPolicy = "all"
    vocab_size: int | None = None
    columns: Mapping[str, str] = field(default_factory=dict)
    keep_conversation: bool = False
    limits: LimitsSection = field(default_factory=LimitsSection)
    template_source: str | None = None  # where the template comes from, for messages (a card's model.chat_template file)

    def __post_init__(self) -> None:
        if not isinstance(self.max_length, int) or self.max_length < 1:
            raise ValueError(f"max_length must be a positive integer, got {self.max_length!r}")
        if self.overflow not in ("truncate", "drop"):
            raise ValueError(f"overflow must be 'truncate' or 'drop', got {self.overflow!r}")
        if self.missing_loss_mask not in ("all", "reject"):
            raise ValueError(f"missing_loss_mask must be 'all' or 'reject', got {self.missing_loss_mask!r}")
        object.__setattr__(self, "columns", dict(self.columns or {}))


class _Run:
    """State of one pass: the rules, the lazily built chat encoder, seen ids and the report."""

    def __init__(self, tokenizer: Any, report: SourceReport, rules: SampleRules, skip_ids: Container[str] | None, rows: RowSource) -> None:
        self.tokenizer = tokenizer
        self.report = report
        self.rules = rules
        self.skip_ids = skip_ids
        self.rows = rows
        self.seen: dict[str, int] = {}
        self._chat: ChatTokenizer | None = None
        self.char_limit = rules.limits.row_chars or line_byte_cap(rules.max_length)
        self.rendered = False  # some row got through the chat template
        self.failing: tuple[tuple[str, str], int] | None = None  # how the rows so far failed in the template, and how many

    def issue(self, row_index: int, kind: IssueKind, reason: str, sample_id: str | None) -> _Skip:
        issue = RowIssue(row_index, kind, reason, sample_id, file=self.rows.file, line=self.rows.line)
        self.report.add_issue(issue)
        if self.rules.strict and kind != "dropped_too_long":
            raise SourceError(issue.describe(self.report.source_name) + " (strict mode; set strict=False to skip and report such rows)")
        return _Skip()

    def chat(self) -> ChatTokenizer:
        if self._chat is None:
            if self.tokenizer is None:
                raise SourceError("conversation rows need a tokenizer with a chat template; pass tokenizer=...")
            rule = resolve_mask_rule(self.tokenizer, self.rules.mask, self.rules.chat_template)
            self._chat = ChatTokenizer(
                self.tokenizer,
                rule,
                self.rules.chat_template,
                self.rules.template_kwargs,
                self.rules.limits,
                max_output_chars=output_char_cap(self.rules.max_length),
            )
        return self._chat

    def template_trouble(self, exc: Exception) -> None:
        """Stop the run, naming the template, once ``limits.template_failures`` rows in a row failed in it the same way
        and none ever got through: every further row would cost up to ``template_seconds`` for the same answer."""
        if self.rendered:
            return
        way = (type(exc).__name__, re.sub(r"\d+", "N", str(exc))[:300])
        count = self.failing[1] + 1 if self.failing is not None and self.failing[0] == way else 1
        self.failing = (way, count)
        if count >= self.rules.limits.template_failures:
            which = self.rules.template_source or (
                "the chat_template given"
                if self.rules.chat_template
                else (f"the chat template of the tokenizer {getattr(self.tokenizer, 'name_or_path', '') or ''}".rstrip())
            )
            raise SourceError(
                f"{which} failed on the first {count} rows the same way and no row got through it: {exc}; "
                "fix the template (or raise limits.template_failures in the card to go on skipping such rows)"
            )

    def vocab_size(self) -> int:
        if self.rules.vocab_size is not None:
            return int(self.rules.vocab_size)
        if self.tokenizer is None:
            raise SourceError("pre-tokenized rows are checked against the vocabulary; pass tokenizer=... or vocab_size=...")
        return len(self.tokenizer)

    def encode(self, row: Mapping[str, Any]) -> tuple[list[int], list[bool], dict[str, Any]]:
        shape = detect_shape(row)
        self.report.count_shape(shape, list(row) if shape == "unknown" else None)
        depth = self.rules.limits.row_depth
        if shape not in ("pretokenized", "unknown"):
            row = to_chat_row(row, shape, depth)
        if is_pretokenized(row):
            ids, mask, given = read_pretokenized(row, vocab_size=self.vocab_size(), missing_mask=self.rules.missing_loss_mask)
            if not given:
                self.report.pretokenized_default_mask += 1
                self.report.add_note(_DEFAULT_MASK_NOTE)
            return ids, mask, {"format": "pretokenized", "loss_mask_given": given}
        if has_chat(row):
            conv = normalize_conversation(row, depth)
            chat = self.chat()
            meta = {"format": "chat", "shape": shape, "mask_rule": chat.rule_name, "assistant_messages": conv.num_assistant}
            if self.rules.keep_conversation:
                meta["conversation"] = conv  # the regeneration stage re-renders it turn by turn
            limit = row_char_cap(self.rules.max_length)
            budget = RowBudget(self.rules.limits)  # the row's template time, across its renders
            if conversation_chars(conv) <= limit:
                ids, mask = chat.encode(conv, budget)
                self.rendered = True
                return ids, mask, meta
            ids, mask = encode_capped(lambda cut: chat.encode(cut, budget), conv, limit, self.rules.max_length)
            self.rendered = True
            self.report.char_capped += 1
            return ids, mask, {**meta, "char_capped": limit}
        raise MalformedRowError(
            f"row has neither 'messages' (or 'conversations') nor 'input_ids': unknown shape, keys {sorted(row)[:20]} "
            "(map the source's column names with --columns, e.g. --columns messages=dialog)"
        )

    def sample(self, row_index: int, row: Mapping[str, Any] | BadRow) -> TokenizedSample | None:
        name = self.report.source_name
        if not isinstance(row, BadRow):
            row = apply_columns(row, self.rules.columns)
        if isinstance(row, BadRow):
            raise self.issue(row_index, row.kind, row.reason, sample_id_for(None, row_index, name))  # type: ignore[arg-type]
        try:  # before anything copies or walks the row (ids, normalizing, rendering)
            check_row_bounds(row, self.rules.limits, self.char_limit)
        except OversizedRowError as exc:
            raise self.issue(row_index, "oversized", str(exc), sample_id_for(None, row_index, name)) from None
        try:
            sid = sample_id_for(row, row_index, name, self.rules.id_policy)
        except MalformedRowError as exc:
            raise self.issue(row_index, "malformed", str(exc), None) from None
        if sid in self.seen:
            raise self.issue(row_index, "malformed", f"duplicate sample id (first used by row {self.seen[sid]})", sid)
        self.seen[sid] = row_index
        skip = self.skip_ids
        if skip is not None and sid in skip:
            self.report.skipped_existing += 1
            return None
        try:
            ids, mask, meta = self.encode(row)
            self.check_vocab(ids)
        except (TemplateBoundError, TemplateFailedError) as exc:
            skip = self.issue(row_index, "oversized" if isinstance(exc, OversizedRowError) else "malformed", str(exc), sid)
            self.template_trouble(exc)
            raise skip from None
        except OversizedRowError as exc:
            raise self.issue(row_index, "oversized", str(exc), sid) from None
        except MalformedRowError as exc:
            raise self.issue(row_index, "malformed", str(exc), sid) from None
        if not any(mask):
            why = "loss_mask is all zero" if meta["format"] == "pretokenized" else "no assistant token to supervise"
            if meta.get("assistant_messages") == 0:
                why = "conversation has no assistant message"
            raise self.issue(row_index, "no_supervised_token", why, sid)
        return self.fit(row_index, sid, ids, mask, meta)

    def check_vocab(self, ids: list[int]) -> None:
        """Rendered ids must fit the model too: a tokenizer may know more tokens than the model embeds (the ids kept
        after ``max_length`` are checked, by the package's one vocabulary check)."""
        vocab = self.rules.vocab_size
        found = outside_vocabulary(ids[: self.rules.max_length], vocab) if vocab is not None else None
        if found is not None:
            raise MalformedRowError(
                f"{describe_outside(found, vocab)} of the model: the tokenizer has more tokens than the model embeds; "
                "use the model's own tokenizer"
            )

    def fit(self, row_index: int, sid: str, ids: list[int], mask: list[bool], meta: dict[str, Any]) -> TokenizedSample:
        """Apply the ``max_length`` overflow policy."""
        max_length, full = self.rules.max_length, len(ids)
        truncated = full > max_length
        if truncated:
            if self.rules.overflow == "drop":
                raise self.issue(row_index, "dropped_too_long", f"{full} tokens > max_length {max_length}", sid)
            ids, mask = ids[:max_length], mask[:max_length]
            if not any(mask):
                raise self.issue(
                    row_index,
                    "no_supervised_token",
                    f"every supervised token lies beyond max_length {max_length} (row has {full} tokens)",
                    sid,
                )
        meta.update(source=self.report.source_name, row_index=row_index, full_length=full)
        return TokenizedSample(
            sample_id=sid,
            input_ids=torch.tensor(ids, dtype=torch.int64),
            loss_mask=torch.tensor(mask, dtype=torch.bool),
            truncated=truncated,
            meta=meta,
        )


def iter_samples(
    source: Source,
    tokenizer: Any = None,
    rules: SampleRules | None = None,
    *,
    report: SourceReport | None = None,
    source_name: str | None = None,
    skip_ids: Container[str] | None = None,
    trust_remote_code: bool = False,
) -> Iterator[TokenizedSample]:
    """Yield one :class:`TokenizedSample` per usable row of ``source``, in source order, under ``rules``.

    ``source``: a .jsonl/.json/.parquet file, a ``save_to_disk`` directory, a
    ``datasets.Dataset``/``IterableDataset`` or a list of dicts. ``tokenizer``: a
    transformers tokenizer or a local path to one (only pre-tokenized sources may
    pass ``None``, with ``rules.vocab_size``). ``rules``: how rows become samples
    (:class:`SampleRules`; default ``SampleRules()``). Malformed rows and rows without a
    supervised token are recorded in ``report`` (pass your own :class:`SourceReport` to
    read it) and skipped; with ``rules.strict`` the first one raises :class:`SourceError`.
    ``source_name`` names the source in sample ids and messages (default: from the source).
    Ids in ``skip_ids`` (already stored, when resuming) are counted and not tokenized.
    ``trust_remote_code`` (the card's ``model.trust_remote_code``) lets a tokenizer given
    by path run the Python its snapshot ships (Kimi-K2.5's tiktoken tokenizer); without
    it such a snapshot is refused in one line naming ``--trust-remote-code``.
    """
    rules = rules if rules is not None else SampleRules()
    rows = open_source(source, source_name, max_line_bytes=line_byte_cap(rules.max_length))
    report = report if report is not None else SourceReport()
    report.source_name = rows.name
    report.total_rows = rows.total
    run = _Run(_load_tokenizer(tokenizer, trust_remote_code), report, rules, skip_ids, rows)
    for row_index, row in rows:
        report.rows_read += 1
        try:
            sample = run.sample(row_index, row)
        except _Skip:
            continue
        if sample is None:
            continue
        report.samples_out += 1
        report.truncated += int(sample.truncated)
        yield sample


def load_samples(
    source: Source,
    tokenizer: Any = None,
    rules: SampleRules | None = None,
    *,
    source_name: str | None = None,
    skip_ids: Container[str] | None = None,
    trust_remote_code: bool = False,
) -> tuple[list[TokenizedSample], SourceReport]:
    """Eager :func:`iter_samples`: all samples plus the finished report (small sources, tests)."""
    report = SourceReport()
    samples = list(
        iter_samples(
            source, tokenizer, rules, report=report, source_name=source_name, skip_ids=skip_ids, trust_remote_code=trust_remote_code
        )
    )
    return samples, report
