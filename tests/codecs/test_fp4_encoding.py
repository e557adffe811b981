"""The 4-bit state encodings (``mxfp4_e2m1_g32``, ``nf4_g32``) against their definitions.

The quantizers must pick the defined scale and the nearest code (so their error is the
encoding's, bounded as docs/FORMAT.md states); the writer and reader must round-trip
them bit for bit, take states the server already encoded as they are, and refuse what
they cannot store.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from hs_dataset.codecs.fp4 import (
    E2M1_LEVELS,
    GROUP_SIZE,
    MX_MAX_EXPONENT_BYTE,
    MXFP4_ENCODING,
    NF4_ENCODING,
    NF4_LEVELS,
    dequantize_mxfp4,
    dequantize_nf4,
    quantize_mxfp4,
    quantize_nf4,
)
from hs_dataset.codecs.registry import ENCODINGS, get_encoding, state_encoding_for
from hs_dataset.errors import SampleError, UsageError
from hs_dataset.formats.encoding import bad_scales, decode_state, encode_state
from hs_dataset.formats.reader import open_dataset
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.sample import CapturedSample
from tests.fixtures.samples import make_metadata, make_sample

FOUR_BIT = (MXFP4_ENCODING, NF4_ENCODING)
_SIGNED_E2M1 = torch.tensor(sorted({s * v for v in E2M1_LEVELS for s in (1, -1)}), dtype=torch.float64)


def _states(g: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Normal values with per-row magnitudes over many decades, outlier channels, zeros and extremes."""
    x = torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape[:-1], 1, generator=g) * 6)
    x[..., 3] *= 200.0  # an outlier channel, as in real hidden states
    x = x.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max)  # finite in dtype (the writer refuses NaN/inf first)
    flat = x.view(-1, shape[-1])
    flat[0] = 0.0  # an all-zero row
    flat[1, :GROUP_SIZE] = -0.0
    flat[2, 5] = torch.finfo(dtype).max
    flat[3, 7] = -torch.finfo(dtype).max
    flat[4] = torch.finfo(dtype).tiny / 8  # subnormals
    return x.to(dtype)


