"""Whether the installed SGLang can load its own class for the served model in the server's Python.

At start, SGLang's model registry imports each ``sglang/srt/models/*.py``. When one fails to
import, the registry logs ``Ignore import error when loading sglang.srt.models.<name>`` and
skips it. A model whose architecture then has no SGLang class is served by the Transformers
fallback (``TransformersForCausalLM``; ``model_loader/utils.py`` ``get_model_architecture``).
For the DeepSeek family (DeepseekV2/V3, Kimi-K2/K2.5) that fallback cannot run. SGLang still
sizes an MLA KV cache from the architecture: one ``kv_lora_rank + qk_rope_head_dim`` row a
token. The fallback's generic attention writes MHA-shaped K into it: ``num_key_value_heads``
heads of the config's ``head_dim``.

On the lent H100 (2026-12-06, SGLang 0.5.15 from the GPU bundle, triton backend, decode CUDA
graphs on) the server died capturing its decode graphs with ``RuntimeError: shape mismatch:
value tensor of shape [768, 16, 64] cannot be broadcast to indexing result of shape [256, 1,
576]`` in ``mem_cache/memory_pool.py`` ``set_kv_buffer``, called from
``layers/attention/triton_backend.py`` ``forward_decode``. That is the fallback's K:
256 tokens x 16 heads x 192 (nope + rope), viewed as 16 heads of ``head_dim`` 64, written
into 256 MLA rows of 576.

Why the model module did not import, read from the 0.5.15 wheel (docs/SGLANG.md has the
comparison). ``models/deepseek_v2.py`` imports ``layers/attention/dsa/dsa_indexer.py``, which
imports ``sglang.jit_kernel.dsa``. That package's ``__init__`` imports
``cutedsl_paged_mqa_logits`` at load on every platform but ROCm, and that module runs
``import cutlass``. ``cutlass`` comes from ``nvidia-cutlass-dsl``: a requirement of SGLang,
but one that the GPU bundle leaves out (``scripts/gpu/bundle_requirements.py``,
``NOT_NEEDED``). 0.5.14 does not have that import. 0.5.16 and 0.5.17 import the module lazily,
in a function or a module ``__getattr__``.

So the check is read from the installed source, never the version. :func:`eager_import`
follows the module-level imports of SGLang's own modules, starting at the family's model
module: outside functions, classes and ``try`` blocks, the branches of an ``if`` about another
platform left out. It reports the first chain that reaches a module of :data:`WATCHED`. The
probe of the server's Python (:mod:`.probe`) says which of those are not installed there
(``importlib.util.find_spec``, nothing imported). :func:`refuse_unloadable_model` refuses where
both hold, before a server is started.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hs_dataset.capture.serve.errors import ServeError
from hs_dataset.capture.serve.layer_ids import model_family
from hs_dataset.capture.sglang.support import VERIFIED

__all__ = ["FAMILY_MODULES", "WATCHED", "EagerImport", "eager_import", "installed_modules", "refuse_unloadable_model"]

# top-level module -> the distribution that installs it: what an SGLang model module may import at load that a
# server environment may lack (the GPU bundle leaves nvidia-cutlass-dsl out: scripts/gpu/bundle_requirements.py)
WATCHED: dict[str, str] = {"cutlass": "nvidia-cutlass-dsl"}

# model family (layer_ids.model_family) -> the SGLang module that registers its classes (Kimi-K2.5's wrapper imports it too)
FAMILY_MODULES: dict[str, str] = {"deepseek": "sglang.srt.models.deepseek_v2"}

# an ``if`` whose test names a platform other than CUDA (or an environment switch, or type checking): only the branch a
# CUDA server takes for sure is followed (``if not is_hip():`` -> its body; ``if _is_npu:`` -> its else)
_NOT_ON_CUDA = re.compile(r"hip|rocm|gfx|aiter|npu|musa|xpu|mps|amx|cpu|TYPE_CHECKING|env|__name__", re.I)

_MAX_MODULES = 5000  # SGLang 0.5.23's deepseek_v2.py reaches about 820 of its modules


@dataclass(frozen=True)
class EagerImport:
    """A chain of module-level imports from a model module to ``target``."""

    target: str  # the top-level module imported (a key of WATCHED)
    chain: tuple[str, ...]  # SGLang modules: the model module first, the one whose load imports ``target`` last
    paths: tuple[str, ...]  # their files in the package, e.g. ``srt/models/deepseek_v2.py``, ``jit_kernel/dsa/__init__.py``

    def files(self) -> str:
        return " -> ".join(self.paths)


def _relpath(module: str, is_package: bool = False) -> str:
    return "/".join(module.split(".")[1:]) + ("/__init__.py" if is_package else ".py")


class _Reader:
    """The installed package's module files, parsed once each; ``read`` gives a module's source or None."""

    def __init__(self, read: Callable[[str], tuple[str, bool] | None]) -> None:
        self._read = read
        self._cache: dict[str, tuple[bool, list[tuple[str, list[str]]], set[str]] | None] = {}

    def module(self, name: str) -> tuple[bool, list[tuple[str, list[str]]], set[str]] | None:
        """(is a package, its module-level imports as (module, names), the names its module level binds), or None."""
        if name not in self._cache:
            found = self._read(name)
            parsed = None
            if found is not None:
                source, is_package = found
                try:
                    tree = ast.parse(source)
                except SyntaxError:
                    tree = None
                if tree is not None:
                    imports: list[tuple[str, list[str]]] = []
                    bound: set[str] = set()
                    self._body(tree.body, imports, bound)
                    parsed = (is_package, imports, bound)
            self._cache[name] = parsed
        return self._cache[name]

    def _body(self, body: Iterable[ast.stmt], imports: list[tuple[str, list[str]]], bound: set[str]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)  # run later, if ever: a lazy import (PEP 562's __getattr__ included)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    imports.append((alias.name, []))
                    bound.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                imports.append(("." * node.level + (node.module or ""), [a.name for a in node.names]))
                if node.module or node.level != 1:  # ``from . import x`` in a package loads its submodule x
                    bound.update(a.asname or a.name for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                bound.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If):
                test = ast.unparse(node.test)
                negated = isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
                if _NOT_ON_CUDA.search(test):  # about another platform: only the branch this device takes
                    self._body(node.body if negated else node.orelse, imports, bound)
                else:
                    self._body(node.body, imports, bound)
                    self._body(node.orelse, imports, bound)
            # a try block's import failures are caught: never the reason a module does not load


def _absolute(name: str, module: str, is_package: bool) -> str:
    """``name`` of an import in ``module`` made absolute (``.x`` / ``..x``)."""
    level = len(name) - len(name.lstrip("."))
    if not level:
        return name
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    rest = name[level:]
    return ".".join(base + ([rest] if rest else []))


def eager_import(read: Callable[[str], tuple[str, bool] | None], start: str, targets: Iterable[str]) -> EagerImport | None:
    """The first chain of module-level imports a CUDA server makes from SGLang module ``start`` to a module of ``targets``.

    ``read(module)`` gives ``(source, is_package)`` of an ``sglang`` module, None where there is no such file
    (:func:`installed_modules` reads an installed package). A ``from P import n`` loads ``P.n`` only where ``P``'s own
    module level does not bind ``n``, as Python does.
    """
    wanted = set(targets)
    reader = _Reader(read)
    via: dict[str, str | None] = {}
    stack: list[tuple[str, str | None]] = [(start, None)]
    while stack and len(via) < _MAX_MODULES:
        name, parent = stack.pop()
        if name in via:
            continue
        via[name] = parent
        parts = name.split(".")
        stack.extend((".".join(parts[:i]), parent) for i in range(len(parts) - 1, 0, -1))  # its packages load first
        parsed = reader.module(name)
        if parsed is None:
            continue
        is_package, imports, _bound = parsed
        pending: list[tuple[str, str | None]] = []
        for raw, names in imports:
            target = _absolute(raw, name, is_package)
            top = target.split(".")[0]
            if top in wanted:
                chain = [name]
                while (up := via.get(chain[-1])) is not None:
                    chain.append(up)
                chain.reverse()
                paths = tuple(_relpath(m, bool((reader.module(m) or (False,))[0])) for m in chain)
                return EagerImport(top, tuple(chain), paths)
            if top != "sglang":
                continue
            pending.append((target, name))
            imported = reader.module(target)
            for n in names:
                if imported is None or n not in imported[2]:
                    pending.append((f"{target}.{n}", name))  # a submodule, where the package does not bind the name
        stack.extend(reversed(pending))  # depth first, in source order
    return None


def installed_modules(sglang_dir: str) -> Callable[[str], tuple[str, bool] | None]:
    """``read`` for :func:`eager_import`: an ``sglang`` module's file under the installed package, unimported."""
    root = Path(sglang_dir)

    def read(module: str) -> tuple[str, bool] | None:
        parts = module.split(".")
        if parts[0] != "sglang":
            return None
        base = root.joinpath(*parts[1:])
        for path, is_package in ((base.with_name(base.name + ".py"), False), (base / "__init__.py", True)):
            if path.is_file():
                try:
                    return path.read_text(encoding="utf-8"), is_package
                except (OSError, UnicodeDecodeError):
                    return None
        return None

    return read


