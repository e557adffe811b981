"""The legacy source patch (SGLang <= 0.5.5): real sglang files plus a toy model that runs.

Real files come from scripts/fetch_sglang_sources.sh (never downloaded here). When
one is missing the test is skipped, except in CI (CI set) where that is a failure.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
import torch

from hs_dataset.server_patch.contract.legacy_header import PATCH_VERSION
from hs_dataset.server_patch.legacy import edit as lp
from hs_dataset.server_patch.legacy.edit import LegacyPatchError, PatchState
from tests.fixtures.paths import REPO

CACHE = Path(os.environ.get("HS_DATASET_CACHE", "~/.cache/hs_dataset")).expanduser() / "sglang-wheels"
PATCHABLE = ["0.4.10.post2", "0.5.5", "0.5.5.post3", "0.5.8.post1"]
HOOK_MODULE = "hs_dataset.server_patch.legacy.hook"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def real_source(version: str) -> Path:
    path = CACHE / version / "deepseek_v2.py"
    if not path.is_file():
        message = f"{path} is missing: run scripts/fetch_sglang_sources.sh first"
        if _in_ci():
            pytest.fail(message + " (CI is set, so missing sources are an error)")
        pytest.skip(message)
    return path


@pytest.fixture(params=PATCHABLE)
def patchable(request, tmp_path) -> tuple[str, Path, bytes]:
    """(version, a private copy of its deepseek_v2.py, the original bytes)."""
    data = real_source(request.param).read_bytes()
    copy = tmp_path / "deepseek_v2.py"
    copy.write_bytes(data)
    return request.param, copy, data


# --------------------------------------------------------------------- placement


def _forward(tree: ast.Module) -> ast.FunctionDef:
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV2Model")
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward")


def _blocks(node: ast.AST):
    for sub in ast.walk(node):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(sub, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _calls(node: ast.AST, name: str) -> bool:
    return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == name for c in ast.walk(node))


def _is_norm_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "norm"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    )


def assert_placement(patched: str) -> None:
    """Independent AST check of where the three statements landed."""
    fwd = _forward(ast.parse(patched))
    begin = [i for i, s in enumerate(fwd.body) if _calls(s, "_hs_dataset_begin")]
    assert len(begin) == 1, "exactly one begin statement, at the top level of forward"
    loop = fwd.body[begin[0] + 1]
    assert isinstance(loop, ast.For), "begin statement directly precedes the decoder-layer loop"

    captures = [
        (b, i)
        for b in _blocks(fwd)
        for i, s in enumerate(b)
        if isinstance(s, ast.If)
        and isinstance(s.test, ast.Compare)
        and isinstance(s.test.comparators[0], ast.Name)
        and s.test.comparators[0].id == "_hs_ids"
    ]
    assert len(captures) == 1
    block, i = captures[0]
    assert any(s is block[i] for s in ast.walk(loop)), "capture statement is inside the layer loop"
    nxt = block[i + 1]
    assert isinstance(nxt, ast.Assign) and [e.id for e in nxt.targets[0].elts] == ["hidden_states", "residual"]

    emits = [
        (b, i)
        for b in _blocks(fwd)
        for i, s in enumerate(b)
        if isinstance(s, ast.If) and isinstance(s.body[0], ast.Expr) and _calls(s.body[0], "_hs_dataset_emit")
    ]
    assert len(emits) == 1
    block, i = emits[0]
    assert block[i].lineno > loop.end_lineno, "pre-norm capture comes after the loop"
    norms = [c for c in ast.walk(fwd) if _is_norm_call(c) and c.lineno > loop.end_lineno]
    assert norms and all(block[i].lineno < c.lineno for c in norms), "pre-norm capture is before the norm call"
    assert all(any(c is n for n in ast.walk(block[i + 1])) for c in norms), "norm calls follow it directly"
    assert isinstance(fwd.body[-1], ast.Return)


# --------------------------------------------------------------------- real sources


def test_check_recognises_real_sources(patchable):
    version, path, _ = patchable
    status = lp.check(path)
    assert status.state is PatchState.UNPATCHED, status.reason
    assert status.known_version == version
    assert set(status.anchors) == {"class DeepseekV2Model", "forward", "layer loop", "layer call", "final norm", "return"}


def test_apply_places_hook_calls(patchable):
    _, path, original = patchable
    status = lp.apply(path)
    assert status.state is PatchState.PATCHED, status.reason
    patched = path.read_text("utf-8")
    compile(patched, str(path), "exec")
    assert_placement(patched)
    # Only insertions: one marked block plus three marked statements, nothing else changed.
    kept, inside, marked = [], False, 0
    for line in patched.splitlines(keepends=True):
        if line.startswith(f"# >>> hs_dataset-patch v{PATCH_VERSION} original-sha256=" + status.original_sha256):
            inside = True
        elif line.startswith(f"# <<< hs_dataset-patch v{PATCH_VERSION}"):
            inside = False
        elif line.rstrip("\n").endswith(f"  # hs_dataset-patch v{PATCH_VERSION}"):
            marked += 1
        elif not inside:
            kept.append(line)
    assert marked == 3 and "".join(kept).encode() == original
    assert lp.backup_path(path, status.original_sha256).read_bytes() == original


def test_apply_is_idempotent(patchable):
    _, path, _ = patchable
    lp.apply(path)
    once = path.read_bytes()
    assert lp.apply(path).state is PatchState.PATCHED
    assert path.read_bytes() == once
    assert lp.patch_text.__name__  # the module API is importable from tests


def test_revert_is_byte_exact(patchable):
    _, path, original = patchable
    status = lp.apply(path)
    assert lp.revert(path).state is PatchState.UNPATCHED
    assert path.read_bytes() == original
    assert not lp.backup_path(path, status.original_sha256).exists()
    assert lp.revert(path).state is PatchState.UNPATCHED  # reverting twice is a no-op


def test_refuses_sglang_0_5_23(tmp_path):
    path = tmp_path / "deepseek_v2.py"
    path.write_bytes(real_source("0.5.23").read_bytes())
    before = path.read_bytes()
    status = lp.check(path)
    assert status.state is PatchState.UNRECOGNISED
    assert "decoder-layer loop" in status.reason and "0.5.9+" in status.reason
    with pytest.raises(LegacyPatchError, match="hooks mechanism"):
        lp.apply(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deepseek_v2.py"]


def _mutate(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize(
    "mutation, reason",
    [
        # the decoder-layer loop removed
        (lambda t: _mutate(t, "for i in range(normal_start_layer, normal_end_layer):", "if True:"), "decoder-layer loop"),
        # a second DeepseekV2Model: ambiguous
        (lambda t: t + "\n\nclass DeepseekV2Model:\n    pass\n", "ambiguous"),
        # final norm gone
        (
            lambda t: _mutate(
                t, "hidden_states, _ = self.norm(hidden_states, residual)", "hidden_states, _ = self.final_norm(hidden_states, residual)"
            ),
            "final norm",
        ),
        # the layer call no longer returns the residual (0.5.9+ style)
        (
            lambda t: _mutate(t, "                hidden_states, residual = layer(", "                hidden_states, topk = layer("),
            "decoder-layer loop",
        ),
        # the layer call shares its line with another statement
        (
            lambda t: _mutate(
                t, "                hidden_states, residual = layer(", "                pass; hidden_states, residual = layer("
            ),
            "does not start its line",
        ),
        # a name the patch would insert is already taken
        (lambda t: t + "\n_hs_aux = None\n", "already used"),
    ],
    ids=["loop-removed", "two-classes", "norm-removed", "no-residual", "same-line", "name-clash"],
)
def test_refuses_mutated_source(tmp_path, mutation, reason):
    path = tmp_path / "deepseek_v2.py"
    path.write_text(mutation(real_source("0.5.5").read_text("utf-8")), "utf-8")
    status = lp.check(path)
    assert status.state is PatchState.UNRECOGNISED and reason in status.reason, status.reason
    with pytest.raises(LegacyPatchError, match=reason):
        lp.apply(path)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("import os\n\n\ndef f():\n    return os.getcwd()\n", "class DeepseekV2Model"),
        ("def broken(:\n", "does not parse"),
        ("class DeepseekV2Model:\n    def forward(self, x):\n        return x\n", "forward_batch"),
    ],
    ids=["random-python", "syntax-error", "no-forward-batch"],
)
def test_refuses_unrelated_files(tmp_path, text, reason):
    path = tmp_path / "x.py"
    path.write_text(text)
    status = lp.check(path)
    assert status.state is PatchState.UNRECOGNISED and reason in status.reason
    with pytest.raises(LegacyPatchError, match=reason):
        lp.apply(path)
    assert path.read_text() == text


def test_modified_after_patching_is_detected_on_revert(tmp_path):
    path = tmp_path / "deepseek_v2.py"
    original = real_source("0.5.5").read_bytes()
    path.write_bytes(original)
    status = lp.apply(path)
    edited = path.read_text("utf-8").replace("class DeepseekV2Model(nn.Module):", "class DeepseekV2Model(nn.Module):  # local edit")
    path.write_text(edited, "utf-8")
    assert lp.check(path).state is PatchState.MODIFIED
    with pytest.raises(LegacyPatchError, match="modified after patching") as err:
        lp.revert(path)
    assert str(lp.backup_path(path, status.original_sha256)) in str(err.value) and "--force" in str(err.value)
    with pytest.raises(LegacyPatchError, match="revert"):
        lp.apply(path)
    assert path.read_text("utf-8") == edited
    assert lp.revert(path, force=True).state is PatchState.UNPATCHED
    assert path.read_bytes() == original


def test_edited_patch_lines_still_revert_exactly(tmp_path):
    path = tmp_path / "deepseek_v2.py"
    original = real_source("0.5.5").read_bytes()
    path.write_bytes(original)
    lp.apply(path)
    path.write_text(path.read_text("utf-8").replace("_HS_DATASET_STATE = None\n", "_HS_DATASET_STATE = None  \n"))
    assert lp.check(path).state is PatchState.MODIFIED
    lp.revert(path)
    assert path.read_bytes() == original


def test_an_older_patch_version_reverts_and_is_not_taken_for_ours(tmp_path):
    """A v1 patch (before the hook moved into server_patch/) is reported, refused by apply, and reverted byte for byte."""
    path = tmp_path / "deepseek_v2.py"
    original = real_source("0.5.5").read_bytes()
    path.write_bytes(original)
    lp.apply(path)
    older = path.read_text("utf-8").replace(f"hs_dataset-patch v{PATCH_VERSION}", "hs_dataset-patch v1")
    older = older.replace("hs_dataset.server_patch.legacy.hook", "hs_dataset.sglang.legacy.hook")
    assert older != path.read_text("utf-8")
    path.write_text(older, "utf-8")
    status = lp.check(path)
    assert status.state is PatchState.MODIFIED and "patch v1" in status.reason and "revert" in status.reason
    with pytest.raises(LegacyPatchError, match="revert"):
        lp.apply(path)
    assert lp.revert(path).state is PatchState.UNPATCHED
    assert path.read_bytes() == original
    assert lp.apply(path).state is PatchState.PATCHED


# --------------------------------------------------------------------- toy model that runs

TOY = '''\
import contextlib

import torch


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class ToyLayer:
    """Decoder layer with SGLang's residual convention and in-place fused add-RMSNorm."""

    def __init__(self, k):
        self.k = k

    def __call__(self, positions, hidden_states, forward_batch, residual):
        if residual is None:
            residual = hidden_states
            x = _rms(hidden_states)
        else:
            residual.add_(hidden_states)
            x = _rms(residual)
        return torch.tanh(x * (self.k + 1.5)) + 0.1 * self.k, residual


