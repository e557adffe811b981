"""The import graph follows the data flow: every import points to a lower layer.

Every ``import`` in the package is read from the source (lazy imports inside
functions included), so a shortcut taken "just inside one function" still fails
here. The layers, lowest first:

0. leaves: ``errors``, ``version``, ``faults``, ``dtypes``, ``libc``, ``host_buffers``
1. typed values: ``config`` (the card), ``sample`` (the records that flow)
2. ``sources`` (rows -> tokenized samples) and ``formats`` (samples <-> disk)
3. ``capture`` (tokenized samples -> captured samples)
4. consumers of one stage each: ``pipeline``, ``serve``, ``interop``, ``training``, ``distributed``
5. front doors: ``builder`` (datasets), ``hub``
6. ``cli`` and the ``datasets`` name hook
7. the package root (a lazy public API)

``server_patch`` runs inside SGLang: it imports only itself, ``errors``, ``dtypes``
(the one dtype table: stdlib only, torch on demand) and ``libc`` (the one binding of
the libc calls ``os`` lacks: stdlib only); the
client side reaches it only through ``server_patch.protocol``. Nothing in
production imports ``testing``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hs_dataset"

RANKS = {
    "errors": 0,
    "version": 0,
    "faults": 0,
    "dtypes": 0,
    "libc": 0,
    "host_buffers": 0,
    "config": 1,
    "sample": 1,
    "sources": 2,
    "formats": 2,
    "capture": 3,
    "pipeline": 4,
    "serve": 4,
    "interop": 4,
    "training": 4,
    "distributed": 4,
    "builder": 5,
    "hub": 5,
    "streaming": 5,
    "cli": 6,
    "_datasets_hook": 6,
    "__init__": 7,
}
SERVER_SIDE = "server_patch"
SERVER_DOOR = "hs_dataset.server_patch.protocol"
FIXTURES = "testing"


def _unit(module: str) -> str:
    """``hs_dataset.formats.reader`` -> ``formats``; ``hs_dataset`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(path: Path, module: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement, resolving relative ones."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:  # ``from pkg import mod`` imports the module pkg.mod
                sub = f"{base}.{alias.name}"
                out.append((node.lineno, sub if sub in known or base == "hs_dataset" else base))
    return [(line, name) for line, name in out if name == "hs_dataset" or name.startswith("hs_dataset.")]


def _violation(importer: str, imported: str) -> str | None:
    src, dst = _unit(importer), _unit(imported)
    if src == FIXTURES:
        return None
    if dst == FIXTURES:
        return "production code must not import the test fixtures (use the builtin: model registry)"
    if src == SERVER_SIDE:
        if dst in (SERVER_SIDE, "errors", "dtypes", "libc"):
            return None
        return "server_patch runs inside SGLang and imports nothing of the client side"
    if dst == SERVER_SIDE:
        return None if imported == SERVER_DOOR or src == "cli" and imported.startswith("hs_dataset.server_patch.legacy_patch") else (
            "the client side reaches the server only through server_patch.protocol"
        )
    if src == dst:
        return None
    if imported == "hs_dataset" or dst == "__init__":
        return "import the defining module, not the package root"
    if src not in RANKS or dst not in RANKS:
        return f"{src if src not in RANKS else dst!r} has no layer: add it to RANKS in tests/test_layout.py"
    if RANKS[dst] >= RANKS[src]:
        return f"{src} (layer {RANKS[src]}) must not import {dst} (layer {RANKS[dst]})"
    return None


def test_every_import_points_down():
    problems = []
    modules = _modules()
    for module, path in modules.items():
        for line, imported in _imports(path, module, set(modules)):
            why = _violation(module, imported)
            if why:
                problems.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {module} -> {imported}: {why}")
    assert not problems, "\n".join(problems)


def test_every_top_level_unit_has_a_layer():
    units = {_unit(m) for m in _modules()} - {SERVER_SIDE, FIXTURES}
    assert sorted(units - set(RANKS)) == []


@pytest.mark.parametrize(
    "importer, imported, allowed",
    [
        ("hs_dataset.formats.reader", "hs_dataset.capture.hf", False),
        ("hs_dataset.formats.writer", "hs_dataset.pipeline", False),
        ("hs_dataset.hub.push", "hs_dataset.builder", False),
        ("hs_dataset.capture.sglang.client", "hs_dataset.serve.plan", False),
        ("hs_dataset.capture.sglang.client", "hs_dataset.server_patch.capture", False),
        ("hs_dataset.capture.sglang.client", "hs_dataset.server_patch.protocol", True),
        ("hs_dataset.server_patch.capture", "hs_dataset.formats.writer", False),
        ("hs_dataset.capture.model_info", "hs_dataset.testing.tiny_model", False),
        ("hs_dataset.formats.writer", "hs_dataset", False),
        ("hs_dataset.pipeline", "hs_dataset.formats.writer", True),
        ("hs_dataset.testing.tiny_model", "hs_dataset.sources.chat", True),
    ],
)
def test_the_rules_catch_what_the_layout_forbids(importer, imported, allowed):
    assert (_violation(importer, imported) is None) is allowed
