"""JSON that hs_dataset reads from files and answers it did not write itself: one text, one meaning.

Why not plain ``json.loads``: it keeps the last of two equal keys, where other parsers
keep the first, so a manifest, a regeneration record or a server's answer carrying
``"aux_layer_ids"`` (or ``"output_ids"``) twice means one thing to hs_dataset and another
to a trainer's tool or a proxy; and an integer literal of more than 4,300 digits makes
it raise a bare ``ValueError`` from inside the parser, which no caller names (a manifest
holding one was a traceback in ``verify``). Both are refused here as
:class:`json.JSONDecodeError`, the error every caller already turns into its one line
naming the file. Our writers never write either, so nothing they wrote is refused.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["loads"]


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The object of ``pairs``; a key given twice is refused (another parser would read the other value)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise json.JSONDecodeError(f"key {twice[:60]!r} appears twice in one object (parsers disagree on which counts)", "", 0)
    return out


def loads(data: str | bytes | bytearray) -> Any:
    """``json.loads(data)``, refusing duplicate keys and unreadably long numbers as :class:`json.JSONDecodeError`.

    ``UnicodeDecodeError`` and ``RecursionError`` pass through as from ``json.loads``.
    """
    try:
        return json.loads(data, object_pairs_hook=_one_value_per_key)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except ValueError as exc:  # the interpreter's limit on int literals (sys.get_int_max_str_digits)
        raise json.JSONDecodeError(f"a number too long to read ({' '.join(str(exc).split())[:90]})", "", 0) from None
