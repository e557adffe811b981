"""The trained tiny verifier through a REAL SGLang 0.5.23 CPU server: our data from it, and SGLang's own EAGLE-3.

* ``test_sglang_data_of_the_verifier_equals_the_hf_backend``: ``build_dataset`` with
  regeneration through a patched SGLang capture server gives the same turns and the same
  states (float32) as through the HF backend.
* ``test_sglang_eagle3_runs_a_drafter_trained_on_our_data``: a drafter trained by
  speculators on that data, converted to SGLang's EAGLE-3 draft format, runs inside
  SGLang's own speculative decoding (``--speculative-algorithm EAGLE3``, top-k 1): output
  identical to plain greedy, drafts accepted, and exactly as many drafts accepted in as many
  verify passes as our draft-and-verify loop (``acceptance_lib.speculative``) with the same
  drafter on the same prompts: the two implementations agree.

SGLang's EAGLE path does not run on a CPU without AMX as installed: it calls sgl-kernel CPU
ops that the CPU stand-in lacks (first ``copy_all_layer_kv_cache_cpu`` at start-up,
``mem_cache/memory_pool.py`` ``_init_kv_copy_and_warmup`` -> ``kernels/ops/kvcache/cache_move.py``)
and its ``DraftBackendFactory`` (``speculative/draft_utils.py``) knows no ``torch_native``
draft backend (``ValueError: EAGLE is not supported in attention backend torch_native``).
``tests/sglang_eagle3_shim`` supplies both for the test server only.

Needs ``.sglang-venv`` (``make sglang-env``); skipped with a message when it is missing,
except under CI (env ``CI`` set), where that is a failure.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from tests.fixtures.interop import require_interop

pytestmark = pytest.mark.sglang

from tests.fixtures.ports import free_port as _free_port  # noqa: E402
from tests.fixtures.sglang_server import (  # noqa: E402
    SERVER_PYTHON,
    rel,
    require_sglang_env as _require_env,
)

SAMPLES, EPOCHS, K, MAX_NEW, PROMPTS = 64, 8, 3, 32, 6


@pytest.fixture(scope="module")
def lib():
    from tests.fixtures import acceptance as acceptance_lib

    return acceptance_lib


@pytest.fixture(scope="module")
def ci_verifier() -> Path:
    from tests.fixtures.tiny_verifier import build_ci_verifier

    return build_ci_verifier()


@pytest.fixture(scope="module")
def hf_data(lib, ci_verifier, tmp_path_factory) -> Path:
    """Our data from the verifier through the HF backend (regenerated answers)."""
    return lib.build_ours(ci_verifier, tmp_path_factory.mktemp("hf") / "ours", SAMPLES, seed=7)


def test_sglang_data_of_the_verifier_equals_the_hf_backend(lib, ci_verifier, hf_data, tmp_path):
    from hs_dataset.capture.serve import launch, plan_server
    from hs_dataset.capture.sglang.backend import SGLangBackend
    from hs_dataset.formats.reader import open_dataset
    from hs_dataset.pipeline.build import build_dataset

    _require_env()
    source = lib.write_prompts(tmp_path / "prompts.jsonl", SAMPLES, seed=7)
    # Same source rows and regeneration settings as the HF build; mechanism auto (aux_return). A Llama
    # model on SGLang 0.5.23 returns its aux states as a list (AuxHiddenStateList), DeepseekV3 as one tensor.
    card = lib.sglang_verifier_card(ci_verifier, source)
    plan = plan_server(card, port=_free_port(), staging_dir=str(tmp_path / "stage"), python=str(SERVER_PYTHON))
    t0 = time.monotonic()
    server = launch(plan, log_path=str(tmp_path / "server.log"), timeout=300)
    try:
        print(f"\n[verifier capture server] healthy after {time.monotonic() - t0:.1f} s")
        backend = SGLangBackend.from_card(card, servers=[server.url])
        try:
            build_dataset(card, tmp_path / "sglang", backend=backend)
        finally:
            backend.close()
    finally:
        server.stop(timeout=5)
    ours, theirs = open_dataset(hf_data), open_dataset(tmp_path / "sglang")
    assert len(ours) == len(theirs) == SAMPLES
    by_id = {theirs[i]["sample_id"]: theirs[i] for i in range(len(theirs))}
    worst = 0.0
    for i in range(len(ours)):
        a = ours[i]
        b = by_id[a["sample_id"]]
        assert torch.equal(a["input_ids"], b["input_ids"]), a["sample_id"]  # same regenerated turns
        assert torch.equal(a["loss_mask"], b["loss_mask"]), a["sample_id"]
        worst = max(worst, rel(b["aux_hidden_states"], a["aux_hidden_states"]), rel(b["final_hidden_state"], a["final_hidden_state"]))
    print(f"{SAMPLES} regenerated samples: SGLang vs HF backend, identical tokens, max relative state error {worst:.1e}")
    assert worst < 1e-5


def test_sglang_eagle3_runs_a_drafter_trained_on_our_data(lib, ci_verifier, hf_data, tmp_path):
    from tests.fixtures.tiny_verifier import VERIFIER_AUX_LAYERS

    _require_env()
    require_interop("speculators.train.trainer")
    checkpoint = lib.train_drafter(ci_verifier, hf_data, tmp_path / "train", seed=0, epochs=EPOCHS, extra=("--no-norm-before-residual",))
    verifier = lib.Verifier(ci_verifier, VERIFIER_AUX_LAYERS)
    prompts = lib.heldout_prompts(PROMPTS, seed=99)
    ours = lib.evaluate(verifier, lib.load_drafter(checkpoint), prompts, K, MAX_NEW)
    draft = lib.sglang_draft_dir(checkpoint, ci_verifier, tmp_path / "sglang-draft")
    t0 = time.monotonic()
    with lib.SGLangEagle3Server(ci_verifier, draft, K, tmp_path / "eagle3.log") as server:
        print(f"\n[EAGLE-3 server] healthy after {time.monotonic() - t0:.1f} s")
        got = lib.sglang_evaluate(server, verifier, prompts, MAX_NEW)
    accepted_ours = sum(ours.rounds) - len(ours.rounds)
    print(
        f"our loop: tau {ours.tau:.2f} ({accepted_ours} drafts accepted in {len(ours.rounds)} rounds); "
        f"SGLang EAGLE3: spec_accept_length {got.accept_length:.2f}, tau {got.tau:.2f} ({got.correct_drafts} accepted in {got.verify_ct} verify passes); "
        f"greedy-exact ours {ours.exact}, SGLang {got.exact}"
    )
    assert got.exact and ours.exact, "speculative output differs from plain greedy"
    assert got.correct_drafts > 0 and got.tau > 1.1
    assert (got.correct_drafts, got.verify_ct) == (accepted_ours, len(ours.rounds))
