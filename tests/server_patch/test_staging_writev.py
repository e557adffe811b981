"""Dumps written with os.writev straight from host memory are the safetensors files they were.

The capture core used to build each dump with ``safetensors.torch.save`` (one bytes
object of the whole file) and write that; it now writes a header from
``safetensors_header.dump_header`` and then the tensors' own memory. These tests pin that the
result is the same file: the header is what safetensors writes, byte for byte, and a
dump's tensor bytes, layout and metadata equal ``save``'s for bf16, f32 and fp8 states
(whole and chunked prefills). They also cover the fp8 path end to end on the CPU:
the device quantizer is the dataset's own, and the client's dump check hands the
encoded states on unchanged.
"""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from safetensors.torch import load, save

from hs_dataset.codecs import fp8, safetensors_header
from hs_dataset.codecs.registry import ENCODINGS
from hs_dataset.formats.encoding import decode_state, encode_state
from hs_dataset.server_patch import staging as staging_mod
from hs_dataset.server_patch.batch import BatchView
from hs_dataset.server_patch.config import CaptureConfig
from hs_dataset.server_patch.copier import host_bytes
from hs_dataset.server_patch.core import CaptureCore
from hs_dataset.server_patch.staging import StagingDir

IDS = [2, 3, 4]
K, H = len(IDS), 16


def _core(tmp_path, **overrides) -> CaptureCore:
    cfg = CaptureConfig.from_sources(
        {"staging_dir": str(tmp_path / "stage"), "hf_aux_layer_ids": IDS, "max_wait_s": 1.0, "sweep_interval_s": 3600, **overrides},
        environ={},
    )
    return CaptureCore(cfg, sglang_version="test")


def _extend(core: CaptureCore, lens, rids, prefix, aux, final, ids) -> None:
    batch = BatchView(mode="EXTEND", extend_seq_lens=list(lens), extend_prefix_lens=list(prefix), rids=list(rids), input_ids=ids)
    core.process(batch, aux=aux, final_prenorm=final)
    assert core.flush(10)


