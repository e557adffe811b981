"""What the installed SGLang can do, read from its source files in the server's environment, never from its version.

A version table cannot see back-ports, patched wheels or releases it was not written
for, and ours was wrong twice (0.5.14 has request ids and a default-on prefill CUDA graph,
both credited to 0.5.15). So every decision ``hs-dataset serve`` takes about an SGLang is
read here from the files the server will import, without importing them:

* ``forward_hooks`` / ``aux_return`` / ``prefill_graph_flag``: whether the server
  arguments define ``forward_hooks``, ``enable_return_aux_hidden_states`` and
  ``disable_prefill_cuda_graph`` (``--forward-hooks``, ``--enable-return-aux-hidden-states``,
  ``--disable-prefill-cuda-graph``);
* ``forward_batch_rids``: whether ``ForwardBatch`` declares a ``rids`` field (dumps keyed
  by request id; otherwise by content);
* ``source_patched``: whether ``models/deepseek_v2.py`` carries hs_dataset's source patch
  (``hs-dataset patch apply``, the capture of SGLang releases without forward hooks);
* ``eagle3_shift``: per model family, what ``set_eagle3_layers_to_capture`` does to the
  ids it is given -- ``always`` (+1 to every id), ``first_is_one`` (+1 only when the first
  id is 1) or ``unknown``.

The hooks check the same facts again in the running server (``server_patch/hooks.py``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from hs_dataset.server_patch.contract.legacy_header import carries_patch

__all__ = ["SGLangFacts", "eagle3_shift_rule", "read_facts"]

# model family -> the SGLang model file whose set_eagle3_layers_to_capture decides its ids
_EAGLE3_FILES = {"deepseek": "models/deepseek_v2.py", "llama": "models/llama.py"}


@dataclass(frozen=True)
class SGLangFacts:
    """What one installed SGLang provides (see the module doc)."""

    version: str
    forward_hooks: bool = False
    aux_return: bool = False
    prefill_graph_flag: bool = False
    forward_batch_rids: bool = False
    source_patched: bool = False
    eagle3_shift: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        flags = [
            name
            for name in ("forward_hooks", "aux_return", "prefill_graph_flag", "forward_batch_rids", "source_patched")
            if getattr(self, name)
        ]
        shifts = ", ".join(f"{family} {rule}" for family, rule in sorted(self.eagle3_shift.items()))
        return f"read from the installed source: {', '.join(flags) or 'none of the capture features'}; EAGLE-3 ids: {shifts or 'unknown'}"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _server_args_text(srt: Path) -> str:
    """The server arguments' definitions: ``server_args.py``, and the field groups newer releases split them into."""
    parts = [_read(srt / "server_args.py")]
    parts += [_read(p) for p in sorted((srt / "arg_groups").rglob("*.py"))] if (srt / "arg_groups").is_dir() else []
    return "\n".join(parts)


def _defines(text: str, name: str) -> bool:
    return re.search(rf"^\s*{name}\s*:", text, re.M) is not None or f'"{name}"' in text or f"'{name}'" in text


def _class_has_field(source: str, class_name: str, field_name: str) -> bool:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return any(isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == field_name for s in node.body)
    return False


def eagle3_shift_rule(source: str) -> str:
    """``always``, ``first_is_one`` or ``unknown``: what ``set_eagle3_layers_to_capture`` in ``source`` adds to the ids."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return "unknown"
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "set_eagle3_layers_to_capture"]
    if not funcs:
        return "unknown"
    body = funcs[0]
    first_is_one = any(
        isinstance(n, ast.Compare)
        and isinstance(n.left, ast.Subscript)
        and ast.unparse(n.left).endswith("[0]")
        and any(isinstance(c, ast.Constant) and c.value == 1 for c in n.comparators)
        for n in ast.walk(body)
    )
    plus_one = any(
        isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and isinstance(n.right, ast.Constant) and n.right.value == 1
        for n in ast.walk(body)
    )
    if first_is_one and plus_one:
        return "first_is_one"
    return "always" if plus_one else "unknown"


def read_facts(sglang_dir: str | None, version: str) -> SGLangFacts:
    """The facts of the SGLang installed at ``sglang_dir`` (the package folder); all False where it cannot be read."""
    if not sglang_dir:
        return SGLangFacts(version=version)
    srt = Path(sglang_dir) / "srt"
    args = _server_args_text(srt)
    batch = _read(srt / "model_executor" / "forward_batch_info.py")
    return SGLangFacts(
        version=version,
        forward_hooks=_defines(args, "forward_hooks"),
        aux_return=_defines(args, "enable_return_aux_hidden_states"),
        prefill_graph_flag=_defines(args, "disable_prefill_cuda_graph"),
        forward_batch_rids=_class_has_field(batch, "ForwardBatch", "rids"),
        source_patched=carries_patch(_read(srt / "models" / "deepseek_v2.py")),
        eagle3_shift={family: eagle3_shift_rule(_read(srt / rel)) for family, rel in _EAGLE3_FILES.items()},
    )
