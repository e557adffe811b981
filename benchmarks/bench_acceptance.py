"""Proof by training: a drafter trained on our data speeds up its target; broken data does not.

The trained tiny verifier (``builtin:tiny-verifier``) writes its own greedy answers to
task prompts through ``build_dataset`` (HF backend, regenerate); broken copies of that
dataset are written with ``ShardWriter``; speculators' own trainer trains a 1-layer
EAGLE-3 drafter on each (same seed, same steps); on held-out prompts we measure
per-depth top-1 agreement and tau of a greedy draft-and-verify loop (checked equal to
plain greedy). Repeated for each drafter seed; the last line is the mean over seeds.

    python benchmarks/bench_acceptance.py [--seeds 0 1] [--epochs 8] [--samples 192]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _table(name: str, score) -> str:
    depths = " ".join(f"{h / max(1, t):.2f}" for h, t in zip(score.hits.tolist(), score.tries.tolist()))
    return f"{name:12s} agreement@1..k {depths}   tau {score.tau:.2f}   greedy-exact {score.exact}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=8, help="drafter epochs (same batches for every variant)")
    parser.add_argument("--samples", type=int, default=192, help="training prompts")
    parser.add_argument("--heldout", type=int, default=24)
    parser.add_argument("-k", type=int, default=4, help="draft depth")
    parser.add_argument("--max-new", type=int, default=32)
    opts = parser.parse_args()

    import torch

    import acceptance_lib as A
    from hs_dataset.capture.model_info import resolve_model_path
    from hs_dataset.testing.tiny_verifier import VERIFIER_AUX_LAYERS

    torch.set_num_threads(1)  # small ops: OpenMP threads on a shared 2-core VM mostly wait on each other
    started = time.perf_counter()
    verifier_dir = resolve_model_path("builtin:tiny-verifier")
    print(f"verifier {verifier_dir.name}: {(verifier_dir / 'training.json').read_text()}")
    work = A.scratch("bench-acceptance-")
    datasets = {"ours": A.build_ours(verifier_dir, work / "ours", opts.samples, seed=7)}
    for kind in A.VARIANTS[1:]:
        datasets[kind] = A.write_broken(datasets["ours"], work / kind, kind)
    verifier = A.Verifier(verifier_dir, VERIFIER_AUX_LAYERS)
    prompts = A.heldout_prompts(opts.heldout, seed=99)
    taus: dict[str, list[float]] = {kind: [] for kind in A.VARIANTS}
    for seed in opts.seeds:
        print(f"--- drafter seed {seed}: {opts.epochs} epochs, k={opts.k}, {len(prompts)} held-out prompts")
        for kind, data in datasets.items():
            checkpoint = A.train_drafter(verifier_dir, data, work / f"train-{kind}-{seed}", seed=seed, epochs=opts.epochs)
            score = A.evaluate(verifier, A.load_drafter(checkpoint), prompts, opts.k, opts.max_new)
            taus[kind].append(score.tau)
            print(_table(kind, score), flush=True)
    for kind, values in taus.items():
        spread = max(values) - min(values)
        print(f"{kind:12s} tau mean {statistics.mean(values):.2f} over seeds {opts.seeds} (spread {spread:.2f}): {' '.join(f'{v:.2f}' for v in values)}")
    print(f"run time {time.perf_counter() - started:.0f} s")
    names = {"ours": "tau_ours", "shift_aux": "tau_shift_aux", "shift_final": "tau_shift_final", "postnorm": "tau_postnorm"}
    print(" ".join(f"{names[kind]}={statistics.mean(values):.2f}" for kind, values in taus.items()))


if __name__ == "__main__":
    main()