def _verified_on_gpu() -> str:
    releases = sorted({v for v, _m, d in VERIFIED if d == "cuda"}, key=lambda v: tuple(int(p) for p in re.findall(r"\d+", v)))
    return ", ".join(releases)


def refuse_unloadable_model(
    version: str,
    sglang_dir: str | None,
    architectures: Sequence[str],
    absent: Iterable[str],
    *,
    python: str,
    device: str = "cuda",
) -> None:
    """:class:`ServeError` (one line) where SGLang's class for the served model cannot load in the server's Python.

    ``absent``: the modules of :data:`WATCHED` the server's Python lacks (the probe's ``absent``). Nothing is read
    unless one is absent, the model is of a family in :data:`FAMILY_MODULES` and the server is a CUDA one. A CPU server
    would meet the same import (the source makes it on every platform but ROCm), but no CPU environment of this
    repository runs such a release, and the walk costs a CPU plan 1-2 s: not checked there.
    """
    missing = [m for m in absent if m in WATCHED]
    start = FAMILY_MODULES.get(model_family(architectures))
    if not missing or start is None or not sglang_dir or device != "cuda":
        return
    found = eager_import(installed_modules(sglang_dir), start, missing)
    if found is None:
        return
    arch = next(iter(architectures), "the model")
    dist = WATCHED[found.target]
    raise ServeError(
        f"SGLang {version} cannot load its {arch} here: {found.paths[0]} imports `{found.target}` when it loads "
        f"({found.files()}), and {python} has no `{found.target}` ({dist}), so SGLang skips that model "
        f"(its log: 'Ignore import error when loading {start}') and serves it through its Transformers fallback, "
        "whose MHA-shaped K does not fit the MLA KV cache; on the lent H100 (2026-12-06, SGLang 0.5.15's GPU bundle, "
        "triton backend, decode CUDA graphs on) the server died with `RuntimeError: shape mismatch: value tensor of shape "
        "[768, 16, 64] cannot be broadcast to indexing result of shape [256, 1, 576]` in mem_cache/memory_pool.py "
        "set_kv_buffer, called from layers/attention/triton_backend.py forward_decode. Fix: serve with an SGLang verified "
        f"on a GPU ({_verified_on_gpu()}), or install {dist} in the server's environment (unverified); by the source, another "
        "attention backend or --disable-cuda-graph would not avoid it, the fallback being chosen before either (not run; "
        "docs/SGLANG.md)"
    )
