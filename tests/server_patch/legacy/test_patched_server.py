"""The legacy source patch (SGLang <= 0.5.5), run: a real patched SGLang 0.5.5 server on CPU, its states against transformers.

SGLang 0.5.5 has no forward hooks, so capture goes through ``hs-dataset patch apply``
(docs/LEGACY_PATCH.md). Here a private copy of the 0.5.5 overlay's ``sglang`` package
(``make sglang-overlays``) is patched by the CLI, exactly as a user patches their install,
and served by ``hs-dataset serve``'s own plan (``mechanism: legacy``: ``HS_CAPTURE_*``
variables, dumps keyed by content, chunked prefill off). A build through the client is
compared with an independent transformers forward on the tiny DeepseekV3 in float32,
with concurrent requests batched into one prefill.

0.5.5's CPU path on a CPU without AMX needs three things the machine lacks, given by
``tests/shims/sglang_legacy_shim`` (test-only, nothing installed is edited): the
``sgl_kernel`` names imported at module load (never called), the ``vllm`` fallback
imports of its activations and norms (answered with SGLang's own classes), and the
``torch_native`` MLA attention handler.

Chunked prefill cannot be captured here: 0.5.5's batches carry no request ids, so the
chunks of one prompt cannot be joined; the plan turns it off and the patch's hook refuses a
server started with it at the first forward pass (tests/capture/serve/test_legacy_plan.py).
"""

from __future__ import annotations

import os
import shutil

import pytest

from hs_dataset.capture.base import CapturedSample, CaptureFailure
from tests.fixtures.paths import REPO, SERVER_PYTHON, SHIMS
from tests.fixtures.sglang_client import backend, make_samples
from tests.fixtures.sglang_server import hf_reference, rel, server_python, start_server

pytestmark = pytest.mark.sglang

RELEASE = "0.5.5"
SHIM = SHIMS / "sglang_legacy_shim"


@pytest.fixture(scope="module")
def patched_python(hs_tmp):
    """An interpreter whose ``sglang`` is a patched private copy of the 0.5.5 overlay's (which stays untouched)."""
    from hs_dataset.cli.main import main as cli

    server_python(RELEASE)  # skips (fails in CI) without `make sglang-overlays`
    overlay = SERVER_PYTHON.parents[1] / "overlays" / RELEASE
    site = hs_tmp / "legacy-site"
    shutil.copytree(overlay / "sglang", site / "sglang")
    for dist in overlay.glob("sglang-*.dist-info"):
        shutil.copytree(dist, site / dist.name)
    assert cli(["patch", "apply", "--sglang-root", str(site)]) == 0
    assert cli(["patch", "check", "--sglang-root", str(site)]) == 0  # 0: patched
    python = hs_tmp / "python-legacy"
    python.write_text(
        "#!/usr/bin/env bash\n# the CPU server env with a patched copy of sglang 0.5.5 first on the path\n"
        f'export PYTHONPATH="{site}:{overlay}${{PYTHONPATH:+:$PYTHONPATH}}"\nexec "{SERVER_PYTHON}" "$@"\n'
    )
    python.chmod(0o755)
    return str(python)


def _shim_env(card) -> dict:
    """The card's server env with the shim first, then this checkout (whose patch hook the server must run)."""
    return {"env": {**card.sglang.env, "PYTHONPATH": f"{SHIM}{os.pathsep}{REPO}"}}


@pytest.fixture(scope="module")
def legacy_server(card, tiny_model, hs_tmp, patched_python):
    server = start_server(card, hs_tmp, "legacy", python=patched_python, **_shim_env(card))
    yield server
    server.stop(timeout=5)


def test_the_patched_release_captures_what_transformers_computes(card, legacy_server, hf_model):
    from hs_dataset.capture.sglang.diagnose import read_report

    server = legacy_server
    plan = server.plan
    assert plan.sglang_version == RELEASE and plan.mechanism == "legacy", plan.describe()
    assert "--forward-hooks" not in plan.argv and plan.argv[plan.argv.index("--chunked-prefill-size") + 1] == "-1"
    assert plan.env["HS_CAPTURE_LAYER_IDS"] == "2,3,4" and plan.env["HS_CAPTURE_CONTENT_KEYS"] == "1"
    samples, results = [], {}
    be = backend(card, server, concurrency=6, staging_dir=server.staging_dir)
    try:
        for attempt in range(4):  # until some prefill held several requests: on a loaded machine they may arrive apart
            more = make_samples(12, [5, 37, 64, 65, 130, 300, 1, 90], seed=7 + attempt)
            samples += more
            results.update({r.sample_id: r for r in be.capture_stream(more, batch_size=6)})
            batched = read_report(server.staging_dir).count("max_batch_requests")
            if batched >= 2:
                break
        ep = be.endpoints[0]
        verification = be.info().verification
    finally:
        be.close()
    assert not [r for r in results.values() if isinstance(r, CaptureFailure)], results
    assert not ep.uses_rids and ep.mechanism == "legacy"  # 0.5.5's ForwardBatch has no rids: dumps keyed by content
    assert verification["verified"] and verification["mechanism"] == "legacy", verification
    assert batched >= 2, f"no prefill held more than one request ({batched}) in {attempt + 1} rounds: concurrency was not exercised"
    worst = {"aux_rel": 0.0, "final_rel": 0.0, "aux_abs": 0.0, "final_abs": 0.0}
    for s in samples:
        r = results[s.sample_id]
        assert isinstance(r, CapturedSample) and r.input_ids.tolist() == s.input_ids.tolist()
        ref_aux, ref_final = hf_reference(hf_model, s.input_ids)
        worst["aux_rel"] = max(worst["aux_rel"], max(rel(r.aux_hidden_states[:, k], ref_aux[:, k]) for k in range(3)))
        worst["final_rel"] = max(worst["final_rel"], rel(r.final_hidden_state, ref_final))
        worst["aux_abs"] = max(worst["aux_abs"], float((r.aux_hidden_states.double() - ref_aux.double()).abs().max()))
        worst["final_abs"] = max(worst["final_abs"], float((r.final_hidden_state.double() - ref_final.double()).abs().max()))
    print(
        f"SGLang {RELEASE} legacy patch vs transformers ({len(samples)} prompts, up to {batched} per prefill): "
        + ", ".join(f"worst {k} {v:.2e}" for k, v in worst.items())
    )
    assert worst["aux_rel"] < 1e-6 and worst["final_rel"] < 1e-6, worst
