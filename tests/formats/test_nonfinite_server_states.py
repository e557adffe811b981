"""A NaN scale in 4-bit states a server quantized is quarantined (the build goes on), or refused under ``nonfinite: refuse``.

The server stands in as a backend that quantizes synthetic states to nf4 as its kernel
does and poisons one group's scale in one row. Tags (tests/fixtures/tally.py): LOST: a
good row not stored, SILENT: a NaN stored.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hs_dataset.capture.base import CaptureBackend
from hs_dataset.codecs.registry import encoding_of_storage, get_encoding
from hs_dataset.sample import CapturedSample
from tests.fixtures.assertions import one_line
from tests.fixtures.samples import make_metadata, make_sample

K, H = 3, 64

NF4 = get_encoding(encoding_of_storage("nf4"))
POISONED = ("row-3",)


def server_encoded(sample: CapturedSample, poison: bool) -> CapturedSample:
    """What a server quantizing to nf4 on its GPU hands the writer; ``poison``: one group's scale is NaN."""
    aux, aux_scale = NF4.quantize(sample.aux_hidden_states.to(torch.bfloat16))
    final, final_scale = NF4.quantize(sample.final_hidden_state.to(torch.bfloat16))
    if poison:
        aux_scale = aux_scale.clone()
        aux_scale[1, 0, 0] = float("nan")
    return CapturedSample(sample.sample_id, sample.input_ids, sample.loss_mask, aux, final, aux_scale=aux_scale, final_scale=final_scale)


class QuantizingServer(CaptureBackend):
    """A stand-in for an SGLang server that stores nf4: synthetic states, quantized as the server's kernel does."""

    fixed_batches = True

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir

    def info(self):
        from hs_dataset.capture.base import CaptureInfo

        return CaptureInfo(
            model_path=str(self.model_dir),
            model_fingerprint="0" * 64,
            aux_layer_ids=[2, 3, 4],
            hidden_size=H,
            num_hidden_layers=6,
            dtype=torch.bfloat16,
            final_norm_eps=1e-6,
            final_norm_weight=torch.ones(H),
            vocab_size=1000,
            backend="sglang",
            verification={"verified": True, "by": "test"},
        )

    def capture_batch(self, samples):
        out = []
        for s in samples:
            made = replace(make_sample(s.sample_id, s.num_tokens, k=K, h=H), input_ids=s.input_ids, loss_mask=s.loss_mask)
            out.append(server_encoded(made, s.sample_id in POISONED))
        return out


def test_one_nan_scale_from_the_server_is_quarantined_not_a_build_abort(tmp_path, tiny_model_dir, tiny_card):
    from hs_dataset.formats.reader import open_dataset
    from hs_dataset.pipeline.build import build_dataset

    rows = [{"id": f"row-{i}", "input_ids": list(range(5, 12 + i)), "loss_mask": [1] * (7 + i)} for i in range(6)]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    card = tiny_card.with_overrides(shards={"storage": "nf4"}, dtype="bfloat16")
    out = tmp_path / "ds"
    for run in range(2):  # the rerun died at the same sample
        report = build_dataset(card, out, backend=QuantizingServer(tiny_model_dir), source=str(source))
        assert [q["sample_id"] for q in report.quarantined] == (list(POISONED) if run == 0 else []), report.quarantined
        assert report.not_written() == ({"quarantined_nonfinite": 1} if run == 0 else {}), report.not_written()
        if run == 0:
            assert "quarantined_nonfinite: 1" in report.summary(), report.summary()
    ds = open_dataset(out)
    stored = sorted(ds[i]["sample_id"] for i in range(len(ds)))
    assert stored == [f"row-{i}" for i in range(6) if f"row-{i}" not in POISONED], f"LOST: {stored}"
    assert all(torch.isfinite(ds[i]["aux_hidden_states"].float()).all() for i in range(len(ds))), "SILENT: a NaN state was stored"
    assert [q["sample_id"] for q in json.loads((out / "manifest.json").read_text())["quarantine"]] == list(POISONED)


def test_refuse_policy_still_refuses_a_nan_scale(tmp_path):
    from hs_dataset.errors import NonFiniteStateError
    from hs_dataset.formats.writer import ShardWriter

    sample = server_encoded(make_sample("s0", 5, k=K, h=H), poison=True)
    with (
        ShardWriter(tmp_path, make_metadata(k=K, h=H), storage="nf4", nonfinite="refuse") as writer,
        pytest.raises(NonFiniteStateError) as caught,
    ):
        writer.add(sample)
    assert "s0" in one_line(caught.value) and "scale" in str(caught.value)
