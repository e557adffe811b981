"""No unpickling anywhere in the package: statically (AST of every .py) and at runtime (reading a dataset).

Static rules, per file of ``hs_dataset/`` (aliases followed: ``import torch as t``,
``from torch import load``, ``import numpy as np`` ...):

* no import of ``pickle``/``cPickle``/``_pickle``/``dill``/``marshal``/``shelve``/
  ``cloudpickle``/``joblib`` (every one of them can execute code while loading);
* ``torch.load(...)`` only with the literal ``weights_only=True``; no ``torch.jit.load``;
* ``numpy.load(...)`` never with ``allow_pickle`` other than the literal ``False``;
  ``numpy.lib.format.read_array`` likewise;
* no ``read_pickle`` (pandas or otherwise) and no ``Unpickler`` reference;
* ``torch.save`` (writes a pickle for a consumer that loads it) only in
  :data:`TORCH_SAVE_ALLOWED`: the SpecForge export (their ``.ckpt`` format) and the
  speculators export's ``token_freq.pt`` (their format; they read it with
  ``weights_only=True``).

Runtime: opening, iterating, ``final_norm()`` and ``verify`` of datasets (native and fp8
storage) with ``pickle.load(s)``, ``pickle.Unpickler``, ``torch.load`` and ``numpy.load``
patched to raise.
"""

from __future__ import annotations

import ast
import pickle
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import hs_dataset

PACKAGE = Path(hs_dataset.__file__).resolve().parent
BANNED_MODULES = {"pickle", "cPickle", "_pickle", "dill", "marshal", "shelve", "cloudpickle", "joblib"}
TORCH_SAVE_ALLOWED = {
    "interop/specforge/export.py": "SpecForge reads its offline data as torch.save'd .ckpt dicts",
    "interop/speculators/export.py": "speculators reads token_freq.pt with torch.load(weights_only=True)",
}


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"hs_dataset/{self.file}:{self.line}: {self.what}"


