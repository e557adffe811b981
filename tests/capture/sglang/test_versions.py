"""The version matrix, run: real CPU SGLang servers of each mechanism, their states against transformers.

Each release is served by ``hs-dataset serve``'s own plan (what to pass is read from the
installed SGLang, not from its version number) on the tiny DeepseekV3 in float32, and a
build's states are compared with an independent transformers forward: SGLang 0.5.23
through ``aux_return`` (tests/capture/sglang/test_server.py), 0.5.19 and 0.5.14 through
``layer_hooks`` here (overlays of the CPU server env: ``make sglang-overlays``). Each server
also proves the fail-fast rule: a client whose request ids the hooks do not own stops in
seconds with the cause, instead of waiting out ``dump_timeout_s`` times its retries.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from hs_dataset.capture.base import CapturedSample, CaptureFailure
from hs_dataset.errors import ServerValidationError
from tests.fixtures.sglang_client import backend, make_samples, post
from tests.fixtures.sglang_server import hf_reference, rel, start_server

pytestmark = pytest.mark.sglang

LAYER_HOOK_RELEASES = ["0.5.14", "0.5.19"]


PREFIX = "hs-v"  # the hooks of these servers own only request ids hs-v...; this module's clients use run ids v...


@pytest.fixture(scope="module", params=LAYER_HOOK_RELEASES)
def release_server(request, card, tiny_model, hs_tmp):
    version = request.param
    server = start_server(
        card,
        hs_tmp,
        f"v{version}",
        version=version,
        chunked_prefill_size=64,
        staging={"rid_prefix": PREFIX},
        extra_args=["--enable-mixed-chunk"],
    )
    yield version, server
    server.stop(timeout=5)


def _client(card, server, run_id: str, **section):
    be = backend(card, server, **section)
    be.run_id = run_id
    return be


def test_layer_hooks_releases_capture_what_transformers_computes(card, release_server, hf_model):
    version, server = release_server
    assert server.plan.sglang_version == version and server.plan.mechanism == "layer_hooks"
    samples = make_samples(12, [5, 37, 64, 65, 130, 300, 1, 90], seed=3)
    be = _client(card, server, "v1", concurrency=6)
    try:
        results = {r.sample_id: r for r in be.capture_stream(samples, batch_size=6)}
        uses_rids = be.endpoints[0].uses_rids
    finally:
        be.close()
    assert not [r for r in results.values() if isinstance(r, CaptureFailure)], results
    assert uses_rids, f"SGLang {version}'s ForwardBatch carries rids: the client must key dumps by them"
    worst = {"aux": 0.0, "final": 0.0}
    for s in samples:
        r = results[s.sample_id]
        assert isinstance(r, CapturedSample) and torch.equal(r.input_ids, s.input_ids)
        ref_aux, ref_final = hf_reference(hf_model, s.input_ids)
        worst["aux"] = max(worst["aux"], max(rel(r.aux_hidden_states[:, k], ref_aux[:, k]) for k in range(3)))
        worst["final"] = max(worst["final"], rel(r.final_hidden_state, ref_final))
    print(f"SGLang {version} layer_hooks vs transformers: worst aux {worst['aux']:.2e}, final {worst['final']:.2e}")
    assert worst["aux"] < 1e-6 and worst["final"] < 1e-6, worst


def _counts(server) -> dict:
    from hs_dataset.server_patch.contract.status import read_statuses

    return read_statuses(server.staging_dir)[0]["counts"]


def _decode_elsewhere(server, rid: str, tokens: int) -> threading.Thread:
    """Another client's request that decodes ``tokens`` tokens: the running batch mixed passes carry as tails."""
    body = {"rid": rid, "input_ids": list(range(10, 30)), "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
    thread = threading.Thread(target=post, args=(server.url, body, 300), daemon=True)
    thread.start()
    return thread


def test_capture_during_decoding_in_mixed_passes_matches_transformers(card, release_server, hf_model):
    """Prompts prefilled in mixed passes beside decoding requests: every dump whole and exact, no false refusal.

    The passes hold our prompt rows and the decodes' 1-row tails (and, with the overlap
    scheduler, tails of our own requests already stored, which must be skipped, not refused).
    """
    version, server = release_server
    before = _counts(server)
    decoders = [_decode_elsewhere(server, f"other-{version}-{i}", 200) for i in range(4)]
    time.sleep(1.0)
    samples = make_samples(8, [37, 130, 300, 65], seed=5)
    be = _client(card, server, "v2", concurrency=4)
    try:
        results = {r.sample_id: r for r in be.capture_stream(samples, batch_size=4)}
    finally:
        be.close()
    for thread in decoders:
        thread.join(timeout=300)
    assert not [r for r in results.values() if isinstance(r, CaptureFailure)], results
    for s in samples:
        r = results[s.sample_id]
        ref_aux, ref_final = hf_reference(hf_model, s.input_ids)
        assert torch.equal(r.input_ids, s.input_ids)
        assert rel(r.aux_hidden_states, ref_aux) < 1e-6 and rel(r.final_hidden_state, ref_final) < 1e-6
    deadline = time.monotonic() + 10  # the status file is rewritten on a timer
    while (after := _counts(server))["dumps_written"] < before["dumps_written"] + len(samples) and time.monotonic() < deadline:
        time.sleep(0.5)
    tails = after["foreign_skipped"] - before["foreign_skipped"] - len(decoders)  # beyond the decoders' own prefills
    print(f"SGLang {version} mixed passes: {tails} foreign decode tails, {after['decode_tails'] - before['decode_tails']} of ours skipped")
    assert tails > 0, "no prefill pass carried a decoding request: the test proved nothing about mixed passes"
    assert after["refused"] == before["refused"], after


def test_a_client_outside_the_hooks_prefix_is_refused_before_any_request(card, release_server):
    _version, server = release_server
    be = _client(card, server, "abc123")
    t0 = time.monotonic()
    try:
        with pytest.raises(ServerValidationError) as info:
            be.validate()
    finally:
        be.close()
    assert time.monotonic() - t0 < 30 and PREFIX in str(info.value) and be.stats["requests"] == 0, str(info.value)


def test_requests_the_hooks_skip_as_foreign_stop_the_build_in_seconds(card, release_server, monkeypatch):
    """With the up-front check out of the way, the hooks' own report names the cause after the first request."""
    from hs_dataset.capture.sglang import validate

    _version, server = release_server
    monkeypatch.setattr(validate, "check_rid_prefix", lambda *args, **kwargs: None)
    be = _client(card, server, "abc123", dump_timeout_s=120, retries=2)
    t0 = time.monotonic()
    try:
        with pytest.raises(ServerValidationError) as info:
            be.validate()
    finally:
        be.close()
    took = time.monotonic() - t0
    print(f"stopped after {took:.1f} s: {info.value}")
    assert took < 30 and "foreign" in str(info.value) and PREFIX in str(info.value), str(info.value)
