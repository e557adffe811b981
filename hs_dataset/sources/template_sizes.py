"""How large a template operation's result will be, known from its arguments before it runs.

The size guard (:mod:`.template_guard`) refuses an operation whose result would be over the
bound *before* the operation builds it: a ``replace`` of every character by a thousand, a
``join`` of a list holding one long string a million times, ``tojson`` or ``string`` of
such a list, ``indent`` of a string of a million lines, or ``~`` of parts like those. Each
estimate here is an upper bound of the result's length (characters, or items for a list)
that costs at most the bound to compute: walks stop as soon as they pass it, so sizing a
value costs no more than the operation it stands in front of.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["MATERIALIZING_FILTERS", "call_size", "filter_size", "method_size", "rendered_size"]

_ESCAPE_GROWTH = 6  # one character escaped as ``&#34;`` / ``\u0000``: what html, JSON and URL escaping can make of it
_ITEM_CHARS = 4  # what a list or mapping adds per item when written out: ``, `` and quotes, or ``: ``
# Filters that build a list from an iterable (the result holds one reference per item).
MATERIALIZING_FILTERS = frozenset(
    {
        "list",
        "batch",
        "slice",
        "sort",
        "unique",
        "reverse",
        "dictsort",
        "groupby",
        "map",
        "select",
        "reject",
        "selectattr",
        "rejectattr",
        "items",
    }
)


def rendered_size(value: Any, limit: int) -> int:
    """At most how many characters ``str(value)`` (or its JSON) has; stops counting once over ``limit``.

    Strings count their length; lists, tuples and mappings their items' sizes plus a few
    characters each; anything else the length of its ``repr`` class name plus a little (numbers,
    booleans, None). A value referenced many times counts each time, as writing it out would.
    """
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, Mapping):
            total += _ITEM_CHARS * len(item) + 2
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += _ITEM_CHARS * len(item) + 2
            stack.extend(item)
        elif isinstance(item, range):
            total += len(item) * (len(str(item.stop)) + 2) + 2
        else:
            total += 32
    return total


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _replace_size(s: Any, old: Any, new: Any, count: Any = None) -> int | None:
    if not isinstance(s, str) or not isinstance(old, str) or not isinstance(new, str):
        return None
    found = len(s) + 1 if old == "" else s.count(old)
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        found = min(found, count)
    return len(s) + found * max(0, len(new) - len(old))


def _join_size(items: Any, sep: Any, limit: int) -> int | None:
    if isinstance(items, str):
        return len(items) * (1 + len(_text(sep)))
    if not isinstance(items, (list, tuple, Mapping)):
        return None
    return rendered_size(items, limit) + len(items) * len(_text(sep))


def _indent_size(s: Any, width: Any = 4) -> int | None:
    if not isinstance(s, str):
        return None
    pad = width if isinstance(width, int) and not isinstance(width, bool) else len(_text(width))
    return len(s) + (s.count("\n") + 1) * abs(pad)


def _format_size(s: Any, args: tuple[Any, ...], kwargs: dict[str, Any], limit: int) -> int:
    return len(_text(s)) + rendered_size(list(args), limit) + rendered_size(kwargs, limit)


def _lipsum_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """``lipsum(n, html, min, max)``: n paragraphs of at most ``max`` words."""
    count = args[0] if args else kwargs.get("n", 5)
    words = args[3] if len(args) > 3 else kwargs.get("max", 100)
    count = count if isinstance(count, int) and not isinstance(count, bool) else 5
    words = words if isinstance(words, int) and not isinstance(words, bool) else 100
    return abs(count) * abs(words) * 16


def filter_size(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], limit: int) -> int | None:
    """The largest result filter ``name`` can build from ``args`` (the filtered value first), or None: not an amplifier."""
    if not args:
        return None
    value, rest = args[0], args[1:]
    if name == "join":
        return _join_size(value, rest[0] if rest else kwargs.get("d", ""), limit)
    if name == "replace":
        return _replace_size(value, *rest[:3], **{k: v for k, v in kwargs.items() if k == "count"})
    if name in ("tojson", "string", "pprint", "urlencode", "xmlattr", "escape", "e", "forceescape"):
        return rendered_size(value, limit) * _ESCAPE_GROWTH
    if name == "indent":
        return _indent_size(value, rest[0] if rest else kwargs.get("width", 4))
    if name in ("wordwrap", "format"):
        return _format_size(value, rest, kwargs, limit) * 2
    if name == "sum":
        return rendered_size(value, limit)
    if name in MATERIALIZING_FILTERS and hasattr(value, "__len__"):
        return len(value)
    return None


# str methods whose result can be far larger than the string: name -> estimate(s, args, kwargs, limit)
_METHODS: dict[str, Callable[[str, tuple[Any, ...], dict[str, Any], int], int | None]] = {
    "replace": lambda s, a, k, limit: _replace_size(s, *a[:3], **{n: v for n, v in k.items() if n == "count"}),
    "join": lambda s, a, k, limit: _join_size(a[0], s, limit) if a else None,
    "format": lambda s, a, k, limit: _format_size(s, a, k, limit),
    "format_map": lambda s, a, k, limit: _format_size(s, a, k, limit),
    "expandtabs": lambda s, a, k, limit: len(s) + s.count("\t") * abs(a[0] if a and isinstance(a[0], int) else 8),
}


def method_size(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any], limit: int) -> int | None:
    """The largest result a bound ``str`` method can build from ``args``, or None: not an amplifier."""
    owner = getattr(method, "__self__", None)
    estimate = _METHODS.get(getattr(method, "__name__", "")) if isinstance(owner, str) else None
    return estimate(owner, args, kwargs, limit) if estimate is not None else None


def call_size(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any], limit: int) -> int | None:
    """The largest result a call builds: str methods (:func:`method_size`) and jinja's ``lipsum`` global."""
    if getattr(function, "__name__", "") == "generate_lorem_ipsum":
        return _lipsum_size(args, kwargs)
    return method_size(function, args, kwargs, limit)
