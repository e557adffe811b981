"""A 1.3 kB zero-stride SpecForge file declaring 10M tokens' states (7.7 GB) is refused with the peak RSS of a child process barely moved."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.interop.specforge.test_import_bounds import zero_stride_ckpt

# The child's own peak RSS (VmHWM) may grow at most this much while importing: materialising the file would cost 7.7 GB.
MEMORY_BOUND_MIB = 64
_CHILD = r"""
import json, sys
def peak():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
from hs_dataset.interop import ImportDataError, ImportSettings, import_specforge
base = peak()
try:
    import_specforge(sys.argv[1], sys.argv[2], ImportSettings(config="tiny-deepseek-hf", aux_layer_ids=[2, 3, 4], num_hidden_layers=8))
    out = {"error": None}
except ImportDataError as exc:
    out = {"error": str(exc)}
print(json.dumps({**out, "base_mib": base, "peak_mib": peak()}))
"""


def test_a_zero_stride_ckpt_of_10m_tokens_is_refused_with_bounded_memory(tmp_path: Path):
    path = tmp_path / "sf" / "rows_0-1" / "data_0.ckpt"
    zero_stride_ckpt(path, 10_000_000)
    assert path.stat().st_size < 4096
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "sf"), str(tmp_path / "dest")], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["error"] == (
        f"{path}: tensor aux_hidden_state declares shape [10000000, 3, 64] with strides [0, 0, 0] over a 4-byte storage "
        "(elements share bytes: a zero-stride or overlapping tensor, not data); re-save it with .contiguous() or remove the file"
    )
    assert out["peak_mib"] - out["base_mib"] < MEMORY_BOUND_MIB, out
