"""``hs-dataset train speculators DATASET -- ARGS``: speculators' own trainer, reading our shards in place.

What the dataset knows -- its aux layers, the drafter family its layer preset captured
for, the verifier -- reaches the trainer unless the arguments say otherwise
(:mod:`hs_dataset.interop.speculators.launch`); what would stop the trainer is refused
first, in one line (exit 2).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

__all__ = ["HELP", "EXAMPLES", "add_arguments", "run"]

HELP = "train a drafter with a trainer's own code, straight from a dataset (speculators)"
EXAMPLES = """
  hs-dataset train speculators out/kimi -- --save-path ckpt --epochs 1
  hs-dataset train speculators out/qwen-dflash2 -- --save-path ckpt --max-steps 400   # type and layers from the manifest
  hs-dataset train speculators --rows-dir out/tiny-rows out/tiny -- --verifier-name-or-path DIR --max-steps 40
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trainer", choices=["speculators"], help="the trainer whose CLI runs in-process")
    parser.add_argument("dataset", help="hs_dataset dataset directory (holds manifest.json)")
    parser.add_argument(
        "--rows-dir",
        default=None,
        help="where speculators' Arrow rows and token_freq.pt (ids and masks only, no states) go; it also caches its "
        "vocab mappings there. Default: a temporary directory, removed afterwards",
    )
    parser.add_argument(
        "trainer_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
        help="after DATASET (and --): speculators train arguments; --speculator-type, --target-layer-ids and "
        "--verifier-name-or-path default to the dataset's layer preset, aux layers and model. Our options go before DATASET",
    )


def run(args: argparse.Namespace) -> int:
    from hs_dataset.formats.reader import open_dataset
    from hs_dataset.interop.speculators.backend import register, trainer_entry, write_rows
    from hs_dataset.interop.speculators.launch import preflight, trainer_argv

    from hs_dataset.formats.paths import check_local_path

    if args.rows_dir:  # before anything is written: a URL would become a local directory named 's3:'
        check_local_path(args.rows_dir, what="--rows-dir")
    register()  # before speculators' config module is imported: it reads backend flags once
    manifest = open_dataset(args.dataset).manifest
    entry = trainer_entry()
    rows = Path(args.rows_dir) if args.rows_dir else Path(tempfile.mkdtemp(prefix="hs_dataset-speculators-rows-"))
    try:
        argv = trainer_argv(args.dataset, rows, args.trainer_args, manifest)
        preflight(argv)
        write_rows(args.dataset, rows)
        entry(argv)
    finally:
        if not args.rows_dir:
            shutil.rmtree(rows, ignore_errors=True)
    return 0
