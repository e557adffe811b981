"""Opt-in fp8 storage: bytes saved and error against bf16, on states captured from a real forward.

Captures the bundled conversations with the tiny DeepseekV3 in bf16 through the
in-process backend, writes the same samples twice (``storage="native"`` = bf16 and
``storage="fp8"`` = e4m3 with one float32 scale per token and layer), reads both
back with the one reader and compares. Last line:
``fp8_bytes_vs_bf16=X.XX fp8_rel_error_median=Y fp8_rel_error_max=Z``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from hs_dataset import open_dataset
from hs_dataset.capture.hf import HFBackend
from hs_dataset.config import load_card
from hs_dataset.pipeline.build import build_dataset


def state_bytes(ds) -> int:
    total = 0
    for i in range(len(ds.manifest.shards)):
        reader = ds.shard(i)
        for name, spec in reader.specs.items():
            if name.startswith(("aux_hidden_states", "final_hidden_state")):
                total += spec.nbytes
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-samples", type=int, default=42)
    args = parser.parse_args()
    card = load_card("tiny-deepseek-hf").with_overrides(dtype="bfloat16")
    backend = HFBackend.from_card(card, model_path="builtin:tiny-deepseek-v3", device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        for storage in ("native", "fp8"):
            build_dataset(card, Path(tmp) / storage, num_samples=args.num_samples, backend=backend, storage=storage)
        bf16, fp8 = open_dataset(Path(tmp) / "native"), open_dataset(Path(tmp) / "fp8")
        assert fp8.manifest.tensors["aux_hidden_states"]["encoding"] == "fp8_e4m3_per_token"
        errors = []
        by_id = {item["sample_id"]: item for item in fp8}
        for ref in bf16:
            got = by_id[ref["sample_id"]]
            for key in ("aux_hidden_states", "final_hidden_state"):
                a, b = got[key].float(), ref[key].float()
                per_token = (a - b).flatten(1).norm(dim=1) / b.flatten(1).norm(dim=1).clamp_min(1e-30)
                errors.extend(per_token.tolist())
        ratio = state_bytes(fp8) / state_bytes(bf16)
        hidden = bf16.manifest.hidden_size
        print(f"{len(bf16)} samples, {bf16.manifest.num_tokens} tokens, hidden {hidden}")
        print(f"state bytes: bf16 {state_bytes(bf16)}, fp8 {state_bytes(fp8)} (per-token scales included)")
        print(f"at Kimi-K2.5's width (7168) the same layout stores {(7168 + 4) / (7168 * 2):.4f} of the bf16 bytes")
        print(
            f"per-token relative error vs bf16: median {statistics.median(errors):.4f}, p99 {sorted(errors)[int(0.99 * len(errors))]:.4f}, max {max(errors):.4f}"
        )
        print(f"fp8_bytes_vs_bf16={ratio:.2f} fp8_rel_error_median={statistics.median(errors):.4f} fp8_rel_error_max={max(errors):.4f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
