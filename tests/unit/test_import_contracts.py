"""The import rules of pyproject.toml's ``[tool.importlinter]`` hold, and they catch what they forbid.

``lint-imports`` (import-linter, run here so CI runs it) reads every import of the package,
lazy ones inside functions included: imports point down the data flow, the server side
imports only the wire contract and the stdlib leaves, the client side never imports the
server side, production never imports the tests, and no package takes part in a cycle.
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
        ("hs_dataset/sglang/server/core.py", "from hs_dataset.formats import writer", "The server side runs inside SGLang"),
        ("hs_dataset/sglang/server/hooks.py", "import transformers", "The server side runs inside SGLang"),
        ("hs_dataset/sglang/client/backend.py", "from hs_dataset.sglang.server import core", "The client side reaches the server only"),
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
    broken = done.stdout[done.stdout.index("Broken contracts"):]
    assert contract in broken, broken[:2000]
