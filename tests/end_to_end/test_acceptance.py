"""Proof by training, reduced: a drafter trained on our data beats one trained with zeroed aux states, and
draft-and-verify decoding reproduces plain greedy exactly. Also: the verifier's final-norm
reparameterisation keeps its function, and the states ``build_dataset`` stores for it equal
an independent transformers forward.

The verifier is the smaller CI recipe of ``tests/fixtures/tiny_verifier.py`` (built
once and cached). The full measurement, with shifted and post-norm states, is
``benchmarks/bench_acceptance.py``; helpers: ``tests/acceptance_lib.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.interop import require_interop

K, MAX_NEW, EPOCHS, SAMPLES = 3, 32, 10, 96


@pytest.fixture(scope="module")
def lib():
    require_interop("speculators.train.trainer")
    from tests.fixtures import acceptance as acceptance_lib

    return acceptance_lib


@pytest.fixture(scope="session")
def ci_verifier() -> Path:
    from tests.fixtures.tiny_verifier import build_ci_verifier

    return build_ci_verifier()


def _independent(model, ids):
    """HF ``hidden_states`` at the aux indexes and the input of the final norm (pre-norm), one sequence."""
    import torch

    from tests.fixtures.reference import aux_and_prenorm
    from tests.fixtures.tiny_verifier import VERIFIER_AUX_LAYERS

    return aux_and_prenorm(model, torch.as_tensor(ids), VERIFIER_AUX_LAYERS)


def test_final_norm_reparameterisation_keeps_the_function(lib, ci_verifier: Path) -> None:
    """Undo the factor on a copy: same logits (float tolerance), same greedy tokens; and post-norm targets now differ."""
    import copy

    import torch

    from hs_dataset.interop import derive_post_norm
    from tests.fixtures.tiny_verifier import VERIFIER_AUX_LAYERS, final_norm_factor, reparameterise_final_norm

    verifier = lib.Verifier(ci_verifier, VERIFIER_AUX_LAYERS)
    model = verifier.model
    weight, eps = model.model.norm.weight.detach(), model.config.rms_norm_eps
    assert int((weight < 0).sum()) > 16 and float(weight.abs().max() / weight.abs().min()) > 8, weight  # strongly non-uniform
    trained = copy.deepcopy(model)
    reparameterise_final_norm(trained, 1 / final_norm_factor())  # back to the weights training produced
    trained_weight = trained.model.norm.weight.detach()
    assert float(trained_weight.std() / trained_weight.mean()) < 0.1  # nearly uniform, as trained
    worst, same_targets, total = 0.0, 0, 0
    for text in lib.heldout_prompts(8, seed=98):
        ids = verifier.prompt_ids(text)
        with torch.no_grad():
            a, b = model(torch.tensor([ids])).logits, trained(torch.tensor([ids])).logits
        worst = max(worst, float((a - b).abs().max() / b.abs().max()))
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        reference = trained.generate(
            torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=verifier.stop, pad_token_id=verifier.stop
        )
        assert verifier.greedy(ids, 24) == reference[0, len(ids) :].tolist()
        # what speculators' trainer makes of post-norm data: verifier_lm_head(verifier_norm(post))
        _, pre = _independent(model, ids)
        post = derive_post_norm(pre, weight, eps)

        def rms(x):
            return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

        with torch.no_grad():
            same_targets += int((model.lm_head(rms(post)).argmax(-1) == model.lm_head(rms(pre)).argmax(-1)).sum())
        total += len(ids)
    print(
        f"\nreparameterised vs trained verifier: max relative logit difference {worst:.1e}; post-norm targets equal on {same_targets / total:.2f}"
    )
    assert worst < 1e-5
    assert same_targets / total < 0.5


def test_our_data_beats_zeroed_aux_and_decoding_is_exact(lib, ci_verifier: Path, tmp_path: Path) -> None:
    import json

    import torch

    from hs_dataset.formats.reader import open_dataset
    from tests.fixtures.tiny_verifier import VERIFIER_AUX_LAYERS

    stats = json.loads((ci_verifier / "training.json").read_text())
    print(f"\nverifier: loss {stats['final_train_loss']}, held-out answer accuracy {stats['heldout_answer_next_token_accuracy']}")
    ours = lib.build_ours(ci_verifier, tmp_path / "ours", SAMPLES, seed=7)
    verifier = lib.Verifier(ci_verifier, VERIFIER_AUX_LAYERS)
    stored, worst = open_dataset(ours), 0.0
    weight, _ = stored.final_norm()
    assert torch.equal(weight.float(), verifier.model.model.norm.weight.detach().float())  # the reparameterised weight
    for i in range(0, len(stored), 12):  # stored states vs an independent forward of the verifier
        sample = stored[i]
        aux, pre = _independent(verifier.model, sample["input_ids"])

        def rel(a, b):
            return float((a.double() - b.double()).norm() / b.double().norm())

        worst = max(
            worst, rel(sample["final_hidden_state"], pre), *(rel(sample["aux_hidden_states"][:, k], aux[:, k]) for k in range(aux.shape[1]))
        )
    print(f"stored states vs independent forward: max relative error {worst:.1e}")
    assert worst < 1e-5
    zeroed = lib.write_broken(ours, tmp_path / "zero_aux", "zero_aux")
    prompts = lib.heldout_prompts(8, seed=99)
    scores = {}
    for name, data in (("ours", ours), ("zero_aux", zeroed)):
        checkpoint = lib.train_drafter(ci_verifier, data, tmp_path / f"train-{name}", seed=0, epochs=EPOCHS)
        scores[name] = lib.evaluate(verifier, lib.load_drafter(checkpoint), prompts, K, MAX_NEW)
        depth1 = scores[name].hits[0] / max(1, scores[name].tries[0])
        print(f"{name}: agreement@1 {depth1:.2f}, tau {scores[name].tau:.2f}, greedy-exact {scores[name].exact}")
    assert scores["ours"].exact and scores["zero_aux"].exact, "draft-and-verify output differs from plain greedy"
    assert scores["ours"].tau > scores["zero_aux"].tau
