"""Per-row bounds checked before a row is expanded: messages, characters of text, nesting depth.

Everything after this check (sample ids, normalizing, rendering, tokenizing) copies or
walks the row, some of it recursively, so without it a row's own size would decide how
much memory, time and stack that takes (rendering grows with the number of turns,
deeply nested tool-call arguments overflow the stack). The bounds come from the card's
``limits`` section (docs/LIMITS.md); a row over one is an ``oversized`` issue naming the
field, its size and the bound. The walk is iterative and stops at the first bound
crossed, so checking costs at most the bounds, not the row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hs_dataset.config import LimitsSection
from hs_dataset.sources.report import OversizedRowError

__all__ = ["TURN_FIELDS", "bounded_json", "check_depth", "check_row_bounds"]

TURN_FIELDS = ("messages", "conversations", "data")  # the lists whose entries are turns (docs/SOURCES.md shapes)


def _path(parts: tuple[Any, ...]) -> str:
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)
    return text.lstrip(".") or "row"


def _children(value: Any):
    if isinstance(value, Mapping):
        return value.items()
    if isinstance(value, (list, tuple)):
        return enumerate(value)
    return ()


def check_depth(value: Any, max_depth: int, where: str) -> None:
    """Refuse ``value`` nested deeper than ``max_depth`` lists/objects (iteratively, no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, (Mapping, list, tuple)):
            continue
        if depth > max_depth:
            raise OversizedRowError(
                f"{where}: nested more than {max_depth} levels deep, over the row_depth bound (raise limits.row_depth in the card)"
            )
        stack.extend((child, depth + 1) for _, child in _children(node))


def check_row_bounds(row: Mapping[str, Any], limits: LimitsSection, char_limit: int) -> None:
    """Raise :class:`OversizedRowError` when ``row`` has too many turns, characters or levels of nesting."""
    for key in TURN_FIELDS:
        turns = row.get(key)
        if isinstance(turns, (list, tuple)) and len(turns) > limits.row_turns:
            raise OversizedRowError(
                f"{key}: {len(turns)} turns, over the {limits.row_turns}-turn bound (raise limits.row_turns in the card, or split the row)"
            )
    chars = 0
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(row, 1, ())]
    while stack:
        node, depth, parts = stack.pop()
        if depth > limits.row_depth:
            raise OversizedRowError(
                f"{_path(parts)}: nested more than {limits.row_depth} levels deep, over the row_depth bound (raise limits.row_depth in the card)"
            )
        for key, child in _children(node):
            if isinstance(key, str):
                chars += len(key)
            if isinstance(child, str):
                chars += len(child)
            elif isinstance(child, (Mapping, list, tuple)):
                stack.append((child, depth + 1, (*parts, key)))
            if chars > char_limit:
                raise OversizedRowError(
                    f"{_path((*parts, key))}: the row has more than {char_limit} characters of text, over the row_chars bound "
                    "(raise limits.row_chars in the card, or shorten the row)"
                )


def bounded_json(text: str, max_depth: int, where: str) -> Any:
    """``json.loads(text)`` that refuses nesting deeper than ``max_depth`` in one line instead of overflowing the stack."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise OversizedRowError(f"{where}: JSON nested too deeply to parse, over the row_depth bound (limits.row_depth)") from None
    check_depth(value, max_depth, where)
    return value
