"""The Kimi-K2.5-shaped remote-code snapshot through the REAL SGLang 0.5.23 server (CPU, float32).

The snapshot (``tests.fixtures.remote_code_snapshot``: tiktoken tokenizer via
``auto_map``, ``kimi_k25`` wrapper config, a stand-in remote-code processor) is served
by SGLang's own ``KimiK25ForConditionalGeneration`` with ``--trust-remote-code``,
started the way a user starts it: ``hs-dataset serve --model SNAPSHOT
--trust-remote-code`` (card derived from the model; once per module, ~25 s on 2
cores). The 42 bundled conversations are built through it, and the first 12 through
the HF backend (all 42 are tests/model/test_card_from_model.py's), both with ``--final-state post_norm``,
and checked against an independent transformers forward of the text model:

* aux and pre-norm final states of both backends within 1e-6 (relative, float32);
* both record the same final state (pre-norm), norm weight and eps;
* ``hs-dataset export specforge`` of both gives post-norm states equal to
  transformers' own ``model.norm`` output within 1e-6.

Also: ``hs-dataset serve --check`` refuses, in one line naming the file, a snapshot
whose processor code does not load, before any server starts.

Needs ``.sglang-venv`` (``make sglang-env``): skipped with a message when missing,
except under CI (env ``CI`` set), where that is a failure.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import pytest
import torch

from hs_dataset.cli.main import main
from hs_dataset.formats.reader import open_dataset
from tests.fixtures.ports import free_port as _free_port
from tests.fixtures.sglang_server import (
    SERVER_PYTHON,
    require_sglang_env as _require_env,
)

pytestmark = pytest.mark.sglang
pytest.importorskip("tiktoken")

LIMIT = 1e-6
HF_SAMPLES = 12  # the HF backend on all 42 samples is tests/model/test_card_from_model.py's job; here it is the twin of the SGLang build


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def snapshot() -> Path:
    from tests.fixtures.remote_code_snapshot import build_kimi_like_snapshot

    return build_kimi_like_snapshot()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kimi-sglang")


@pytest.fixture(scope="module")
def kimi_server(snapshot, root):
    """``hs-dataset serve --model SNAPSHOT --trust-remote-code`` in the foreground of a child process; SIGTERM stops it."""
    _require_env()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = root / "server.log"
    argv = [
        sys.executable,
        "-m",
        "hs_dataset.cli.main",
        "serve",
        "--model",
        str(snapshot),
        "--trust-remote-code",
        "--port",
        str(port),
        "--staging-dir",
        str(root / "stage"),
        "--python",
        str(SERVER_PYTHON),
        "--log",
        str(log),
    ]
    out = open(root / "serve.out", "wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        while not _healthy(url):
            if proc.poll() is not None:
                pytest.fail(f"hs-dataset serve exited with {proc.returncode}: {(root / 'serve.out').read_text()[-3000:]}")
            if time.monotonic() - t0 > 300:
                pytest.fail(f"the Kimi server was not healthy after 300 s; log tail: {log.read_text()[-3000:] if log.exists() else ''}")
            time.sleep(0.5)
        print(f"\n[kimi] hs-dataset serve healthy after {time.monotonic() - t0:.1f} s at {url}")
        yield {"url": url, "log": log, "staging": root / "stage"}
    finally:
        proc.send_signal(signal.SIGTERM)  # the CLI stops the server's process group, then exits 130
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        out.close()


@pytest.fixture(scope="module")
def builds(snapshot, kimi_server, root):
    """The bundled conversations built through the server and through the HF backend, asking for the post-norm state."""
    common = ["--model", str(snapshot), "--trust-remote-code", "--final-state", "post_norm", "--no-progress"]
    t0 = time.monotonic()
    assert main(["build", *common, "--server", kimi_server["url"], "--out", str(root / "sglang")]) == 0
    t1 = time.monotonic()
    assert (
        main(["build", *common, "--num-samples", str(HF_SAMPLES), "--out", str(root / "hf")]) == 0
    )  # all 42: tests/model/test_card_from_model.py
    print(f"[kimi] builds: SGLang {t1 - t0:.1f} s, HF {time.monotonic() - t1:.1f} s")
    return {"sglang": open_dataset(root / "sglang"), "hf": open_dataset(root / "hf")}


@pytest.fixture(scope="module")
def reference(snapshot, root):
    """``ids -> (hidden_states, pre-norm final, post-norm final)`` of an independent transformers forward."""
    from tests.fixtures.remote_code_snapshot import independent_text_forward

    where = root / "reference"
    where.mkdir()
    model = independent_text_forward(snapshot, where)
    seen: dict[str, torch.Tensor] = {}
    model.model.norm.register_forward_hook(lambda _m, args, out: seen.update(pre=args[0], post=out))
    done: dict[tuple[int, ...], tuple] = {}  # each sample is run once for all the tests of the module

    def forward(ids: torch.Tensor):
        key = tuple(ids.tolist())
        if key not in done:
            with torch.no_grad():
                out = model.model(input_ids=ids.long()[None], output_hidden_states=True)
            done[key] = (out.hidden_states, seen["pre"][0], seen["post"][0])
        return done[key]

    return forward


def test_real_kimi_class_serves_the_snapshot(kimi_server):
    log = kimi_server["log"].read_text()
    assert "type=KimiK25ForConditionalGeneration" in log  # SGLang's own wrapper class, not a text-only stand-in
    assert "'trust_remote_code': True" in log
    assert "Registered forward hook 'hs_capture_final' on language_model.model.norm" in log


def test_both_backends_match_transformers_and_record_the_same_final_state(builds, reference, snapshot):
    sg, hf = builds["sglang"], builds["hf"]
    assert len(sg) == 42 and len(hf) == HF_SAMPLES
    meta_sg, meta_hf = sg.manifest.metadata.to_json(), hf.manifest.metadata.to_json()
    for key in ("aux_layer_ids", "final_state", "layer_convention", "dtype", "hidden_size"):
        assert meta_sg[key] == meta_hf[key], key
    assert meta_sg["final_state"] == "pre_norm" and meta_sg["aux_layer_ids"] == [2, 3, 4]
    # the norm both record: the snapshot's language_model.model.norm, with the text config's eps
    from safetensors import safe_open

    with safe_open(str(snapshot / "model.safetensors"), "pt") as f:
        norm = f.get_tensor("language_model.model.norm.weight").float()
    eps = json.loads((snapshot / "config.json").read_text())["text_config"]["rms_norm_eps"]
    (w_sg, eps_sg), (w_hf, eps_hf) = sg.final_norm(), hf.final_norm()
    assert torch.equal(w_sg, w_hf) and torch.equal(w_sg.float(), norm)
    assert eps_sg == eps_hf == pytest.approx(eps)
    assert dict(meta_sg["final_norm"].items()) == dict(meta_hf["final_norm"].items())
    worst = {b: {"aux": 0.0, "final": 0.0} for b in ("sglang", "hf")}
    by_id = {hf[i]["sample_id"]: hf[i] for i in range(len(hf))}
    for i in range(len(sg)):
        row = sg[i]
        twin = by_id.get(row["sample_id"])
        pairs = [("sglang", row)]
        if twin is not None:
            assert torch.equal(row["input_ids"], twin["input_ids"]) and torch.equal(row["loss_mask"], twin["loss_mask"])
            pairs.append(("hf", twin))
        hidden, pre, _post = reference(row["input_ids"])
        for name, r in pairs:
            for k, layer in enumerate(meta_sg["aux_layer_ids"]):
                worst[name]["aux"] = max(worst[name]["aux"], rel(r["aux_hidden_states"][:, k], hidden[layer][0]))
            worst[name]["final"] = max(worst[name]["final"], rel(r["final_hidden_state"], pre))
    assert len(by_id) == HF_SAMPLES and set(by_id) <= {sg[i]["sample_id"] for i in range(len(sg))}
    print(f"[kimi] worst relative error vs transformers (SGLang 42 samples, HF {HF_SAMPLES}): {worst}")
    assert all(v < LIMIT for b in worst.values() for v in b.values()), worst


def test_specforge_export_post_norm_equals_transformers_norm_output(builds, reference, root):
    worst = {}
    for name, ds in builds.items():
        dest = root / f"forge-{name}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "cannot train": float32 kept on purpose, to measure
            assert main(["export", "specforge", str(ds.root), str(dest), "--keep-dtype"]) == 0
        files = sorted(dest.glob("rows_*/data_*.ckpt"))
        assert len(files) == len(ds)
        worst[name] = 0.0
        for path in files:
            raw = torch.load(path, weights_only=True)
            ids = raw["input_ids"].reshape(-1)
            _hidden, pre, post = reference(ids)
            derived = raw["hidden_state"][0]
            assert derived.dtype == torch.float32
            worst[name] = max(worst[name], rel(derived, post))
            assert rel(pre, post) > 0.1  # the export really changed the state: pre- and post-norm differ
    print(f"[kimi] specforge export post-norm vs transformers model.norm output, worst relative error: {worst}")
    assert all(v < LIMIT for v in worst.values()), worst


def test_serve_check_refuses_processor_code_that_does_not_load(snapshot, tmp_path, capsys):
    """``serve --check``: a broken processing_*.py is named in one line, before any server starts."""
    _require_env()
    copy = tmp_path / "kimi-broken-processor"
    shutil.copytree(snapshot, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    for weights in snapshot.glob("*.safetensors"):
        (copy / weights.name).symlink_to(weights)
    argv = ["serve", "--model", str(copy), "--trust-remote-code", "--check", "--python", str(SERVER_PYTHON), "--port", str(_free_port())]
    assert main(argv) == 0  # intact: the plan is printed
    assert "KimiK25ForConditionalGeneration" in capsys.readouterr().out
    code = (copy / "processing_kimi.py").read_text()
    (copy / "processing_kimi.py").write_text(
        code.replace("class KimiLikeProcessor(ProcessorMixin):", "class KimiLikeProcessor(ProcessorMixin)\n")
    )
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "processing_kimi.py" in err[0] and "does not load" in err[0], err


def test_serve_check_loads_the_processor_in_the_server_python(snapshot, tmp_path, capsys):
    """The processor check runs in the server's interpreter (its packages), not in the builder's."""
    _require_env()
    calls = tmp_path / "calls.log"
    wrapper = tmp_path / "server-python"
    wrapper.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\nexec {SERVER_PYTHON} "$@"\n')
    wrapper.chmod(0o755)
    argv = ["serve", "--model", str(snapshot), "--trust-remote-code", "--check", "--python", str(wrapper), "--port", str(_free_port())]
    assert main(argv) == 0, capsys.readouterr().err
    assert "check_processor_files" in calls.read_text(), calls.read_text()[:500]