def _groups64(x: torch.Tensor) -> torch.Tensor:
    return x.double().reshape(*x.shape[:-1], x.shape[-1] // GROUP_SIZE, GROUP_SIZE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_mxfp4_has_the_smallest_unclipped_power_of_two_scale_and_the_nearest_code(dtype):
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        x = _states(g, (7, 3, 4 * GROUP_SIZE), dtype)
        codes, exponents = quantize_mxfp4(x)
        assert codes.dtype == exponents.dtype == torch.uint8
        assert codes.shape == (7, 3, 2 * GROUP_SIZE) and exponents.shape == (7, 3, 4)
        groups = _groups64(x)
        amax = groups.abs().amax(-1)
        j = exponents.long() - 127
        scale = torch.pow(2.0, j.double())
        # smallest power of two with amax <= 6 * scale (within the stored exponent range)
        clamped = (exponents == 0) | (exponents == MX_MAX_EXPONENT_BYTE)
        assert bool(((amax <= 6 * scale) | clamped).all())
        assert bool(((amax > 3 * scale) | clamped | (amax == 0)).all())
        decoded = _groups64(dequantize_mxfp4(codes, exponents, torch.float32))
        units = decoded / scale.unsqueeze(-1)
        assert bool(torch.isin(units, _SIGNED_E2M1).all()), "decoded values lie on the e2m1 grid of their scale"
        # the defined input of the rounding: x * 2**-j rounded to bfloat16 (exact for bfloat16 states)
        u = (x.float().reshape(groups.shape) * torch.pow(2.0, -j.float()).unsqueeze(-1)).to(torch.bfloat16).double()
        if dtype == torch.bfloat16:  # exact, except where a saturated group's scale pushes small values below bf16's normal range
            assert torch.equal(u[~clamped], (groups / scale.unsqueeze(-1))[~clamped])
        nearest = (u.unsqueeze(-1) - _SIGNED_E2M1).abs().amin(-1)
        assert bool(((units - u).abs() <= nearest).all()), "every value takes its nearest code"
        # the bound docs/FORMAT.md states: half the level gap, <= max(scale, |x|) / 4 (plus bf16 rounding of non-bf16 x)
        slack = 0.0 if dtype == torch.bfloat16 else 2**-8
        assert bool(((decoded - groups).abs() <= 0.25 * torch.maximum(scale.unsqueeze(-1), groups.abs()) + slack * groups.abs()).all())
        assert bool(torch.isfinite(decoded).all())


def _unpacked(codes: torch.Tensor) -> torch.Tensor:
    return torch.stack((codes & 15, codes >> 4), dim=-1).reshape(*codes.shape[:-1], codes.shape[-1] * 2).long()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_nf4_scale_is_the_bf16_absmax_and_codes_are_nearest(dtype):
    g = torch.Generator().manual_seed(4)
    levels = torch.tensor(NF4_LEVELS).to(torch.bfloat16).double()  # the decoded levels: NF4 rounded to bfloat16
    for _ in range(5):
        x = _states(g, (6, 2, 3 * GROUP_SIZE), dtype)
        if dtype == torch.float32:
            x = x.clamp(-1e38, 1e38)  # above bfloat16's largest value the scale saturates (documented)
        codes, scale = quantize_nf4(x)
        assert codes.shape == (6, 2, 3 * GROUP_SIZE // 2) and scale.shape == (6, 2, 3) and scale.dtype == torch.bfloat16
        groups = _groups64(x)
        assert torch.equal(scale, groups.abs().amax(-1).float().to(torch.bfloat16))
        s = scale.float().unsqueeze(-1)
        # the defined input of the rounding: bf16(clamp(x / s, -1, 1)), float32 division, 0 where s is 0
        u = torch.where(s > 0, x.float().reshape(groups.shape) / torch.where(s > 0, s, 1.0), 0.0).clamp(-1, 1).to(torch.bfloat16).double()
        chosen = levels[_unpacked(codes)].reshape(groups.shape)
        assert bool(((chosen - u).abs() <= (u.unsqueeze(-1) - levels).abs().amin(-1)).all()), "every value takes its nearest level"
        decoded = dequantize_nf4(codes, scale, torch.bfloat16).reshape(groups.shape)
        assert torch.equal(decoded, (chosen.float() * s).to(torch.bfloat16)), "decode: bf16(level) * absmax, rounded once"
        # the bound docs/FORMAT.md states: half the widest level gap (-1 to -0.6953) of the absmax, plus bf16 roundings
        assert bool(((decoded.double() - groups).abs() <= (0.1524 + 2**-7) * groups.abs().amax(-1, keepdim=True)).all())
        assert bool(torch.isfinite(decoded).all())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(st.floats(min_value=-(2.0**127), max_value=2.0**127, width=32), min_size=GROUP_SIZE, max_size=GROUP_SIZE * 3),
    name=st.sampled_from(FOUR_BIT),
)
def test_any_finite_group_decodes_finite_and_re_encodes_to_the_same_bytes(values, name):
    """Quantizing the decoded states again changes nothing (the grid is a fixed point), for any finite input."""
    n = len(values) // GROUP_SIZE * GROUP_SIZE
    x = torch.tensor(values[:n], dtype=torch.float32).view(1, n).to(torch.bfloat16)
    encoding = get_encoding(name)
    data, scale = encode_state(x, encoding)
    decoded = decode_state(data, scale, encoding)
    assert decoded.dtype == torch.bfloat16 and decoded.shape == x.shape and bool(torch.isfinite(decoded).all())
    again, again_scale = encode_state(decoded, encoding)
    assert torch.equal(decode_state(again, again_scale, encoding), decoded)


def test_bytes_per_value_and_scale_rules():
    h = 7168
    bf16 = get_encoding("bf16").row_bytes(h)
    assert get_encoding(MXFP4_ENCODING).row_bytes(h) / bf16 == pytest.approx(4.25 / 16)
    assert get_encoding(NF4_ENCODING).row_bytes(h) / bf16 == pytest.approx(4.5 / 16)
    exps = torch.tensor([0, 127, MX_MAX_EXPONENT_BYTE, MX_MAX_EXPONENT_BYTE + 1, 255], dtype=torch.uint8)
    assert bad_scales(exps, ENCODINGS[MXFP4_ENCODING]).tolist() == [False, False, False, True, True]
    absmax = torch.tensor([0.0, 1.0, -1.0, float("nan"), float("inf"), 3e38], dtype=torch.bfloat16)
    assert bad_scales(absmax, ENCODINGS[NF4_ENCODING]).tolist() == [False, False, True, True, True, False]
    assert state_encoding_for(torch.bfloat16, "mxfp4") == MXFP4_ENCODING and state_encoding_for(torch.float32, "nf4_g32") == NF4_ENCODING
    with pytest.raises(ValueError, match="'mxfp4'"):
        state_encoding_for(torch.bfloat16, "fp4")


_SAMPLES = st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=6)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    lengths=_SAMPLES,
    name=st.sampled_from(FOUR_BIT),
    dtype=st.sampled_from(["bfloat16", "float32"]),
    shard_bytes=st.sampled_from([600, 5000]),
)
def test_writer_reader_round_trip_bit_for_bit(tmp_path_factory, lengths, name, dtype, shard_bytes):
    root = tmp_path_factory.mktemp("fp4")
    k, h = 2, 2 * GROUP_SIZE
    samples = [make_sample(f"s{i}", n, k=k, h=h, dtype=getattr(torch, dtype)) for i, n in enumerate(lengths)]
    encoding = get_encoding(name)
    with ShardWriter(root, make_metadata(k=k, h=h, dtype=dtype), storage=name, shard_bytes=shard_bytes) as writer:
        writer.add_many(samples)
    ds = open_dataset(root, verify_hashes=True)
    assert ds.manifest.tensors["aux_hidden_states"]["encoding"] == name
    for item, ref in zip(ds, samples, strict=True):
        assert item["sample_id"] == ref.sample_id and torch.equal(item["input_ids"], ref.input_ids)
        for key, state in (("aux_hidden_states", ref.aux_hidden_states), ("final_hidden_state", ref.final_hidden_state)):
            assert item[key].dtype == torch.bfloat16 and item[key].shape == state.shape
            assert torch.equal(item[key], decode_state(*encode_state(state, encoding), encoding)), key
    assert verify_dataset(root).ok


