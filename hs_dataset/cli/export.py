"""``hs-dataset export speculators|specforge SRC DEST``: write a dataset in a trainer's own layout."""

from __future__ import annotations

import argparse
import json

from hs_dataset.cli.numbers import at_least
from hs_dataset.cli.style import add_global_flags
from hs_dataset.cli.unfinished import add_allow_incomplete

__all__ = ["EXAMPLES", "HELP", "add_arguments", "run"]

HELP = "export to a trainer's layout (speculators, specforge)"
EXAMPLES = """
  hs-dataset export speculators out/kimi out/kimi-speculators
  hs-dataset export specforge out/kimi out/kimi-specforge --aux-layer-ids 2 30 58
  hs-dataset export speculators out/kimi out/spec --json   # the export report as JSON
"""


def _common(p: argparse.ArgumentParser) -> None:
    add_global_flags(p, top_level=False)
    p.add_argument("src", help="hs_dataset dataset directory (holds manifest.json)")
    p.add_argument("dest", help="export directory; an interrupted export of the same source resumes")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier export in DEST (only its own files; never a dataset, a link or files of yours)",
    )
    p.add_argument(
        "--aux-layer-ids",
        type=at_least(0),
        nargs="+",
        default=None,
        metavar="ID",
        help="export only these stored aux layers (HF hidden_states indexes, ascending); default: all stored",
    )
    p.add_argument("--verify-hashes", action="store_true", help="check every shard's BLAKE3 hash while reading")
    p.add_argument("--json", action="store_true", help="print the export report as JSON")
    add_allow_incomplete(p, "export")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hs_dataset.interop.trainers import TRAINERS, trainer_cli

    sub = parser.add_subparsers(dest="target", metavar="TARGET")
    sub.required = True
    style = {"formatter_class": parser.formatter_class, "epilog": parser.epilog}  # same help style and examples
    for name in TRAINERS:
        trainer = trainer_cli(name)
        target = sub.add_parser(name, **style, help=trainer.EXPORT_HELP, description=trainer.EXPORT_DESCRIPTION)
        _common(target)
        trainer.add_export_arguments(target)


def run(args: argparse.Namespace) -> int:
    from hs_dataset.formats.paths import check_local_path
    from hs_dataset.interop.trainers import trainer_cli

    check_local_path(args.dest, what="export destination")
    check_local_path(args.src, what="dataset")
    report = trainer_cli(args.target).export(
        args,
        overwrite=args.overwrite,
        aux_layer_ids=args.aux_layer_ids,
        verify_hashes=args.verify_hashes,
        allow_incomplete=args.allow_incomplete,  # the export refuses an unfinished build without it
    )
    print(json.dumps(report.to_json(), indent=1) if args.json else report.summary())
    return 0
