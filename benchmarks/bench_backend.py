"""speculators' own trainer: steps/s through the hs_dataset backend vs its `file` backend on the export, one run.

Builds the embedded default (tiny DeepseekV3, 42 samples), exports it for speculators,
then trains the same 1-layer EAGLE-3 drafter (same seed, same packed batches) twice:
from the export (`file` backend) and through `hs-dataset train speculators` (our
backend). Prints steps/s of each, their ratio (target >= 0.9) and the bytes each route
wrote to disk before training (export: state files + rows; backend: rows only). CPU
shims as in the tests (tests/speculators_cpu.py). Both routes run warm (their files were
just written, so both are in the page cache), alternating in one process, with the same
torch thread count (--threads, default 1: with an OpenMP pool as large as a shared
machine's cores, the training steps' speed swings several-fold with other load).

    python benchmarks/bench_backend.py [--epochs 3] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.fixtures


def _bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per route; the best is kept")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both routes (0: torch's default)")
    opts = parser.parse_args()
    import torch

    if opts.threads > 0:
        torch.set_num_threads(opts.threads)

    from hs_dataset.capture.hf import HFBackend
    from hs_dataset.config import load_card
    from hs_dataset.demo.tiny_model import build_tiny_deepseek
    from hs_dataset.interop.speculators.backend import register, trainer_entry, write_rows
    from hs_dataset.interop.speculators.export import export_speculators
    from hs_dataset.pipeline.build import build_dataset

    register()
    train = trainer_entry()
    from tests.fixtures import speculators_cpu

    work = Path(tempfile.mkdtemp(prefix="bench-backend-"))
    model = build_tiny_deepseek()
    card = load_card("tiny-deepseek-hf")
    backend = HFBackend.from_card(card, model_path=str(model), device="cpu")
    data = work / "data"
    build_dataset(card, data, backend=backend)
    backend.close()
    export, rows = work / "export", work / "rows"
    export_speculators(data, export)
    write_rows(data, rows)
    aux = [str(i) for i in card.layers.aux]
    common = [
        "--verifier-name-or-path",
        str(model),
        "--speculator-type",
        "eagle3",
        "--num-layers",
        "1",
        "--hidden-states-dtype",
        "float32",
        "--num-workers",
        "0",
        "--draft-vocab-size",
        "1024",
        "--no-resume-from-checkpoint",
        "--epochs",
        str(opts.epochs),
        "--total-seq-len",
        "512",
        "--seed",
        "0",
        "--log-freq",
        "1",
        "--on-missing",
        "raise",
        "--target-layer-ids",
        *aux,
        *speculators_cpu.CPU_FLAGS,
    ]
    routes = {
        "file backend (export)": ["--data-path", str(export)],
        "hs_dataset backend": ["--data-path", str(rows), "--hidden-states-backend", "hs_dataset", "--hs-dataset-path", str(data)],
    }
    best: dict[str, float] = {}
    steps: dict[str, int] = {}
    for r in range(opts.repeats):
        for name, extra in routes.items():
            with speculators_cpu.cpu_trainer(), speculators_cpu.step_losses() as losses:
                t0 = time.perf_counter()
                train([*common, *extra, "--save-path", str(work / f"ckpt-{r}-{len(best)}")])
                rate = len(losses) / (time.perf_counter() - t0)
            best[name], steps[name] = max(best.get(name, 0.0), rate), len(losses)
    written = {"file backend (export)": _bytes(export), "hs_dataset backend": _bytes(rows)}
    print(f"dataset: {_bytes(data):,} bytes in {data}; torch threads {torch.get_num_threads()}, both routes warm (page cache)")
    for name in routes:
        print(
            f"{name:24s} {best[name]:6.2f} steps/s ({steps[name]} steps, best of {opts.repeats}); wrote {written[name]:,} bytes before training"
        )
    ratio = best["hs_dataset backend"] / best["file backend (export)"]
    print(
        f"ratio backend/file: {ratio:.2f} (target >= 0.9); disk written: {written['hs_dataset backend'] / written['file backend (export)']:.3f} of the export's"
    )


if __name__ == "__main__":
    main()