@pytest.mark.parametrize("name, quantize", [(MXFP4_ENCODING, quantize_mxfp4), (NF4_ENCODING, quantize_nf4)])
def test_states_the_server_encoded_are_stored_as_they_are(tmp_path, name, quantize):
    """What the server's GPU quantizer sends (codes + scales) is checked and stored byte for byte."""
    k, h = 3, GROUP_SIZE * 2
    plain = make_sample("s0", 9, k=k, h=h)
    aux, aux_scale = quantize(plain.aux_hidden_states)
    final, final_scale = quantize(plain.final_hidden_state)
    sent = CapturedSample("s0", plain.input_ids, plain.loss_mask, aux, final, aux_scale=aux_scale, final_scale=final_scale)
    with ShardWriter(tmp_path / "a", make_metadata(k=k, h=h), storage=name) as writer:
        writer.add(sent)
    with ShardWriter(tmp_path / "b", make_metadata(k=k, h=h), storage=name) as writer:
        writer.add(plain)
    a, b = open_dataset(tmp_path / "a"), open_dataset(tmp_path / "b")
    for key in ("aux_hidden_states", "final_hidden_state"):
        assert torch.equal(a[0][key], b[0][key])
    bad = CapturedSample("s1", plain.input_ids, plain.loss_mask, aux, final, aux_scale=aux_scale[..., :1], final_scale=final_scale)
    with ShardWriter(tmp_path / "c", make_metadata(k=k, h=h), storage=name) as writer, pytest.raises(SampleError, match="scales of shape"):
        writer.add(bad)


@pytest.mark.parametrize("name, quantize", [(MXFP4_ENCODING, quantize_mxfp4), (NF4_ENCODING, quantize_nf4)])
@pytest.mark.parametrize("poison", [float("inf"), float("-inf"), float("nan")])
def test_a_group_holding_inf_or_nan_is_refused_not_stored_clipped(tmp_path, name, quantize, poison):
    """The server quantizes before anyone can scan its states: a non-finite value must give an invalid scale.

    Before, nf4 clamped an inf group's scale to bfloat16's largest value and mxfp4 coded
    inf as 6 * 2**j, so the writer stored finite-looking states that were not the capture.
    """
    k, h = 2, GROUP_SIZE * 2
    plain = make_sample("s0", 5, k=k, h=h, dtype=torch.bfloat16)
    aux = plain.aux_hidden_states.clone()
    aux[3, 1, 40] = poison  # one value: token 3, layer 1, the second group
    codes, scales = quantize(aux)
    bad = bad_scales(scales, get_encoding(name))
    assert bad[3, 1, 1] and int(bad.sum()) == 1
    final, final_scale = quantize(plain.final_hidden_state)
    sent = CapturedSample("s0", plain.input_ids, plain.loss_mask, codes, final, aux_scale=scales, final_scale=final_scale)
    # refused under the refuse policy; the default quarantines it (tests/formats/test_nonfinite_server_states.py)
    with (
        ShardWriter(tmp_path, make_metadata(k=k, h=h), storage=name, nonfinite="refuse") as writer,
        pytest.raises(SampleError, match="scale"),
    ):
        writer.add(sent)


