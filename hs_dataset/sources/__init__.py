"""The sources stage: chat or pre-tokenized rows -> :class:`~hs_dataset.sample.TokenizedSample`.

See docs/SOURCES.md for the input formats, the loss-mask rules and the report.
"""

from __future__ import annotations

from hs_dataset.sources.iterate import Overflow, SampleRules, iter_samples, load_samples
from hs_dataset.sources.masking import KIMI_K25_RULE, MarkerSpanRule, MaskRule, resolve_mask_rule
from hs_dataset.sources.messages import Conversation, normalize_conversation
from hs_dataset.sources.pretokenized import MissingMaskPolicy
from hs_dataset.sources.report import MalformedRowError, RowIssue, SourceReport
from hs_dataset.sources.rows import RowSource, open_source
from hs_dataset.sources.sample_ids import IdPolicy, sample_id_for

__all__ = [
    "KIMI_K25_RULE",
    "Conversation",
    "IdPolicy",
    "MalformedRowError",
    "MarkerSpanRule",
    "MaskRule",
    "MissingMaskPolicy",
    "Overflow",
    "RowIssue",
    "RowSource",
    "SampleRules",
    "SourceReport",
    "bundled_conversations_path",
    "iter_samples",
    "load_samples",
    "normalize_conversation",
    "open_source",
    "resolve_mask_rule",
    "sample_id_for",
]


def bundled_conversations_path():
    """Path of the conversations the embedded default ships (``hs_dataset/demo/data/conversations.jsonl``)."""
    from importlib import resources
    from pathlib import Path

    return Path(str(resources.files("hs_dataset.demo").joinpath("data", "conversations.jsonl")))
