"""A float32 model's states encoded by the real CPU SGLang server itself (``shards.storage: nf4``).

The server's hooks quantize on the device and the client stores the codes as they are,
so the probe cannot read the model's dtype off the states: it is the one the dump's
metadata names. Before this was handled, a float32 card with server-side nf4 was refused
at the probe as a "bf16" server. Here the codes must decode to what encoding an
independent transformers forward gives, and a card of another dtype is still refused.
"""

from __future__ import annotations

import pytest

from hs_dataset.capture.base import CapturedSample
from hs_dataset.codecs.fp4 import NF4_ENCODING
from hs_dataset.codecs.registry import get_encoding
from hs_dataset.errors import ServerValidationError
from hs_dataset.formats.encoding import decode_state
from tests.fixtures.sglang_client import backend, make_samples
from tests.fixtures.sglang_server import hf_reference, rel, require_sglang_env, start_server

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def nf4_card(card):
    return card.with_overrides(shards={"storage": "nf4"})


@pytest.fixture(scope="module")
def nf4_server(nf4_card, tiny_model, hs_tmp):
    require_sglang_env()
    server = start_server(nf4_card, hs_tmp, "nf4", chunked_prefill_size=64)
    yield server
    server.stop(timeout=5)


def _capture(card, server, samples):
    be = backend(card, server)
    try:
        be.validate()
        return be.capture_batch(samples)
    finally:
        be.close()


def test_server_encoded_states_of_a_float32_model_decode_to_the_encoded_reference(nf4_card, nf4_server, hf_model):
    assert nf4_card.dtype == "float32"
    encoding = get_encoding(NF4_ENCODING)
    samples = make_samples(6, [5, 37, 65, 130, 300, 1], seed=11)
    for sample, result in zip(samples, _capture(nf4_card, nf4_server, samples)):
        assert isinstance(result, CapturedSample), result
        assert result.aux_scale is not None and result.aux_hidden_states.dtype == encoding.storage_torch_dtype
        ref_aux, ref_final = hf_reference(hf_model, sample.input_ids)
        for got, scale, ref in (
            (result.aux_hidden_states, result.aux_scale, ref_aux),
            (result.final_hidden_state, result.final_scale, ref_final),
        ):
            server = decode_state(got, scale, encoding).float()
            local = decode_state(*encoding.quantize(ref), encoding).float()
            own_error = rel(local, ref)  # what nf4 costs these states, encoded here
            assert rel(server, ref) <= own_error * 1.02 + 1e-6, (sample.sample_id, rel(server, ref), own_error)
            assert rel(server, local) < 0.2 * own_error, (sample.sample_id, rel(server, local), own_error)


def test_a_card_of_another_dtype_is_still_refused_at_the_probe(nf4_card, nf4_server):
    with pytest.raises(ServerValidationError, match="float32") as info:
        _capture(nf4_card.with_overrides(dtype="bfloat16"), nf4_server, make_samples(1, [5], seed=12))
    print(info.value)
