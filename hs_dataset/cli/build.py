"""``hs-dataset build``: capture a config's data into a dataset directory (resumable)."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["HELP", "EXAMPLES", "add_arguments", "run"]

HELP = "capture hidden states for a config and write a dataset"
EXAMPLES = """
  hs-dataset build --config tiny-deepseek-hf --out out/tiny          # embedded default, CPU
  hs-dataset build --config kimi-k25-sglang --model-path /models/Kimi-K2.5 \\
      --source chats.jsonl --out /data/kimi --server http://127.0.0.1:30000
  hs-dataset build --config tiny-deepseek-hf --out out/tiny --json   # the run report as JSON
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="card name (e.g. tiny-deepseek-hf, kimi-k25-sglang) or path to a .yaml card")
    parser.add_argument("--out", required=True, help="dataset directory; an existing one is resumed")
    parser.add_argument("--num-samples", type=int, default=None, help="capture only the first N samples of the source")
    parser.add_argument("--source", default=None, help="JSONL file or saved datasets directory (default: the card's source)")
    parser.add_argument("--batch-size", type=int, default=None, help="samples per forward (hf) or requests in flight (sglang)")
    parser.add_argument("--model-path", default=None, help="local model directory (overrides the card)")
    parser.add_argument("--device", default=None, help="hf backend: auto, cpu, cuda, cuda:1 ...")
    parser.add_argument("--server", action="append", default=None, metavar="URL", help="SGLang server URL (repeat for several)")
    parser.add_argument("--storage", choices=["native", "fp8"], default=None, help="state encoding on disk (fp8 halves bytes; default: the card's)")
    parser.add_argument("--shard-bytes", type=int, default=None, help="target shard size in bytes (< 4 GiB)")
    parser.add_argument("--rank", type=int, default=None, help="this process's rank (default: from SLURM/torchrun variables, else 0)")
    parser.add_argument("--world-size", type=int, default=None, help="number of ranks (default: from SLURM/torchrun variables, else 1)")
    parser.add_argument("--strict", action="store_true", help="stop at the first malformed source row instead of reporting it")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the run report as JSON")


def run(args: argparse.Namespace) -> int:
    from hs_dataset.config import load_card
    from hs_dataset.distributed import rank_and_world_size
    from hs_dataset.pipeline import build_dataset

    rank, world = rank_and_world_size(args.rank, args.world_size)
    report = build_dataset(
        load_card(args.config),
        args.out,
        num_samples=args.num_samples,
        source=args.source,
        batch_size=args.batch_size,
        model_path=args.model_path,
        device=args.device,
        servers=args.server,
        storage=args.storage,
        shard_bytes=args.shard_bytes,
        rank=rank,
        world_size=world,
        strict=args.strict,
        progress=not args.no_progress and sys.stderr.isatty(),
    )
    print(json.dumps(report.to_json(), indent=1) if args.json else report.summary())
    return 0
