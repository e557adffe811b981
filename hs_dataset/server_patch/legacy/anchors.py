"""Where the patch goes in ``deepseek_v2.py``: its anchors, found by parsing the file (never by line number).

The anchors of ``DeepseekV2Model.forward`` (SGLang <= 0.5.5 style): the class (the
helper block goes before it), the decoder-layer ``for`` loop, the
``hidden_states, residual = layer(...)`` call inside it, the statement holding the
final ``self.norm(hidden_states, residual)`` call, and the final ``return``. Anything
missing or ambiguous raises :class:`UnrecognisedSource` naming it.

Standard library only (see :mod:`hs_dataset.server_patch.legacy.patch`, the script).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

from hs_dataset.errors import HsDatasetError

__all__ = ["Anchors", "UnrecognisedSource", "find_anchors", "recognise", "split_lines"]


class UnrecognisedSource(HsDatasetError):
    """The source does not have the shape the patch expects; the message says what is missing.

    :mod:`hs_dataset.server_patch.legacy.edit` turns it into a status reason or a :class:`LegacyPatchError
    <hs_dataset.server_patch.legacy.edit.LegacyPatchError>`; it never reaches a user as it is.
    """


@dataclass
class Anchors:
    """Where to insert, as 0-based line indexes into the original text."""

    helper_line: int  # `class DeepseekV2Model` (or its first decorator)
    begin_line: int  # the decoder-layer `for` loop
    capture_line: int  # `hidden_states, residual = layer(...)` inside the loop
    emit_line: int  # statement holding the final `self.norm(...)` call(s)
    loop_var: str
    report: dict[str, int]  # human-facing 1-based line numbers


def _one(nodes: list, what: str) -> ast.AST:
    """Exactly one match, or a reason naming what was missing/ambiguous."""
    if not nodes:
        raise UnrecognisedSource(f"{what} not found")
    if len(nodes) > 1:
        lines = ", ".join(str(n.lineno) for n in nodes)
        raise UnrecognisedSource(f"{what} is ambiguous ({len(nodes)} matches, lines {lines})")
    return nodes[0]


def _is_self_attr(node: ast.AST, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name) and node.value.id == "self"


def _is_layer_item(node: ast.AST, loop_var: str) -> bool:
    """`self.layers[<loop_var>]`."""
    return (
        isinstance(node, ast.Subscript)
        and _is_self_attr(node.value, "layers")
        and isinstance(node.slice, ast.Name)
        and node.slice.id == loop_var
    )


def _names(nodes: list) -> list[str]:
    """Identifiers of a tuple's elements or a call's arguments ("?" for anything else)."""
    return [n.id if isinstance(n, ast.Name) else "?" for n in nodes]


def _layer_calls(loop: ast.For) -> list[ast.Assign]:
    """`hidden_states, residual = <decoder layer>(...)` statements inside the loop."""
    if not isinstance(loop.target, ast.Name):
        return []
    var = loop.target.id
    layer_names = {
        a.targets[0].id
        for a in ast.walk(loop)
        if isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name) and _is_layer_item(a.value, var)
    }
    found = []
    for node in ast.walk(loop):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        is_layer = _is_layer_item(func, var) or (isinstance(func, ast.Name) and func.id in layer_names)
        target = node.targets[0]
        if is_layer and isinstance(target, ast.Tuple) and _names(target.elts) == ["hidden_states", "residual"]:
            found.append(node)
    return found


def _contains(stmt: ast.AST, target: ast.AST) -> bool:
    return any(n is target for n in ast.walk(stmt))


def _child_blocks(stmt: ast.stmt) -> Iterator[list]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return
    for name in ("body", "orelse", "finalbody"):
        block = getattr(stmt, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
    for handler in getattr(stmt, "handlers", []) or []:
        yield handler.body
    for case in getattr(stmt, "cases", []) or []:
        yield case.body


def _innermost_stmt(block: list, targets: list) -> ast.stmt | None:
    """The deepest statement that contains every target, searching down from `block`."""
    for stmt in block:
        if all(_contains(stmt, t) for t in targets):
            for child in _child_blocks(stmt):
                inner = _innermost_stmt(child, targets)
                if inner is not None:
                    return inner
            return stmt
    return None


def _starts_line(lines: list[str], node: ast.stmt) -> int:
    """0-based line of `node`, which must be the first thing on it (not `a; b`, `if x: b`)."""
    line = lines[node.lineno - 1]
    if len(line) - len(line.lstrip(" \t")) != node.col_offset:
        raise UnrecognisedSource(f"anchor statement at line {node.lineno} does not start its line")
    return node.lineno - 1


def find_anchors(tree: ast.Module, lines: list[str]) -> Anchors:
    """Locate every insertion point, or raise UnrecognisedSource naming what is missing."""
    cls, fwd = _forward(tree)
    loop, call = _layer_loop(fwd)
    norms, norm_stmt = _final_norm(fwd, loop)
    if not isinstance(fwd.body[-1], ast.Return) or fwd.body[-1].lineno <= norm_stmt.end_lineno:
        raise UnrecognisedSource("final `return` of DeepseekV2Model.forward after the norm not found")

    helper = min([cls.lineno] + [d.lineno for d in cls.decorator_list])
    return Anchors(
        helper_line=helper - 1,
        begin_line=_starts_line(lines, loop),
        capture_line=_starts_line(lines, call),
        emit_line=_starts_line(lines, norm_stmt),
        loop_var=loop.target.id,
        report={
            "class DeepseekV2Model": cls.lineno,
            "forward": fwd.lineno,
            "layer loop": loop.lineno,
            "layer call": call.lineno,
            "final norm": min(n.lineno for n in norms),
            "return": fwd.body[-1].lineno,
        },
    )


def _forward(tree: ast.Module) -> tuple[ast.ClassDef, ast.FunctionDef]:
    """The module-level ``class DeepseekV2Model`` and its ``forward(..., forward_batch, ...)``."""
    cls = _one(
        [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV2Model"],
        "module-level `class DeepseekV2Model`",
    )
    fwd = _one(
        [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "forward"],
        "method `DeepseekV2Model.forward`",
    )
    if "forward_batch" not in [a.arg for a in fwd.args.args + fwd.args.kwonlyargs]:
        raise UnrecognisedSource("`DeepseekV2Model.forward` has no `forward_batch` parameter")
    return cls, fwd


def _layer_loop(fwd: ast.FunctionDef) -> tuple[ast.For, ast.Assign]:
    """The decoder-layer loop at the top level of ``forward``, and the one layer call inside it."""
    loops = [n for n in ast.walk(fwd) if isinstance(n, ast.For) and _layer_calls(n)]
    loop = _one(
        loops,
        "decoder-layer loop (`for i in ...:` containing `hidden_states, residual = "
        "self.layers[i](...)` or `layer = self.layers[i]; hidden_states, residual = layer(...)`) "
        "in DeepseekV2Model.forward",
    )
    if loop not in fwd.body:
        raise UnrecognisedSource(f"the decoder-layer loop (line {loop.lineno}) is not at the top level of forward")
    call = _one(_layer_calls(loop), "decoder-layer call in the loop")
    return loop, call


def _final_norm(fwd: ast.FunctionDef, loop: ast.For) -> tuple[list[ast.Call], ast.stmt]:
    """The ``self.norm(...)`` calls after the loop (one of them ``(hidden_states, residual)``) and the statement holding them."""
    norms = [n for n in ast.walk(fwd) if isinstance(n, ast.Call) and _is_self_attr(n.func, "norm") and n.lineno > loop.end_lineno]
    if not norms:
        raise UnrecognisedSource("final norm call `self.norm(hidden_states, ...)` after the layer loop not found")
    if not any(_names(c.args)[:2] == ["hidden_states", "residual"] for c in norms):
        raise UnrecognisedSource("final norm call `self.norm(hidden_states, residual)` not found")
    norm_stmt = _innermost_stmt(fwd.body, norms)
    if norm_stmt is None or norm_stmt.lineno <= loop.end_lineno:
        raise UnrecognisedSource("the final norm call(s) are not after the decoder-layer loop")
    return norms, norm_stmt


def split_lines(text: str) -> list[str]:
    """Lines with their endings.

    Only "\n" ends a line here, as for Python's tokenizer once bare "\r" is
    refused (str.splitlines would also split on form feeds and the like and put
    the ast line numbers out of step).
    """
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def recognise(text: str) -> Anchors:
    """Anchors of an unpatched source, or UnrecognisedSource with the reason."""
    if re.search(r"\r(?!\n)", text):
        raise UnrecognisedSource("the file uses bare carriage-return line endings")
    clash = re.search(r"\b(?:_hs_ids|_hs_aux|_hs_dataset_\w+|_HS_DATASET_\w+)\b", text)
    if clash:
        raise UnrecognisedSource(f"the name {clash.group(0)} the patch inserts is already used")
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise UnrecognisedSource(f"the file does not parse as Python ({exc.msg}, line {exc.lineno})") from exc
    return find_anchors(tree, split_lines(text))
