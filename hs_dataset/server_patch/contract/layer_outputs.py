"""Does the installed SGLang's decoder layer return the residual? Read from its source, not its version.

The ``layer_hooks`` mechanism records ``hidden + residual`` from each decoder layer's
``(hidden, residual)`` output. SGLang 0.5.23 moved the residual into
``forward_batch.residual_stream``; ``DeepseekV2DecoderLayer.forward`` now returns
``(hidden_states, topk_indices)``, so a layer hook would store the MLP output without
the residual stream (far from the true state: docs/SGLANG.md) while every check
downstream looks healthy.
Version tables cannot see back-ports or patched wheels, so the rule reads the code:
every ``return`` of the layer class's ``forward`` must be a tuple whose second element
is a name containing ``residual``. Anything else (or a class we cannot find) refuses
``layer_hooks`` with a message naming ``aux_return``.

Runs on both sides: the client parses the file found in the server environment,
the server parses ``inspect.getsource`` of the class it actually loaded. Stdlib only.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable, Sequence

__all__ = ["DECODER_LAYERS", "decoder_layer_for", "forward_returns", "layer_hooks_problem"]

# architecture prefix -> (SGLang model module, decoder layer class); first match wins
DECODER_LAYERS: list[tuple[str, str, str]] = [
    ("DeepseekV", "sglang.srt.models.deepseek_v2", "DeepseekV2DecoderLayer"),
    ("KimiK2", "sglang.srt.models.deepseek_v2", "DeepseekV2DecoderLayer"),
    ("Qwen3Moe", "sglang.srt.models.qwen3_moe", "Qwen3MoeDecoderLayer"),
    ("Qwen3", "sglang.srt.models.qwen3", "Qwen3DecoderLayer"),
    ("Qwen2Moe", "sglang.srt.models.qwen2_moe", "Qwen2MoeDecoderLayer"),
    ("Qwen2", "sglang.srt.models.qwen2", "Qwen2DecoderLayer"),
    ("Llama", "sglang.srt.models.llama", "LlamaDecoderLayer"),
    ("Mistral", "sglang.srt.models.llama", "LlamaDecoderLayer"),
]

_FIX = "use mechanism 'aux_return' (SGLang 0.5.23+; 'auto' picks it) instead of 'layer_hooks'"


def decoder_layer_for(architectures: Sequence[str] | str | None) -> tuple[str, str] | None:
    """(module, class) of the decoder layer SGLang builds for ``architectures``; ``None`` if unknown."""
    archs = [architectures] if isinstance(architectures, str) else list(architectures or ())
    for arch in archs:
        for prefix, module, cls in DECODER_LAYERS:
            if arch.startswith(prefix):
                return module, cls
    return None


def _returns(func: ast.FunctionDef) -> list[ast.Return]:
    """``return`` statements of ``func`` itself (not of functions nested in it)."""
    found: list[ast.Return] = []
    todo: list[ast.AST] = list(func.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            found.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return found


def forward_returns(source: str, class_name: str) -> list[str] | None:
    """The ``return`` expressions of ``class_name.forward`` in ``source``; ``None`` if there is no such method."""
    tree = ast.parse(textwrap.dedent(source))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    return [ast.unparse(r.value) if r.value is not None else "None" for r in _returns(item)]
    return None


def _carries_residual(expression: str) -> bool:
    value = ast.parse(expression, mode="eval").body
    if not isinstance(value, ast.Tuple) or len(value.elts) < 2:
        return False
    second = value.elts[1]
    name = second.id if isinstance(second, ast.Name) else second.attr if isinstance(second, ast.Attribute) else ""
    return "residual" in name


def _tp_reason(source: str, tp_size: int) -> str:
    """Under TP, 0.5.23's layer boundaries (``sglang.srt.layers.layer_boundary``) defer the all-reduce.

    The layer then hands its hooks an ``OwedOutput`` -- this rank's un-reduced partial
    sum, completed only at the next layer's boundary -- so no hook on a decoder layer
    can see a complete state, residual or not.
    """
    if tp_size <= 1 or "layer_boundary" not in source:
        return ""
    return (
        f"; and with tensor parallelism (tp {tp_size}) its output is an OwedOutput: this rank's un-reduced partial "
        "sum, all-reduced only at the next layer's boundary (sglang.srt.layers.layer_boundary), so no hook on a "
        "decoder layer sees a complete state ('aux_return' receives the states after SGLang completes them)"
    )


def layer_hooks_problem(
    architectures: Sequence[str] | str | None, read_source: Callable[[str, str], str | None], tp_size: int = 1
) -> str | None:
    """Why ``layer_hooks`` would store wrong states on this SGLang (``None``: its layers return the residual).

    ``read_source(module, class_name)`` returns the source holding the class (a file's or
    ``inspect.getsource``'s text), or ``None`` when it cannot be found. ``tp_size`` > 1
    adds the tensor-parallel reason where the source shows deferred all-reduces.
    """
    target = decoder_layer_for(architectures)
    if target is None:
        return f"no known SGLang decoder layer for architectures {architectures!r}, so 'layer_hooks' cannot be checked; {_FIX}"
    module, cls = target
    source = read_source(module, cls)
    returns = forward_returns(source, cls) if source is not None else None
    if not returns:
        return f"cannot read {module}.{cls}.forward in the installed SGLang to check what a layer returns; {_FIX}"
    wrong = [r for r in returns if not _carries_residual(r)]
    if wrong:
        return (
            f"{module}.{cls}.forward returns `{wrong[0]}`, not (hidden, residual): a 'layer_hooks' capture would "
            f"store the MLP output without the residual stream{_tp_reason(source, tp_size)}; {_FIX}"
        )
    return None