def _split(data: bytes) -> tuple[dict, bytes]:
    """(header JSON in file order, data section) of a safetensors file."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _same_file(ours: bytes, reference: bytes) -> None:
    """Equal bytes up to the order of the metadata keys (safetensors writes them from a Rust HashMap: random order)."""
    assert len(ours) == len(reference)
    ours_header, ours_data = _split(ours)
    ref_header, ref_data = _split(reference)
    assert ours_data == ref_data
    assert ours_header.pop("__metadata__") == ref_header.pop("__metadata__")
    assert list(ours_header.items()) == list(ref_header.items())  # tensor order, dtypes, shapes, offsets
    # and with safetensors' metadata order, our header builder gives its exact bytes
    specs = [(name, e["dtype"], e["shape"], e["data_offsets"][1] - e["data_offsets"][0]) for name, e in ref_header.items()]
    prefix, _ = safetensors_header.dump_header(specs, _split(reference)[0]["__metadata__"])
    assert prefix == reference[: len(prefix)]


@pytest.mark.parametrize(
    "tensors",
    [
        {
            "input_ids": torch.arange(5),
            "aux_hidden_states": torch.randn(5, K, H).bfloat16(),
            "final_hidden_state": torch.randn(5, H).bfloat16(),
        },
        {"input_ids": torch.arange(7), "aux_hidden_states": torch.randn(7, K, H), "final_hidden_state": torch.randn(7, H)},
        {
            "input_ids": torch.arange(3),
            "aux_hidden_states": torch.randn(3, K, H).to(torch.float8_e4m3fn),
            "aux_hidden_states.scale": torch.rand(3, K),
            "final_hidden_state": torch.randn(3, H).to(torch.float8_e4m3fn),
            "final_hidden_state.scale": torch.rand(3),
            "zz_f16": torch.randn(2, 3).half(),
        },
    ],
    ids=["bf16", "f32", "fp8"],
)
def test_dump_header_is_safetensors_own_header(tensors):
    metadata = {"rid": "hs-r1-1-5", "hf_aux_layer_ids": "[2, 3, 4]", "dtype": "bfloat16 ünïcode"}
    reference = save(tensors, metadata={"only": "one key, so safetensors' order is fixed"})
    specs = [(n, _code(t), tuple(t.shape), t.numel() * t.element_size()) for n, t in tensors.items()]
    prefix, order = safetensors_header.dump_header(specs, {"only": "one key, so safetensors' order is fixed"})
    body = prefix + b"".join(bytes(host_bytes(tensors[n].contiguous())) for n in order)
    assert body == reference
    # several metadata keys: equal up to safetensors' random metadata order
    reference = save(tensors, metadata=metadata)
    prefix, order = safetensors_header.dump_header(specs, metadata)
    _same_file(prefix + b"".join(bytes(host_bytes(tensors[n].contiguous())) for n in order), reference)


def _code(t: torch.Tensor) -> str:
    return {torch.int64: "I64", torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float8_e4m3fn: "F8_E4M3"}[t.dtype]


def _previous_serialization(meta: dict, tensors: dict[str, torch.Tensor]) -> bytes:
    """What the core wrote before: ``safetensors.torch.save`` of the same tensors and metadata."""
    return save({k: v.contiguous() for k, v in tensors.items()}, metadata=meta)


@pytest.mark.parametrize(
    "dtype, storage", [(torch.bfloat16, "native"), (torch.float32, "native"), (torch.bfloat16, "fp8")], ids=["bf16", "f32", "fp8"]
)
@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
def test_writev_dump_is_byte_identical_to_the_previous_serialization(tmp_path, dtype, storage, chunked):
    core = _core(tmp_path, storage=storage)
    g = torch.Generator().manual_seed(1)
    lens = [6, 9]
    total = sum(lens)
    aux = torch.randn(total, K * H, generator=g).to(dtype) * 3
    final = torch.randn(total, H, generator=g).to(dtype)
    aux[2].zero_()  # an all-zero token: scale 1, data 0
    ids = torch.arange(1000, 1000 + total, dtype=torch.int64)
    rids = ["hs-r1-1-6", "hs-r1-2-9"]
    try:
        if chunked:  # the second request arrives in two chunks: two pinned pieces behind one header
            _extend(core, [6, 4], rids, [0, 0], aux[:10], final[:10], ids[:10])
            _extend(core, [5], rids[1:], [4], aux[10:], final[10:], ids[10:])
        else:
            _extend(core, lens, rids, [0, 0], aux, final, ids)
        assert core.stats["dumps_written"] == 2 and core.stats["refused"] == 0
        for rid, rows in zip(rids, (slice(0, 6), slice(6, 15))):
            ours = (tmp_path / "stage" / f"{rid}.safetensors").read_bytes()
            meta = _split(ours)[0]["__metadata__"]
            assert meta["dtype"] == str(dtype).replace("torch.", "") and meta["rid"] == rid
            state_aux, state_final = aux[rows].view(-1, K, H), final[rows]
            if storage == "fp8":
                assert meta[fp8.STATE_ENCODING_KEY] == fp8.FP8_ENCODING
                enc = ENCODINGS[fp8.FP8_ENCODING]
                aux_q, aux_s = encode_state(state_aux, enc)  # the dataset's encoder on the host
                final_q, final_s = encode_state(state_final, enc)
                expected = {
                    "input_ids": ids[rows],
                    "aux_hidden_states": aux_q,
                    "aux_hidden_states.scale": aux_s,
                    "final_hidden_state": final_q,
                    "final_hidden_state.scale": final_s,
                }
            else:
                assert fp8.STATE_ENCODING_KEY not in meta
                expected = {"input_ids": ids[rows], "aux_hidden_states": state_aux, "final_hidden_state": state_final}
            _same_file(ours, _previous_serialization(meta, expected))
            assert os.path.getsize(tmp_path / "stage" / f"{rid}.safetensors") == len(ours)
        assert core.stats["dump_bytes"] == sum(os.path.getsize(tmp_path / "stage" / f"{r}.safetensors") for r in rids)
    finally:
        core.close()


def test_fp8_dump_is_half_the_bytes_and_decodes_within_fp8_error(tmp_path):
    core_bf16, core_fp8 = _core(tmp_path / "a"), _core(tmp_path / "b", storage="fp8")
    g = torch.Generator().manual_seed(2)
    aux = torch.randn(64, K * 256, generator=g).bfloat16()
    final = torch.randn(64, 256, generator=g).bfloat16()
    ids = torch.arange(64)
    try:
        for core in (core_bf16, core_fp8):
            _extend(core, [64], ["hs-r1-1-64"], [0], aux, final, ids)
        a = (tmp_path / "a" / "stage" / "hs-r1-1-64.safetensors").stat().st_size
        b = (tmp_path / "b" / "stage" / "hs-r1-1-64.safetensors").stat().st_size
        assert b < 0.53 * a
        t = load((tmp_path / "b" / "stage" / "hs-r1-1-64.safetensors").read_bytes())
        enc = ENCODINGS[fp8.FP8_ENCODING]
        back = decode_state(t["aux_hidden_states"], t["aux_hidden_states.scale"], enc).float()
        ref = aux.view(64, K, 256).float()
        err = (back - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)
        assert float(err.max()) < 0.05
    finally:
        core_bf16.close()
        core_fp8.close()


def test_client_hands_fp8_dumps_on_encoded(tmp_path):
    from hs_dataset.capture.sglang.dumps import ExpectedDump, check_dump
    from hs_dataset.sample import CapturedSample, TokenizedSample

    core = _core(tmp_path, storage="fp8")
    aux = torch.randn(5, K * H).bfloat16()
    final = torch.randn(5, H).bfloat16()
    ids = torch.arange(10, 15)
    try:
        _extend(core, [5], ["hs-r1-1-5"], [0], aux, final, ids)
    finally:
        core.close()
    expected = ExpectedDump(aux_layer_ids=tuple(IDS), dtype=torch.bfloat16)
    sample = TokenizedSample("s0", ids, torch.ones(5, dtype=torch.bool))
    path = str(tmp_path / "stage" / "hs-r1-1-5.safetensors")
    got = check_dump(path, "hs-r1-1-5", sample, expected)
    assert isinstance(got, CapturedSample), got
    assert got.aux_hidden_states.dtype == torch.float8_e4m3fn and got.aux_scale.shape == (5, K) and got.final_scale.shape == (5,)
    q, s = encode_state(aux.view(5, K, H), ENCODINGS[fp8.FP8_ENCODING])
    assert torch.equal(got.aux_hidden_states.view(torch.uint8), q.view(torch.uint8)) and torch.equal(got.aux_scale, s)
    expected = ExpectedDump(aux_layer_ids=tuple(IDS), dtype=torch.float16)  # a dump of another model dtype is refused, not reinterpreted
    assert "this config wants torch.float16" in check_dump(path, "hs-r1-1-5", sample, expected).reason


@pytest.mark.parametrize("storage", ["native", "fp8"])
def test_the_client_checks_states_on_its_loader_thread_so_the_writer_does_not_scan_again(tmp_path, monkeypatch, storage):
    from hs_dataset.capture.sglang.dumps import ExpectedDump, check_dump
    from hs_dataset.formats import ShardWriter, encoding
    from hs_dataset.sample import TokenizedSample

    core = _core(tmp_path, storage=storage)
    try:
        _extend(core, [5], ["hs-r1-1-5"], [0], torch.randn(5, K * H).bfloat16(), torch.randn(5, H).bfloat16(), torch.arange(10, 15))
    finally:
        core.close()
    expected = ExpectedDump(aux_layer_ids=tuple(IDS), dtype=torch.bfloat16)
    path = str(tmp_path / "stage" / "hs-r1-1-5.safetensors")
    got = check_dump(path, "hs-r1-1-5", TokenizedSample("s0", torch.arange(10, 15), torch.ones(5, dtype=torch.bool)), expected)
    scans = []
    monkeypatch.setattr(encoding, "_scan_finite", lambda state: scans.append(state) or True)
    with ShardWriter(tmp_path / "ds", {"aux_layer_ids": IDS, "hidden_size": H, "dtype": "bfloat16"}, storage=storage) as writer:
        assert writer.add(got)
    assert scans == []  # both states were checked where they were read


def test_partial_writev_is_resumed_where_it_stopped(tmp_path, monkeypatch):
    real = os.writev
    calls = []

    def short_writev(fd, buffers):  # at most 7 bytes per call, like a signal-interrupted or capped write
        calls.append(len(buffers))
        first = bytes(memoryview(buffers[0]).cast("B"))[:7]
        return real(fd, [first])

    monkeypatch.setattr(os, "writev", short_writev)
    stage = StagingDir(str(tmp_path / "stage"))
    parts = [b"header--", bytearray(b"0123456789" * 3), memoryview(b""), memoryview(b"tail")]
    assert stage.write_atomic("x.safetensors", parts)
    assert (tmp_path / "stage" / "x.safetensors").read_bytes() == b"".join(bytes(p) for p in parts)
    assert len(calls) > 5


def test_many_buffers_are_written_in_iov_sized_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(staging_mod, "_IOV_MAX", 3)
    stage = StagingDir(str(tmp_path / "stage"))
    parts = [bytes([i]) * (i + 1) for i in range(20)]
    assert stage.write_atomic("y.safetensors", parts)
    assert (tmp_path / "stage" / "y.safetensors").read_bytes() == b"".join(parts)


def test_host_bytes_keeps_its_tensor_alive():
    view = host_bytes(torch.arange(4, dtype=torch.int64) + 7)  # the tensor has no other reference
    assert bytes(view) == struct.pack("<4q", 7, 8, 9, 10)
    with pytest.raises(ValueError):
        host_bytes(torch.arange(6).view(2, 3).t())


def test_storage_config_is_checked():
    with pytest.raises(ValueError, match="storage"):
        CaptureConfig(staging_dir="/tmp/x", hf_aux_layer_ids=(1,), storage="int4")
    assert (
        CaptureConfig.from_sources({"staging_dir": "/tmp/x", "hf_aux_layer_ids": [1]}, environ={"HS_CAPTURE_STORAGE": "fp8"}).state_encoding
        == "fp8_e4m3_per_token"
    )


@pytest.mark.parametrize("storage, encoding", [("mxfp4", "mxfp4_e2m1_g32"), ("nf4", "nf4_g32")])
@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
def test_4bit_dumps_hold_the_datasets_own_encoding_and_the_client_stores_them_as_they_are(tmp_path, storage, encoding, chunked):
    """The server quantizes 4-bit storages itself (a quarter of the copy); the bytes are the host encoder's."""
    from hs_dataset.capture.sglang.dumps import ExpectedDump, check_dump
    from hs_dataset.formats import ShardWriter, open_dataset
    from hs_dataset.sample import CapturedSample, TokenizedSample

    h = 64  # 4-bit groups are 32 values
    core = _core(tmp_path, storage=storage)
    g = torch.Generator().manual_seed(4)
    aux = (torch.randn(11, K * h, generator=g) * 4).bfloat16()
    final = torch.randn(11, h, generator=g).bfloat16()
    ids = torch.arange(100, 111)
    try:
        if chunked:
            _extend(core, [7], ["hs-r1-1-11"], [0], aux[:7], final[:7], ids[:7])
            _extend(core, [4], ["hs-r1-1-11"], [7], aux[7:], final[7:], ids[7:])
        else:
            _extend(core, [11], ["hs-r1-1-11"], [0], aux, final, ids)
    finally:
        core.close()
    path = tmp_path / "stage" / "hs-r1-1-11.safetensors"
    header, _ = _split(path.read_bytes())
    assert header["__metadata__"][fp8.STATE_ENCODING_KEY] == encoding
    t = load(path.read_bytes())
    enc = ENCODINGS[encoding]
    for name, state in (("aux_hidden_states", aux.view(11, K, h)), ("final_hidden_state", final)):
        q, s = encode_state(state, enc)
        assert torch.equal(t[name], q) and torch.equal(t[name + ".scale"], s), name
    state_bytes = len(_split(path.read_bytes())[1]) - ids.numel() * 8
    assert state_bytes <= 0.29 * (11 * (K + 1) * h * 2)  # 4.25 (mxfp4) or 4.5 (nf4) bits a value of bf16's 16
    sample = TokenizedSample("s0", ids, torch.ones(11, dtype=torch.bool))
    got = check_dump(str(path), "hs-r1-1-11", sample, ExpectedDump(aux_layer_ids=tuple(IDS), dtype=torch.bfloat16))
    assert isinstance(got, CapturedSample), got
    with ShardWriter(tmp_path / "ds", {"aux_layer_ids": IDS, "hidden_size": h, "dtype": "bfloat16"}, storage=storage) as writer:
        assert writer.add(got)
    back = open_dataset(tmp_path / "ds")[0]
    assert torch.equal(back["aux_hidden_states"], decode_state(t["aux_hidden_states"], t["aux_hidden_states.scale"], enc))
