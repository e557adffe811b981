"""Pydantic's validation errors turned into :class:`CardError` lines: ``file: key.path: what is wrong; the fix``.

A card's reader never sees a pydantic error: each problem names the key path as it is
written in the YAML (a discriminator tag is not a key), and an unknown key gets the
closest known one.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError

from hs_dataset.errors import HsDatasetError

__all__ = ["DOCS_HINT", "CardError", "card_error"]

DOCS_HINT = "every key is documented in docs/CARDS.md"


class CardError(HsDatasetError, ValueError):
    """A card is missing, malformed or inconsistent; the message names the file, the key and the fix."""


def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> ``X``; ``Annotated[X, ...]`` -> ``X``."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
    return annotation


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _backend_for(annotation: Any, tag: str) -> type[BaseModel] | None:
    """The member of a discriminated union whose ``name`` is ``tag``."""
    for member in typing.get_args(annotation):
        if _is_section(member) and "name" in member.model_fields and tag in typing.get_args(member.model_fields["name"].annotation):
            return member
    return None


def _walk(loc: tuple[Any, ...], root: type[BaseModel]) -> tuple[str, type[BaseModel] | None]:
    """An error location in ``root`` -> (dotted key path, the section holding its last key)."""
    path, annotation, holder = "", root, None
    for part in loc:
        annotation = _unwrap(annotation)
        if _is_section(annotation):
            holder = annotation
            field = annotation.model_fields.get(str(part))
            path = f"{path}.{part}" if path else str(part)
            annotation = field.annotation if field is not None else None
        elif typing.get_origin(annotation) in (Union, types.UnionType) and isinstance(part, str):
            annotation = _backend_for(annotation, part)  # a discriminator tag, not a key
        elif isinstance(part, int):
            path, annotation = f"{path}[{part}]", (typing.get_args(annotation) or (None,))[0]
        else:
            args = typing.get_args(annotation)
            path, annotation = f"{path}.{part}", args[-1] if args else None
    return path or "(top level)", holder


def _got(err: Mapping[str, Any]) -> str:
    value = err.get("input")
    shown = repr(value)
    return f", got {shown if len(shown) <= 80 else shown[:77] + '...'}"


_EXPECTED = {
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string (quote it in YAML)",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be a mapping (a YAML section)",
    "model_type": "must be a mapping (a YAML section)",
    "model_attributes_type": "must be a mapping (a YAML section)",
    "none_required": "must be null",
}


def _problem(err: Mapping[str, Any], root: type[BaseModel]) -> str:
    """One pydantic error -> ``key.path: what is wrong; how to fix it``."""
    kind, ctx = err["type"], err.get("ctx") or {}
    path, holder = _walk(tuple(err["loc"]), root)
    if kind == "extra_forbidden":
        key = str(err["loc"][-1])
        known = sorted(holder.model_fields) if holder is not None else []
        close = difflib.get_close_matches(key, known, n=1)
        fix = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(known)}"
        return f"{path}: unknown key; {fix}"
    if kind == "missing":
        return f"{path}: required key is missing"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tags = ctx.get("expected_tags", "'hf', 'sglang'")
        what = f"unknown backend {ctx['tag']!r}" if kind == "union_tag_invalid" else "missing"
        return f"{path}.name: {what}; use one of {tags}"
    if kind == "value_error":
        return f"{path}: {ctx.get('error', err['msg'])}"
    if kind == "literal_error":
        return f"{path}: must be one of {ctx['expected']}{_got(err)}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
        bound = next(iter(ctx.values()))
        return f"{path}: must be {op} {bound}{_got(err)}"
    if kind == "string_pattern_mismatch":
        return f"{path}: must match {ctx['pattern']}{_got(err)}"
    if kind == "too_short":
        return f"{path}: must not be empty{_got(err)}"
    return f"{path}: {_EXPECTED.get(kind, err['msg'])}{_got(err)}"


def card_error(exc: ValidationError, where: str, root: type[BaseModel]) -> CardError:
    """Every problem of a validation of ``root`` (the card model), one line each, naming ``where``."""
    problems = list(dict.fromkeys(_problem(err, root) for err in exc.errors(include_url=False)))
    lines = [f"{where}: {p}" for p in problems]
    return CardError("\n".join(lines) + f"\n({DOCS_HINT})")