class _Scanner(ast.NodeVisitor):
    def __init__(self, rel: str) -> None:
        self.rel = rel
        self.findings: list[Finding] = []
        self.torch_saves: list[int] = []
        # local name -> dotted thing it stands for ("torch", "numpy", "torch.load", ...)
        self.aliases: dict[str, str] = {"torch": "torch", "numpy": "numpy", "np": "numpy", "pandas": "pandas", "pd": "pandas"}

    def flag(self, node: ast.AST, what: str) -> None:
        self.findings.append(Finding(self.rel, getattr(node, "lineno", 0), what))

    # ---- imports
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            root = alias.name.split(".")[0]
            if root in BANNED_MODULES:
                self.flag(node, f"imports {alias.name}")
            self.aliases[alias.asname or root] = alias.name if alias.asname else root
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module.split(".")[0] in BANNED_MODULES:
            self.flag(node, f"imports from {module}")
        for alias in node.names:
            full = f"{module}.{alias.name}" if module else alias.name
            if alias.name in BANNED_MODULES:
                self.flag(node, f"imports {full}")
            if alias.name in ("Unpickler", "read_pickle"):
                self.flag(node, f"imports {full}")
            self.aliases[alias.asname or alias.name] = full
        self.generic_visit(node)

    # ---- names and calls
    def dotted(self, node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        head = self.aliases.get(node.id, node.id)
        return ".".join([head, *reversed(parts)])

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in ("Unpickler", "read_pickle"):
            self.flag(node, f"references {node.attr}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = self.dotted(node.func) or ""
        kwargs = {k.arg: k.value for k in node.keywords if k.arg}
        if name in ("torch.load", "torch.serialization.load"):
            wo = kwargs.get("weights_only")
            if not (isinstance(wo, ast.Constant) and wo.value is True):
                self.flag(node, f"{name}(...) without weights_only=True")
        elif name in ("torch.jit.load", "torch.package.PackageImporter"):
            self.flag(node, f"{name}(...) unpickles")
        elif name in ("numpy.load", "numpy.lib.format.read_array"):
            ap = kwargs.get("allow_pickle")
            if ap is not None and not (isinstance(ap, ast.Constant) and ap.value is False):
                self.flag(node, f"{name}(..., allow_pickle=...) may unpickle")
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                self.flag(node, f"{name}(*args/**kwargs): cannot prove allow_pickle is off")
        elif name.endswith("read_pickle"):
            self.flag(node, f"{name}(...) unpickles")
        elif name in ("torch.save", "torch.serialization.save"):
            self.torch_saves.append(node.lineno)
        self.generic_visit(node)


def scan(path: Path) -> _Scanner:
    rel = path.relative_to(PACKAGE).as_posix()
    scanner = _Scanner(rel)
    scanner.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return scanner


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_unpickling_code_path_in_the_package():
    files = package_files()
    assert len(files) > 30, files
    findings: list[Finding] = []
    saves: dict[str, list[int]] = {}
    for path in files:
        s = scan(path)
        findings += s.findings
        if s.torch_saves:
            saves[s.rel] = s.torch_saves
    for rel, lines in saves.items():
        if rel not in TORCH_SAVE_ALLOWED:
            findings += [Finding(rel, ln, "torch.save outside the export formats that require it") for ln in lines]
    print(f"\nscanned {len(files)} files; torch.save only in {sorted(saves)}")
    assert not findings, "pickle-based loading in the package:\n" + "\n".join(map(str, findings))


@pytest.mark.parametrize(
    "code, expected",
    [
        ("import pickle", "imports pickle"),
        ("import dill as d", "imports dill"),
        ("from marshal import loads", "imports from marshal"),
        ("import _pickle", "imports _pickle"),
        ("import torch\ntorch.load('x')", "without weights_only=True"),
        ("import torch as t\nt.load('x', weights_only=False)", "without weights_only=True"),
        ("from torch import load\nload('x')", "without weights_only=True"),
        ("import torch\nkw = {}\ntorch.load('x', **kw)", "without weights_only=True"),
        ("import numpy as np\nnp.load('x', allow_pickle=True)", "allow_pickle"),
        ("import numpy\nflag = True\nnumpy.load('x', allow_pickle=flag)", "allow_pickle"),
        ("import pandas as pd\npd.read_pickle('x')", "read_pickle"),
        ("import torch\ntorch.jit.load('m.pt')", "unpickles"),
        ("import io, pickle\npickle.Unpickler(io.BytesIO())", "Unpickler"),
    ],
)
def test_the_scanner_catches_what_it_must(tmp_path, code, expected):
    scanner = _Scanner("probe.py")
    scanner.visit(ast.parse(code))
    assert any(expected in f.what for f in scanner.findings), (code, scanner.findings)


@pytest.mark.parametrize(
    "code",
    [
        "import torch\ntorch.load('x', weights_only=True, mmap=True)",
        "import numpy as np\nnp.load('x')",
        "import numpy as np\nnp.load('x', allow_pickle=False)",
    ],
)
def test_the_scanner_accepts_safe_loads(code):
    scanner = _Scanner("probe.py")
    scanner.visit(ast.parse(code))
    assert scanner.findings == []


# ---------------------------------------------------------------------------- runtime
def _forbid(monkeypatch) -> list[str]:
    import _pickle

    import numpy

    calls: list[str] = []

    def trap(name):
        def refuse(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} was called while reading a dataset")

        return refuse

    for mod, attr in ((pickle, "load"), (pickle, "loads"), (_pickle, "load"), (_pickle, "loads"), (torch, "load"), (numpy, "load")):
        monkeypatch.setattr(mod, attr, trap(f"{mod.__name__}.{attr}"))

    class NoUnpickler:
        def __init__(self, *args, **kwargs):
            calls.append("pickle.Unpickler")
            raise AssertionError("pickle.Unpickler was used while reading a dataset")

    monkeypatch.setattr(pickle, "Unpickler", NoUnpickler)
    monkeypatch.setattr(_pickle, "Unpickler", NoUnpickler)
    return calls


@pytest.mark.parametrize("storage", ["native", "fp8"])
def test_reading_a_dataset_never_unpickles(tmp_path, monkeypatch, capsys, storage):
    from hs_dataset import open_dataset
    from hs_dataset.cli.main import main as cli_main
    from hs_dataset.formats import ShardWriter
    from hs_dataset.formats.verify import verify_dataset
    from tests.fixtures.samples import make_metadata, make_sample

    with ShardWriter(tmp_path, make_metadata(), final_norm_weight=torch.ones(16), storage=storage, shard_bytes=3_000) as writer:
        writer.add_many(make_sample(f"s{i}", 5 + i) for i in range(12))
    calls = _forbid(monkeypatch)
    ds = open_dataset(tmp_path, verify_hashes=True)
    items = list(ds)
    assert len(items) == 12 and ds[3]["sample_id"] == "s3"
    weight, _eps = ds.final_norm()
    assert weight.shape == (16,)
    assert verify_dataset(tmp_path).ok
    assert cli_main(["verify", str(tmp_path)]) == 0
    assert cli_main(["info", str(tmp_path)]) == 0
    capsys.readouterr()
    assert calls == []
