"""``hs-dataset import speculators|specforge SRC DEST --config NAME``: another trainer's data into our format."""

from __future__ import annotations

import argparse
import json

from hs_dataset.cli.numbers import at_least, positive_int
from hs_dataset.cli.style import add_global_flags
from hs_dataset.codecs.registry import STORAGE_CHOICES

__all__ = ["EXAMPLES", "HELP", "add_arguments", "run"]

HELP = "import a speculators or SpecForge layout"
EXAMPLES = """
  hs-dataset import speculators out/spec out/back --config kimi-k25-sglang
  hs-dataset import specforge /data/forge out/forge --config my-import --aux-layer-ids 2 30 58 \\
      --model-path /models/Kimi-K2.5
"""


def _common(p: argparse.ArgumentParser) -> None:
    add_global_flags(p, top_level=False)
    p.add_argument("src", help="the speculators / SpecForge data directory")
    p.add_argument("dest", help="hs_dataset directory to write (an interrupted import of the same data resumes)")
    p.add_argument(
        "--config",
        required=True,
        help="config card name or .yaml path (supplies layer ids, dtype, model), or a free-form name for the imported dataset",
    )
    p.add_argument(
        "--aux-layer-ids", type=at_least(0), nargs="+", default=None, metavar="ID", help="aux layers as HF hidden_states indexes, ascending"
    )
    p.add_argument(
        "--num-hidden-layers", type=positive_int, default=None, help="L: with no layer ids given, use the trainer's default [2, L//2, L-3]"
    )
    p.add_argument("--model-path", default=None, help="local model directory: records its fingerprint and final-norm weight/eps")
    p.add_argument("--model-id", default=None, help="model id to record (e.g. moonshotai/Kimi-K2.5)")
    p.add_argument("--storage", choices=STORAGE_CHOICES, default="native", help="state encoding on disk (docs/FORMAT.md)")
    p.add_argument("--shard-bytes", type=positive_int, default=None, help="target shard size in bytes (< 4 GiB)")
    p.add_argument(
        "--max-length",
        type=positive_int,
        default=None,
        metavar="N",
        help="longest sample in tokens to accept, checked before reading it (default: the card's max_length, "
        "else the model's max_position_embeddings, else 131072)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="delete an earlier export in DEST first (only its own files; never a dataset, a link or files of yours)",
    )
    p.add_argument("--json", action="store_true", help="print the import report as JSON")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hs_dataset.interop.trainers import TRAINERS, trainer_cli

    sub = parser.add_subparsers(dest="source_format", metavar="FORMAT")
    sub.required = True
    style = {"formatter_class": parser.formatter_class, "epilog": parser.epilog}  # same help style and examples
    for name in TRAINERS:
        trainer = trainer_cli(name)
        source = sub.add_parser(name, **style, help=trainer.IMPORT_HELP, description=trainer.IMPORT_DESCRIPTION)
        _common(source)
        trainer.add_import_arguments(source)


def run(args: argparse.Namespace) -> int:
    from hs_dataset.formats.paths import check_local_path
    from hs_dataset.interop.settings import ImportSettings
    from hs_dataset.interop.trainers import trainer_cli

    check_local_path(args.src, what="import source")
    check_local_path(args.dest, what="import destination")
    settings = ImportSettings(
        config=args.config,
        aux_layer_ids=args.aux_layer_ids,
        num_hidden_layers=args.num_hidden_layers,
        model_path=args.model_path,
        model_id=args.model_id,
        storage=args.storage,
        shard_bytes=args.shard_bytes,
        overwrite=args.overwrite,
        max_length=args.max_length,
    )
    report = trainer_cli(args.source_format).import_(args, settings)
    print(json.dumps(report.to_json(), indent=1, default=str) if args.json else report.summary())
    return 0
