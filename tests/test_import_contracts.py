"""The import rules of pyproject.toml's ``[tool.importlinter]`` hold, and they catch what they forbid.

``lint-imports`` (import-linter, run here so CI runs it) reads every import of the package,
lazy ones inside functions included: imports point down the data flow, the server patch
imports only its contract, the codecs and the stdlib leaves, the client side reaches the
server patch only through its contract, production never imports the tests, and no package takes part in a cycle.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.paths import REPO

LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    if not LINT.exists():
        pytest.fail(f"{LINT} not found: install the test extras (pip install -e '.[test]')")
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(LINT), "--no-cache", str(root / "pyproject.toml")], cwd=root, env=env, capture_output=True, text=True)


def test_every_contract_is_kept():
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout and done.stdout.count("KEPT") >= 7, done.stdout[-2000:]


@pytest.mark.parametrize(
    "module, line, contract",
    [
        ("hs_dataset/formats/reader.py", "from hs_dataset.capture import hf", "Imports point down the data flow"),
        ("hs_dataset/server_patch/core.py", "from hs_dataset.formats import writer", "The server patch runs inside SGLang"),
        ("hs_dataset/server_patch/hooks.py", "import transformers", "The server patch runs inside SGLang"),
        ("hs_dataset/codecs/fp8.py", "import numpy", "The server patch runs inside SGLang"),
        (
            "hs_dataset/server_patch/contract/status.py",
            "from hs_dataset.server_patch import reporter",
            "Inside the server patch, everything stands on the contract",
        ),
        (
            "hs_dataset/capture/sglang/backend.py",
            "from hs_dataset.server_patch import core",
            "The client side reaches the server patch only",
        ),
        (
            "hs_dataset/capture/serve/plan.py",
            "from hs_dataset.server_patch.legacy import hook",
            "The client side reaches the server patch only",
        ),
        ("hs_dataset/capture/sglang/dumps.py", "from hs_dataset.capture.serve import plan", "The capture backends"),
        ("hs_dataset/model/snapshot.py", "from hs_dataset.demo import tiny_model", "Production reaches the demo model only"),
        ("hs_dataset/formats/paths.py", "from hs_dataset.formats import reader", "No import cycles"),
        ("hs_dataset/config/__init__.py", "import tests.fixtures.paths", "Production code never imports the tests"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, contract):
    """Each rule, broken on purpose in a copy of the package (inside a function: lazy imports count too)."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "hs_dataset", root / "hs_dataset", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "tests" / "fixtures").mkdir(parents=True)
    for name in ("tests/__init__.py", "tests/fixtures/__init__.py", "tests/fixtures/paths.py"):
        shutil.copy(REPO / name, root / name)
    target = root / module
    target.write_text(target.read_text() + f"\n\ndef _broken_on_purpose():\n    {line}  # noqa\n")
    done = _lint(root)
    assert done.returncode != 0, f"{line!r} in {module} passed every contract"
    broken = done.stdout[done.stdout.index("Broken contracts") :]
    assert contract in broken, broken[:2000]


# What the server patch and the codecs may import from outside the standard library: they
# run inside the SGLang server's own environment, which has torch (and triton) and sglang.
_SERVER_THIRD_PARTY = {"torch", "torchvision", "triton", "sglang", "sgl_kernel", "vllm"}  # torchvision: the CPU server's shim of it
_SERVER_LEAVES = ("hs_dataset.server_patch", "hs_dataset.codecs", "hs_dataset.errors", "hs_dataset.libc", "hs_dataset.dtypes")


def _imported_names(path: Path) -> set[str]:
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_server_patch_imports_only_the_stdlib_torch_and_its_own_contract():
    """Stricter than the forbidden list: every import of server_patch/ and codecs/ (and the leaves they use)."""
    files = [*(REPO / "hs_dataset" / "server_patch").rglob("*.py"), *(REPO / "hs_dataset" / "codecs").rglob("*.py")]
    files += [REPO / "hs_dataset" / f"{leaf}.py" for leaf in ("errors", "libc", "dtypes")]
    wrong = []
    for path in files:
        for name in _imported_names(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in _SERVER_THIRD_PARTY or top == "__future__":
                continue
            if name.startswith(_SERVER_LEAVES) or name == "hs_dataset":
                continue
            wrong.append(f"{path.relative_to(REPO)}: {name}")
    assert len(files) > 30 and not wrong, wrong
