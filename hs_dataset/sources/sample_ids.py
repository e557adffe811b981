"""Stable sample ids: resume skips ids already stored, so the same row must get the same id every run.

A row's own ``id`` wins. Otherwise the id is derived from the source: either its
position (``"<source>:<row-index>"``, the default; stable as long as the file is only
appended to) or its content (``"<source>:<sha256-prefix>"``; stable under reordering,
but identical rows collide and are reported as duplicates). The content hash drops
``None`` values first, so a JSONL row and the same row loaded through ``datasets``
(which fills absent keys with ``None``) hash the same.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from hs_dataset.sample import MAX_SAMPLE_ID_CHARS
from hs_dataset.sources.messages import drop_nones
from hs_dataset.sources.report import MalformedRowError

__all__ = ["IdPolicy", "sample_id_for"]

IdPolicy = Literal["index", "content"]
_ID_KEYS = ("id",)


def _content_hash(row: Mapping[str, Any]) -> str:
    body = {k: v for k, v in row.items() if k not in _ID_KEYS}
    text = json.dumps(drop_nones(body), sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def sample_id_for(row: Mapping[str, Any] | None, row_index: int, source_name: str, policy: IdPolicy = "index") -> str:
    """The row's ``id`` if it has one, else an id derived per ``policy``."""
    if row is not None:
        own = row.get("id")
        if own is not None:
            if isinstance(own, bool) or not isinstance(own, (str, int)) or own == "":
                raise MalformedRowError(f"id: must be a non-empty string or an integer, got {own!r}")
            text = str(own)
            if len(text) > MAX_SAMPLE_ID_CHARS:
                raise MalformedRowError(
                    f"id: {len(text)} characters ({text[:40]!r}...), at most {MAX_SAMPLE_ID_CHARS}; shorten the row's id"
                )
            return text
    if policy == "content" and row is not None:
        return f"{source_name}:{_content_hash(row)}"
    if policy not in ("index", "content"):
        raise ValueError(f"id_policy must be 'index' or 'content', got {policy!r}")
    return f"{source_name}:{row_index}"