def test_hidden_size_not_a_multiple_of_the_group_is_refused(tmp_path):
    with pytest.raises(UsageError, match="multiple of 32"):
        ShardWriter(tmp_path, make_metadata(h=48), storage="mxfp4")


@pytest.mark.parametrize("name, quantize", [(MXFP4_ENCODING, quantize_mxfp4), (NF4_ENCODING, quantize_nf4)])
def test_client_hands_4bit_dumps_on_encoded_and_refuses_wrong_scales(tmp_path, name, quantize):
    """A dump the server quantized to 4 bits (codes [T, K, H/2], scales [T, K, H/32]) reaches the writer as sent."""
    import json

    from safetensors.torch import save_file

    from hs_dataset.capture.sglang.dumps import ExpectedDump, check_dump
    from hs_dataset.codecs.fp8 import STATE_ENCODING_KEY
    from hs_dataset.sample import TokenizedSample
    from hs_dataset.server_patch.contract.dump import DUMP_FORMAT, DUMP_VERSION

    k, h, ids = 2, 2 * GROUP_SIZE, torch.arange(10, 15)
    plain = make_sample("s0", 5, k=k, h=h)
    (aux, aux_scale), (final, final_scale) = quantize(plain.aux_hidden_states), quantize(plain.final_hidden_state)
    meta = {
        "format": DUMP_FORMAT,
        "version": DUMP_VERSION,
        "rid": "hs-r1",
        "final_state": "pre_norm",
        "hf_aux_layer_ids": json.dumps([2, 3]),
        "dtype": "bfloat16",
        STATE_ENCODING_KEY: name,
    }
    tensors = {
        "input_ids": ids,
        "aux_hidden_states": aux,
        "final_hidden_state": final,
        "aux_hidden_states.scale": aux_scale,
        "final_hidden_state.scale": final_scale,
    }
    sample = TokenizedSample("s0", ids, torch.ones(5, dtype=torch.bool))
    expected = ExpectedDump(aux_layer_ids=(2, 3), dtype=torch.bfloat16, hidden_size=h)
    save_file(tensors, str(tmp_path / "d.safetensors"), metadata=meta)
    got = check_dump(str(tmp_path / "d.safetensors"), "hs-r1", sample, expected)
    assert isinstance(got, CapturedSample), got
    assert torch.equal(got.aux_hidden_states, aux) and torch.equal(got.aux_scale, aux_scale) and torch.equal(got.final_scale, final_scale)
    with ShardWriter(tmp_path / "ds", make_metadata(k=k, h=h), storage=name) as writer:
        writer.add(got)
    stored = open_dataset(tmp_path / "ds")[0]
    encoding = get_encoding(name)
    assert torch.equal(stored["aux_hidden_states"], decode_state(aux, aux_scale, encoding))
    save_file({**tensors, "final_hidden_state.scale": final_scale[:, :1].contiguous()}, str(tmp_path / "bad.safetensors"), metadata=meta)
    assert "scales" in check_dump(str(tmp_path / "bad.safetensors"), "hs-r1", sample, expected).reason


@pytest.mark.parametrize("storage", ["native", "fp8", MXFP4_ENCODING, NF4_ENCODING])
def test_the_probe_reads_the_models_hidden_size_from_any_dump_encoding(storage):
    """A 4-bit dump is [T, H/2] bytes: the probe must still see H (it called the first real nf4 server the wrong model)."""
    from hs_dataset.capture.sglang.validate import check_probe
    from hs_dataset.codecs.fp8 import quantize_fp8_per_token
    from hs_dataset.errors import ServerValidationError

    k, h = 2, 4 * GROUP_SIZE
    plain = make_sample("__hs_probe__", 7, k=k, h=h, dtype=torch.bfloat16)
    quantize = {"fp8": quantize_fp8_per_token, MXFP4_ENCODING: quantize_mxfp4, NF4_ENCODING: quantize_nf4}.get(storage)
    if quantize is None:
        result = plain
    else:
        (aux, aux_scale), (final, final_scale) = quantize(plain.aux_hidden_states), quantize(plain.final_hidden_state)
        result = CapturedSample(plain.sample_id, plain.input_ids, plain.loss_mask, aux, final, aux_scale=aux_scale, final_scale=final_scale)
    assert check_probe("http://server", result, h, torch.bfloat16) == (h, torch.bfloat16)
    with pytest.raises(ServerValidationError, match=f"hidden size {h}, the local model has {2 * h}"):
        check_probe("http://server", result, 2 * h, torch.bfloat16)
