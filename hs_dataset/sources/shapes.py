"""Recognise each row's conversation shape and bring it to the one chat row shape.

Chat datasets come in a few dialects. Each row is recognised on its own (one file
may mix them) and counted by shape in the run report:

* ``openai``: ``messages`` of ``role``/``content`` (``tool_calls``, ``reasoning_content``);
* ``ultrachat``: the same ``messages`` plus UltraChat's ``prompt``/``prompt_id`` columns,
  or UltraChat's original ``data``: a list of strings, user and assistant alternating;
* ``sharegpt``: ``conversations`` of ``from``/``value`` with ``human``, ``gpt``,
  ``system``, ``function_call`` (a JSON ``{"name", "arguments"}``) and ``observation``
  (that call's result);
* ``prompt_response``: a plain ``prompt`` and ``response`` (optional ``system``);
* ``pretokenized``: ``input_ids`` (and ``loss_mask``).

``columns`` maps our field names to the source's (``{"messages": "dialog"}``). A row
that matches none of these is ``unknown``: counted with its keys, never guessed at.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from hs_dataset.sources.report import MalformedRowError
from hs_dataset.sources.row_bounds import bounded_json

__all__ = ["FIELDS", "Shape", "apply_columns", "detect_shape", "to_chat_row"]

Shape = Literal["openai", "ultrachat", "sharegpt", "prompt_response", "pretokenized", "unknown"]
FIELDS = ("messages", "conversations", "prompt", "response", "system", "tools", "id", "input_ids", "loss_mask", "data")


def apply_columns(row: Mapping[str, Any], columns: Mapping[str, str] | None) -> Mapping[str, Any]:
    """The row with the source's column names renamed to ours (``columns``: ours -> theirs)."""
    if not columns:
        return row
    out = {k: v for k, v in row.items() if k not in columns.values()}
    for ours, theirs in columns.items():
        if theirs in row:
            out[ours] = row[theirs]
    return out


def _present(row: Mapping[str, Any], key: str) -> bool:
    return row.get(key) is not None


def detect_shape(row: Mapping[str, Any]) -> Shape:
    """The shape of one row (after :func:`apply_columns`); ``unknown`` when nothing fits."""
    if _present(row, "input_ids"):
        return "pretokenized"
    if _present(row, "messages"):
        return "ultrachat" if _present(row, "prompt_id") else "openai"
    if _present(row, "conversations"):
        return "sharegpt"
    if isinstance(row.get("data"), list) and all(isinstance(x, str) for x in row["data"]):
        return "ultrachat"
    if isinstance(row.get("prompt"), str) and isinstance(row.get("response"), str):
        return "prompt_response"
    return "unknown"


def _sharegpt_messages(turns: Any, max_depth: int) -> list[dict[str, Any]]:
    """ShareGPT turns -> OpenAI messages; ``function_call``/``observation`` become a tool call and its result."""
    if not isinstance(turns, list):
        raise MalformedRowError(f"conversations: must be a list of turns, got {type(turns).__name__}")
    out: list[dict[str, Any]] = []
    calls = 0
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping):
            raise MalformedRowError(f"conversations[{i}]: a turn must be an object, got {type(turn).__name__}")
        who, value = turn.get("from", turn.get("role")), turn.get("value", turn.get("content"))
        if who == "function_call":
            out.append({"role": "assistant", "content": "", "tool_calls": [_sharegpt_call(i, value, calls, max_depth)]})
            calls += 1
        elif who == "observation":
            out.append({"role": "tool", "content": value, "tool_call_id": f"call_{max(calls - 1, 0)}"})
        else:  # other keys (reasoning_content, tool_calls, name) pass through
            out.append({**{k: v for k, v in turn.items() if k not in ("from", "value")}, "role": who, "content": value})
    return out


def _sharegpt_call(i: int, value: Any, index: int, max_depth: int) -> dict[str, Any]:
    try:
        call = bounded_json(value, max_depth, f"conversations[{i}].value") if isinstance(value, str) else value
    except json.JSONDecodeError as exc:
        raise MalformedRowError(f"conversations[{i}]: function_call value is not JSON ({exc.msg})") from None
    if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
        raise MalformedRowError(f"conversations[{i}]: function_call must be a JSON object with a 'name'")
    args = call.get("arguments", {})
    return {"id": f"call_{index}", "type": "function", "function": {"name": call["name"], "arguments": args}}


def to_chat_row(row: Mapping[str, Any], shape: Shape, max_depth: int = 64) -> Mapping[str, Any]:
    """A row of a chat shape as ``{"messages": [...], "tools": ..., "id": ...}`` for :func:`normalize_conversation`.

    ``max_depth`` bounds the nesting of JSON held in ShareGPT ``function_call`` strings (``limits.row_depth``).
    """
    keep = {k: row[k] for k in ("id", "tools") if k in row}
    if shape == "sharegpt":
        return {**keep, "messages": _sharegpt_messages(row["conversations"], max_depth)}
    if shape == "ultrachat" and not _present(row, "messages"):
        roles = ("user", "assistant")
        return {**keep, "messages": [{"role": roles[i % 2], "content": text} for i, text in enumerate(row["data"])]}
    if shape == "prompt_response":
        system = [{"role": "system", "content": row["system"]}] if isinstance(row.get("system"), str) else []
        return {
            **keep,
            "messages": [*system, {"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["response"]}],
        }
    return row
