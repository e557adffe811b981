"""Validate a chat row and bring it to the one message shape chat templates expect.

Rows arrive in slightly different dialects (OpenAI ``messages``, ShareGPT
``conversations`` with ``from``/``value``, reasoning under ``reasoning_content``,
``reasoning`` or ``thinking``) and through different loaders: a ``datasets.Dataset``
fills every key missing in a row with ``None`` and every missing struct field
(tool schemas, dict tool arguments) with ``None``. Normalizing here, with ``None``
meaning "absent" everywhere, is what makes a JSONL file and the same rows in a
``Dataset`` render to identical tokens. Anything we cannot interpret is a
:class:`MalformedRowError` naming the message and field, never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hs_dataset.sources.report import MalformedRowError
from hs_dataset.sources.row_bounds import bounded_json

__all__ = ["ROLES", "Conversation", "drop_nones", "has_chat", "normalize_conversation"]

ROLES = ("system", "user", "assistant", "tool")
_ROLE_ALIASES = {"human": "user", "gpt": "assistant"}  # ShareGPT
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


@dataclass(frozen=True)
class Conversation:
    """Normalized messages (role, content str, optional reasoning_content/tool_calls/tool_call_id/name) + tools."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None

    @property
    def num_assistant(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")


def drop_nones(value: Any) -> Any:
    """Remove ``None``-valued keys recursively (Arrow's fill value for absent struct fields)."""
    if isinstance(value, Mapping):
        return {k: drop_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [drop_nones(v) for v in value]
    return value


def has_chat(row: Mapping[str, Any]) -> bool:
    return row.get("messages") is not None or row.get("conversations") is not None


def _bad(where: str, what: str) -> MalformedRowError:
    return MalformedRowError(f"{where}: {what}")


def _content(where: str, raw: Any) -> str | None:
    """A string, or the joined text of OpenAI content parts; None when absent."""
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, Sequence) and not isinstance(raw, (bytes, bytearray)):
        texts = []
        for j, part in enumerate(raw):
            if not isinstance(part, Mapping):
                raise _bad(f"{where}.content[{j}]", f"a content part must be an object, got {type(part).__name__}")
            kind = part.get("type") or "text"
            if kind != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{where}.content[{j}]", f"only text parts are supported, got type {kind!r}")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(f"{where}.content", f"must be a string or a list of text parts, got {type(raw).__name__}")


def _arguments(where: str, raw: Any, max_depth: int) -> str | dict:
    if isinstance(raw, str):
        try:
            parsed = bounded_json(raw, max_depth, f"{where}.arguments")
        except json.JSONDecodeError as exc:
            raise _bad(where, f"arguments are not valid JSON ({exc.msg})") from None
        if not isinstance(parsed, dict):
            raise _bad(where, f"arguments must encode a JSON object, got {type(parsed).__name__}")
        return raw  # keep the author's exact text: it is what the model should learn to emit
    if isinstance(raw, Mapping):
        return drop_nones(dict(raw))
    if raw is None:
        raise _bad(where, 'missing arguments (use "{}" for a call without arguments)')
    raise _bad(where, f"arguments must be a JSON string or an object, got {type(raw).__name__}")


def _tool_call(where: str, raw: Any, max_depth: int) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _bad(where, f"a tool call must be an object, got {type(raw).__name__}")
    fn = raw.get("function", raw)  # also accept the flat {"name", "arguments"} form
    if not isinstance(fn, Mapping):
        raise _bad(f"{where}.function", f"must be an object, got {type(fn).__name__}")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}.function.name", "missing or not a non-empty string")
    if raw.get("type") not in (None, "function"):
        raise _bad(f"{where}.type", f"only 'function' tool calls are supported, got {raw.get('type')!r}")
    call: dict[str, Any] = {
        "type": "function",
        "function": {"name": name, "arguments": _arguments(f"{where}.function", fn.get("arguments"), max_depth)},
    }
    call_id = raw.get("id")
    if call_id is not None:
        if not isinstance(call_id, str) or not call_id:
            raise _bad(f"{where}.id", "must be a non-empty string")
        call["id"] = call_id
    return call


def _reasoning(where: str, msg: Mapping[str, Any]) -> str | None:
    for key in _REASONING_KEYS:
        value = msg.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise _bad(f"{where}.{key}", f"must be a string, got {type(value).__name__}")
            return value
    return None


def _message(where: str, msg: Any, max_depth: int) -> dict[str, Any]:
    if not isinstance(msg, Mapping):
        raise _bad(where, f"a message must be an object, got {type(msg).__name__}")
    raw_role = msg.get("role", msg.get("from"))
    role = _ROLE_ALIASES.get(raw_role, raw_role) if isinstance(raw_role, str) else raw_role
    if role not in ROLES:
        raise _bad(f"{where}.role", f"unknown role {raw_role!r} (expected one of {', '.join(ROLES)})")
    content = _content(where, msg.get("content") if msg.get("content") is not None else msg.get("value"))
    out: dict[str, Any] = {"role": role}
    if role == "assistant":
        calls = msg.get("tool_calls")
        if calls is not None and (not isinstance(calls, Sequence) or isinstance(calls, (str, bytes))):
            raise _bad(f"{where}.tool_calls", f"must be a list, got {type(calls).__name__}")
        calls = [_tool_call(f"{where}.tool_calls[{j}]", c, max_depth) for j, c in enumerate(calls or ())]
        if content is None and not calls:
            raise _bad(where, "assistant message has neither content nor tool_calls")
        out["content"] = content or ""
        reasoning = _reasoning(where, msg)
        if reasoning is not None:
            out["reasoning_content"] = reasoning
        if calls:
            out["tool_calls"] = calls
        return out
    if content is None:
        raise _bad(where, f"{role} message is missing content")
    out["content"] = content
    if role == "tool":
        call_id = msg.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise _bad(f"{where}.tool_call_id", "a tool result needs the id of the call it answers")
        out["tool_call_id"] = call_id
    if isinstance(msg.get("name"), str):
        out["name"] = msg["name"]
    return out


def _tools(raw: Any, max_depth: int) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            raw = bounded_json(raw, max_depth, "tools")
        except json.JSONDecodeError as exc:
            raise _bad("tools", f"a string must hold a JSON list ({exc.msg})") from None
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)) or not all(isinstance(t, Mapping) for t in raw):
        raise _bad("tools", "must be a list of tool schemas (objects) or a JSON string of one")
    return [drop_nones(dict(t)) for t in raw] or None


def normalize_conversation(row: Mapping[str, Any], max_depth: int = 64) -> Conversation:
    """Validate ``row["messages"]`` (or ShareGPT ``conversations``) and ``row["tools"]``.

    ``max_depth`` bounds the nesting of JSON held in strings (tool-call arguments, tools), which the
    row's own depth check cannot see (the card's ``limits.row_depth``).
    """
    key = "messages" if row.get("messages") is not None else "conversations"
    raw = row.get(key)
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise _bad(key, f"must be a list of messages, got {type(raw).__name__}")
    if not raw:
        raise _bad(key, "is empty")
    messages = [_message(f"{key}[{i}]", m, max_depth) for i, m in enumerate(raw)]
    return Conversation(messages=messages, tools=_tools(row.get("tools"), max_depth))
