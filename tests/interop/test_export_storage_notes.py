"""An export says what the source stored: 4-bit and 8-bit sources are named as such, decoded to bfloat16 on the way out.

SILENT: an export of quantized data that does not say so (tests/fixtures/tally.py).
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.fixtures.samples import make_metadata, make_sample

K, H = 3, 64


@pytest.mark.parametrize(
    "storage, stored, words", [("nf4", "nf4", "4-bit"), ("mxfp4", "mxfp4", "4-bit"), ("fp8", "fp8", "8-bit"), ("native", "bf16", None)]
)
def test_export_says_what_the_source_stored(tmp_path, capsys, storage, stored, words):
    from hs_dataset.cli.main import main
    from hs_dataset.formats.writer import ShardWriter

    src = tmp_path / "src"
    with ShardWriter(src, make_metadata(k=K, h=H, num_hidden_layers=8), final_norm_weight=torch.ones(H), storage=storage) as writer:
        for i in range(3):
            writer.add(make_sample(f"s{i}", 5 + i, k=K, h=H))
    assert main(["export", "speculators", str(src), str(tmp_path / "out")]) == 0
    summary = capsys.readouterr().out
    assert main(["export", "speculators", str(src), str(tmp_path / "out"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source_storage"] == stored and report["exported_dtype"] == "bfloat16", report
    assert f"stored {stored} in the source, exported as bfloat16" in summary, summary
    if words is None:
        assert not any("bit" in n for n in report["notes"]), report["notes"]
    else:
        assert any(words in n and "exported decoded to bfloat16" in n for n in report["notes"]), f"SILENT: {report['notes']}"
        assert words in summary, f"SILENT: the summary does not say the data was {words}: {summary}"
