"""Proof by training, reduced: a drafter trained on our data beats one trained with zeroed aux states, and
draft-and-verify decoding reproduces plain greedy exactly.

The verifier is the smaller CI recipe of ``hs_dataset/testing/tiny_verifier.py`` (built
once and cached). The full measurement, with shifted and post-norm states, is
``benchmarks/bench_acceptance.py``; helpers: ``tests/acceptance_lib.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import require_interop

K, MAX_NEW, EPOCHS, SAMPLES = 3, 32, 10, 96


@pytest.fixture(scope="module")
def lib():
    require_interop("speculators.train.trainer")
    import acceptance_lib

    return acceptance_lib


@pytest.fixture(scope="session")
def ci_verifier() -> Path:
    from hs_dataset.testing.tiny_verifier import build_ci_verifier

    return build_ci_verifier()


def test_our_data_beats_zeroed_aux_and_decoding_is_exact(lib, ci_verifier: Path, tmp_path: Path) -> None:
    import json

    from hs_dataset.testing.tiny_verifier import VERIFIER_AUX_LAYERS

    stats = json.loads((ci_verifier / "training.json").read_text())
    print(f"\nverifier: loss {stats['final_train_loss']}, held-out answer accuracy {stats['heldout_answer_next_token_accuracy']}")
    ours = lib.build_ours(ci_verifier, tmp_path / "ours", SAMPLES, seed=7)
    zeroed = lib.write_broken(ours, tmp_path / "zero_aux", "zero_aux")
    verifier = lib.Verifier(ci_verifier, VERIFIER_AUX_LAYERS)
    prompts = lib.heldout_prompts(8, seed=99)
    scores = {}
    for name, data in (("ours", ours), ("zero_aux", zeroed)):
        checkpoint = lib.train_drafter(ci_verifier, data, tmp_path / f"train-{name}", seed=0, epochs=EPOCHS)
        scores[name] = lib.evaluate(verifier, lib.load_drafter(checkpoint), prompts, K, MAX_NEW)
        depth1 = scores[name].hits[0] / max(1, scores[name].tries[0])
        print(f"{name}: agreement@1 {depth1:.2f}, tau {scores[name].tau:.2f}, greedy-exact {scores[name].exact}")
    assert scores["ours"].exact and scores["zero_aux"].exact, "draft-and-verify output differs from plain greedy"
    assert scores["ours"].tau > scores["zero_aux"].tau