class ToyNorm:
    def __call__(self, hidden_states, residual=None):
        if residual is None:
            return _rms(hidden_states)
        residual.add_(hidden_states)
        hidden_states.copy_(_rms(residual))
        return hidden_states, residual


class DeepseekV2Model:
    def __init__(self, n):
        self.layers = [ToyLayer(k) for k in range(n)]
        self.norm = ToyNorm()
        self.is_last_rank = True

    def forward(self, input_ids, positions, forward_batch, input_embeds=None):
        hidden_states = input_embeds
        residual = None
        for i in range(len(self.layers)):
            with contextlib.nullcontext():
                layer = self.layers[i]
                hidden_states, residual = layer(positions, hidden_states, forward_batch, residual)
        if not self.is_last_rank:
            return hidden_states, residual
        else:
            if not forward_batch.forward_mode.is_idle():
                if residual is None:
                    hidden_states = self.norm(hidden_states)
                else:
                    hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states
'''
N_LAYERS = 4


class _Mode:
    def __init__(self, name: str):
        self.name = name

    def is_idle(self) -> bool:
        return self.name == "IDLE"


class _Batch:
    def __init__(self, mode: str = "EXTEND"):
        self.forward_mode = _Mode(mode)


def _toy_module(text: str) -> dict:
    namespace = {"__name__": "toy_deepseek_v2"}
    exec(compile(text, "toy_deepseek_v2.py", "exec"), namespace)
    return namespace


def _reference(embeds: torch.Tensor) -> list[torch.Tensor]:
    """HF-style hidden_states[0..N] (pre-norm) computed without the toy's in-place tricks."""
    rms = lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # noqa: E731
    states = [embeds.clone()]
    for k in range(N_LAYERS):
        states.append(states[-1] + torch.tanh(rms(states[-1]) * (k + 1.5)) + 0.1 * k)
    return states


def _run(namespace: dict, embeds: torch.Tensor, mode: str = "EXTEND") -> torch.Tensor:
    model = namespace["DeepseekV2Model"](N_LAYERS)
    return model.forward(None, None, _Batch(mode), input_embeds=embeds.clone())


@pytest.fixture
def fake_hook(monkeypatch) -> types.ModuleType:
    hook = types.ModuleType(HOOK_MODULE)
    hook.calls = []
    hook.on_forward = lambda fb, aux, final, ids: hook.calls.append((fb, aux, final, ids))
    monkeypatch.setitem(sys.modules, HOOK_MODULE, hook)
    monkeypatch.setenv("HS_CAPTURE_STAGING_DIR", "/nonexistent-staging")
    return hook


@pytest.fixture
def embeds() -> torch.Tensor:
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_toy_source_is_recognised():
    assert lp.check_text(TOY).state is PatchState.UNPATCHED
    assert_placement(lp.patch_text(TOY))


def test_toy_patched_captures_hf_states(fake_hook, embeds, monkeypatch):
    monkeypatch.setenv("HS_CAPTURE_LAYER_IDS", "3, 0,1")
    ref = _reference(embeds)
    out = _run(_toy_module(lp.patch_text(TOY)), embeds)
    ((batch, aux, final, ids),) = fake_hook.calls
    assert isinstance(batch, _Batch) and ids == [0, 1, 3]
    for layer_id, state in zip(ids, aux):
        torch.testing.assert_close(state, ref[layer_id], rtol=0, atol=1e-12)  # layer 0 included
    torch.testing.assert_close(final, ref[N_LAYERS], rtol=0, atol=1e-12)  # pre-norm final
    torch.testing.assert_close(out, _run(_toy_module(TOY), embeds), rtol=0, atol=0)  # output unchanged


def test_toy_layer0_capture_survives_in_place_update(fake_hook, monkeypatch):
    """Layer 0's input is updated in place by the layers after it; the capture is a copy."""
    monkeypatch.setenv("HS_CAPTURE_LAYER_IDS", "0")
    namespace = _toy_module(lp.patch_text(TOY))
    given = torch.randn(3, 8, dtype=torch.float64)
    kept = given.clone()
    namespace["DeepseekV2Model"](N_LAYERS).forward(None, None, _Batch(), input_embeds=given)
    assert not torch.equal(given, kept)  # the toy (like SGLang) did mutate it
    torch.testing.assert_close(fake_hook.calls[0][1][0], kept, rtol=0, atol=0)


def test_toy_capture_off_is_original(embeds, monkeypatch):
    monkeypatch.delenv("HS_CAPTURE_STAGING_DIR", raising=False)
    monkeypatch.setitem(sys.modules, HOOK_MODULE, None)  # importing it would fail
    patched = _toy_module(lp.patch_text(TOY))
    for mode in ("EXTEND", "DECODE"):
        torch.testing.assert_close(_run(patched, embeds, mode), _run(_toy_module(TOY), embeds, mode), rtol=0, atol=0)
    assert patched["_HS_DATASET_STATE"] == (None, ())


def test_toy_only_wanted_batches_reach_hook(fake_hook, embeds, monkeypatch):
    monkeypatch.setenv("HS_CAPTURE_LAYER_IDS", "1")
    namespace = _toy_module(lp.patch_text(TOY))
    for mode in ("DECODE", "IDLE", "MIXED"):  # default without wants(): EXTEND only
        _run(namespace, embeds, mode)
    assert fake_hook.calls == []
    fake_hook.wants = lambda fb: fb.forward_mode.name == "DECODE"
    _run(_toy_module(lp.patch_text(TOY)), embeds, "EXTEND")
    _run(_toy_module(lp.patch_text(TOY)), embeds, "DECODE")
    assert [c[0].forward_mode.name for c in fake_hook.calls] == ["DECODE"]


def test_toy_missing_hook_module_is_a_clear_error(embeds, monkeypatch):
    monkeypatch.setenv("HS_CAPTURE_STAGING_DIR", "/nonexistent-staging")
    monkeypatch.setenv("HS_CAPTURE_LAYER_IDS", "1")
    monkeypatch.setitem(sys.modules, HOOK_MODULE, None)
    with pytest.raises(RuntimeError, match="HS_CAPTURE_STAGING_DIR is set .* cannot be imported"):
        _run(_toy_module(lp.patch_text(TOY)), embeds)


@pytest.mark.parametrize("raw", ["", "a,b", "1,1", "-1,2"])
def test_toy_bad_layer_ids_are_a_clear_error(fake_hook, embeds, monkeypatch, raw):
    monkeypatch.setenv("HS_CAPTURE_LAYER_IDS", raw)
    with pytest.raises(RuntimeError, match="HS_CAPTURE_LAYER_IDS"):
        _run(_toy_module(lp.patch_text(TOY)), embeds)


def test_toy_layer_id_past_last_layer_is_a_clear_error(fake_hook, embeds, monkeypatch):
    monkeypatch.setenv("HS_CAPTURE_LAYER_IDS", f"1,{N_LAYERS}")
    with pytest.raises(RuntimeError, match=rf"layers \[{N_LAYERS}\] were not captured"):
        _run(_toy_module(lp.patch_text(TOY)), embeds)


def test_crlf_source_round_trips(tmp_path):
    path = tmp_path / "deepseek_v2.py"
    original = TOY.replace("\n", "\r\n").encode()
    path.write_bytes(original)
    lp.apply(path)
    patched = path.read_bytes()
    assert b"\n" not in patched.replace(b"\r\n", b"")  # inserted lines use CRLF too
    compile(patched, str(path), "exec")
    lp.revert(path)
    assert path.read_bytes() == original


# --------------------------------------------------------------------- CLI, script, standalone


def _cli(*argv: str) -> int:
    from hs_dataset.cli.main import main

    return main(["patch", *argv])


def test_cli_check_apply_revert(tmp_path, capsys):
    path = tmp_path / "deepseek_v2.py"
    path.write_text(TOY)
    assert _cli("check", "--file", str(path)) == 1
    assert _cli("apply", "--dry-run", "--file", str(path)) == 0
    assert "+" + "        _hs_ids, _hs_aux" in capsys.readouterr().out and path.read_text() == TOY
    assert _cli("apply", "--file", str(path)) == 0
    capsys.readouterr()
    assert _cli("check", "--json", "--file", str(path)) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "patched"
    assert _cli("revert", "--file", str(path)) == 0 and path.read_text() == TOY
    path.write_text("x = 1\n")
    assert _cli("check", "--file", str(path)) == 2
    assert _cli("apply", "--file", str(path)) == 2
    assert "DeepseekV2Model" in capsys.readouterr().err


def test_cli_sglang_root(tmp_path, capsys):
    pkg = tmp_path / "site-packages" / "sglang"
    (pkg / "srt" / "models").mkdir(parents=True)
    (pkg / "version.py").write_text('__version__ = "0.5.5"\n')
    (pkg / "srt" / "models" / "deepseek_v2.py").write_text(TOY)
    for root in (pkg, pkg.parent):
        assert _cli("check", "--sglang-root", str(root)) == 1
        assert "(sglang 0.5.5)" in capsys.readouterr().out
    assert _cli("check", "--sglang-root", str(tmp_path)) == 2
    assert "no srt/models/deepseek_v2.py" in capsys.readouterr().err


def test_legacy_patch_runs_on_the_bare_standard_library(tmp_path):
    """-I -S: no site-packages, no hs_dataset, no PYTHONPATH -- as if copied into the server."""
    path = tmp_path / "deepseek_v2.py"
    path.write_text(TOY)
    script = REPO / "hs_dataset" / "server_patch" / "legacy" / "patch.py"
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(script), "apply", "--file", str(path)], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "patched" in proc.stdout and "_hs_dataset_begin" in path.read_text()


def test_cli_module_import_is_light():
    """Building the `hs-dataset` parser must not pull anything in beyond the package itself."""
    code = "import sys, hs_dataset; before = set(sys.modules); import hs_dataset.cli.patch; print(sorted(set(sys.modules) - before))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    new = eval(out)  # a printed list of module names
    heavy = {m for m in new if m.split(".")[0] in {"torch", "transformers", "datasets", "safetensors", "numpy", "sglang"}}
    assert "hs_dataset.cli.patch" in new and not heavy, heavy


def test_fetch_script_is_idempotent_offline(tmp_path):
    """Already-extracted versions are skipped, a cached wheel is extracted; nothing is downloaded."""
    cache = tmp_path / "sglang-wheels"
    (cache / "9.9.9").mkdir(parents=True)
    (cache / "9.9.9" / "deepseek_v2.py").write_text("kept\n")
    with zipfile.ZipFile(cache / "sglang-9.9.8-py3-none-any.whl", "w") as whl:
        whl.writestr("sglang/srt/models/deepseek_v2.py", "extracted\n")
    env = dict(os.environ, HS_DATASET_CACHE=str(tmp_path), PYTHON=sys.executable)
    for _ in range(2):
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "fetch_sglang_sources.sh"), "9.9.9", "9.9.8"], capture_output=True, text=True, env=env
        )
        assert proc.returncode == 0, proc.stderr
    assert (cache / "9.9.9" / "deepseek_v2.py").read_text() == "kept\n"
    assert (cache / "9.9.8" / "deepseek_v2.py").read_text() == "extracted\n"
    assert "ok      9.9.8" in proc.stdout
