"""The in-process backend stores exactly transformers' hidden_states[i] and the pre-norm final state."""

from __future__ import annotations

import pytest
import torch

from hs_dataset.capture.base import CaptureTarget
from hs_dataset.capture.hf import HFBackend
from hs_dataset.config import HFBackendSection
from hs_dataset.sample import TokenizedSample

ON_CPU = HFBackendSection(name="hf", device="cpu")

# float32 on CPU; batched (padded) vs single forwards differ only by summation order.
REL_TOL = 1e-6


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _samples(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        TokenizedSample(f"s{i}", torch.randint(0, 129_000, (n,), generator=g), torch.ones(n, dtype=torch.bool))
        for i, n in enumerate(lengths)
    ]


@torch.inference_mode()
def _independent(model, ids: torch.Tensor):
    """transformers' own output_hidden_states, one sample, no padding, plus norm input via a pre-hook."""
    seen = {}
    handle = model.model.norm.register_forward_pre_hook(lambda _m, args: seen.__setitem__("pre", args[0]))
    try:
        out = model.model(ids[None], output_hidden_states=True)
    finally:
        handle.remove()
    return out.hidden_states, seen["pre"][0]


def test_batched_mixed_lengths_match_an_independent_forward(hf_backend, record_property):
    samples = _samples([5, 37, 128, 300, 1, 64])
    results = hf_backend.capture_batch(samples)
    worst = 0.0
    for sample, result in zip(samples, results):
        hidden, pre_norm = _independent(hf_backend.model, sample.input_ids)
        assert torch.equal(result.input_ids, sample.input_ids)
        assert result.aux_hidden_states.shape == (sample.num_tokens, 3, 64)
        for k, layer in enumerate([2, 3, 4]):
            worst = max(worst, _rel(result.aux_hidden_states[:, k], hidden[layer][0]))
        worst = max(worst, _rel(result.final_hidden_state, pre_norm))
    record_property("max_relative_error", worst)
    print(f"max relative error vs independent forward: {worst:.2e}")
    assert worst <= REL_TOL


def test_final_state_is_pre_norm_and_post_norm_is_derivable(hf_backend):
    """post = rmsnorm(pre) with the recorded weight and eps reproduces HF's hidden_states[-1]."""
    info = hf_backend.info()
    assert info.final_state == "pre_norm" and info.final_norm_eps == pytest.approx(1e-6)
    sample = _samples([50], seed=3)[0]
    result = hf_backend.capture_batch([sample])[0]
    hidden, _ = _independent(hf_backend.model, sample.input_ids)
    pre = result.final_hidden_state.float()
    derived = pre * torch.rsqrt(pre.pow(2).mean(-1, keepdim=True) + info.final_norm_eps) * info.final_norm_weight
    assert _rel(derived, hidden[-1][0]) <= REL_TOL
    assert _rel(pre, hidden[-1][0]) > 1e-2  # really pre-norm, not the normed state


def test_padding_never_leaks(hf_backend):
    short = _samples([7], seed=5)[0]
    alone = hf_backend.capture_batch([short])[0]
    long_neighbours = _samples([400, 250], seed=6)
    together = hf_backend.capture_batch([long_neighbours[0], short, long_neighbours[1]])[1]
    assert together.aux_hidden_states.shape == alone.aux_hidden_states.shape
    assert _rel(together.aux_hidden_states, alone.aux_hidden_states) <= REL_TOL
    assert _rel(together.final_hidden_state, alone.final_hidden_state) <= REL_TOL


def test_aux_layer_zero_is_the_embedding_output(tiny_model_dir):
    backend = HFBackend(ON_CPU, CaptureTarget(tiny_model_dir, (0, 5), dtype="float32"))
    sample = _samples([9], seed=8)[0]
    result = backend.capture_batch([sample])[0]
    hidden, _ = _independent(backend.model, sample.input_ids)
    assert torch.equal(result.aux_hidden_states[:, 0], hidden[0][0])
    assert _rel(result.aux_hidden_states[:, 1], hidden[5][0]) <= REL_TOL


def test_no_aux_layer_captures_the_final_state_alone(tiny_model_dir, hf_backend):
    """``aux: []`` (an MTP dataset): K = 0 aux states, the same pre-norm final state as with aux layers."""
    backend = HFBackend(ON_CPU, CaptureTarget(tiny_model_dir, (), dtype="float32"))
    samples = _samples([7, 30], seed=9)
    for alone, with_aux in zip(backend.capture_batch(samples), hf_backend.capture_batch(samples)):
        assert alone.aux_hidden_states.shape == (alone.num_tokens, 0, 64)
        assert _rel(alone.final_hidden_state, with_aux.final_hidden_state) <= REL_TOL
    assert backend.info().aux_layer_ids == []


def test_out_of_range_layers_and_tokens_are_refused(tiny_model_dir, hf_backend):
    with pytest.raises(ValueError, match="outside 0..5"):
        HFBackend(ON_CPU, CaptureTarget(tiny_model_dir, (2, 6), dtype="float32"))
    bad = TokenizedSample("too-big", torch.tensor([1, 2, 999_999]), torch.ones(3, dtype=torch.bool))
    good = _samples([4])[0]
    results = hf_backend.capture_batch([bad, good])
    assert results[0].sample_id == "too-big" and "vocabulary" in results[0].reason
    assert results[1].aux_hidden_states.shape == (4, 3, 64)


def test_cuda_request_degrades_with_a_clear_error_on_cpu(tiny_model_dir):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        HFBackend(HFBackendSection(name="hf", device="cuda"), CaptureTarget(tiny_model_dir, (2,)))
