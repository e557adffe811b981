"""A final-state-only capture (``layers.preset: mtp``) through a real CPU SGLang 0.5.23 server, end to end.

``hs-dataset serve`` plans the server without aux flags or layer hooks; the client
builds a dataset whose shards hold no aux tensor, and its final states equal an
independent transformers forward, as with aux layers (tests/capture/sglang/test_server.py).
"""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from tests.fixtures.sglang_server import hf_reference, rel, require_sglang_env, start_server

pytestmark = pytest.mark.sglang


def test_a_final_only_card_captures_and_stores_the_final_state_alone(card, tiny_model, hs_tmp, hf_model, tmp_path):
    from hs_dataset.formats.reader import open_dataset
    from hs_dataset.formats.verify import verify_dataset
    from hs_dataset.pipeline.build import build_dataset

    require_sglang_env()
    final_only = card.with_overrides(layers={"aux": None, "preset": "mtp"})
    server = start_server(final_only, hs_tmp, "final-only")
    try:
        assert server.plan.hf_aux_layer_ids == [] and "--enable-return-aux-hidden-states" not in server.plan.argv
        rows = tmp_path / "rows.jsonl"
        rows.write_text(
            "".join(
                json.dumps(
                    {
                        "id": f"r{i}",
                        "messages": [
                            {"role": "user", "content": f"count to {i + 3}"},
                            {"role": "assistant", "content": " ".join(str(k) for k in range(1, i + 4))},
                        ],
                    }
                )
                + "\n"
                for i in range(6)
            )
        )
        out = tmp_path / "ds"
        report = build_dataset(
            final_only.with_overrides(backend={"name": "sglang", "urls": [server.url]}), out, source=str(rows), progress=False
        )
    finally:
        server.stop(timeout=5)
    assert report.samples_written == 6
    data = open_dataset(out, verify_hashes=True)
    assert data.manifest.aux_layer_ids == [] and data.manifest.metadata.to_json()["layer_preset"]["name"] == "mtp"
    assert verify_dataset(out).ok
    with safe_open(str(out / data.manifest.shards[0].file), framework="pt") as f:
        assert "aux_hidden_states" not in f.keys()
    worst = 0.0
    for sample in data:
        _aux, final = hf_reference(hf_model, sample["input_ids"])
        assert sample["aux_hidden_states"].shape == (sample["input_ids"].shape[0], 0, 64)
        worst = max(worst, rel(sample["final_hidden_state"], final))
    print(f"\nfinal state only through SGLang: max relative error vs transformers {worst:.1e}")
    assert worst < 2e-6  # the bound of the capture with aux layers
