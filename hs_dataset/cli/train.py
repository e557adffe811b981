"""``hs-dataset train speculators DATASET -- ARGS``: speculators' own trainer, reading our shards in place."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

__all__ = ["HELP", "EXAMPLES", "add_arguments", "run", "trainer_argv"]

HELP = "train a drafter with a trainer's own code, straight from a dataset (speculators)"
EXAMPLES = """
  hs-dataset train speculators out/kimi -- --verifier-name-or-path /models/Kimi-K2.5 --save-path ckpt --epochs 1
  hs-dataset train speculators --rows-dir out/tiny-rows out/tiny -- --verifier-name-or-path DIR --max-steps 40
"""

_OURS = ("--data-path", "--hidden-states-backend", "--hs-dataset-path")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trainer", choices=["speculators"], help="the trainer whose CLI runs in-process")
    parser.add_argument("dataset", help="hs_dataset dataset directory (holds manifest.json)")
    parser.add_argument(
        "--rows-dir",
        default=None,
        help="where speculators' Arrow rows and token_freq.pt (ids and masks only, no states) go; it also caches its "
        "vocab mappings there. Default: a temporary directory, removed afterwards",
    )
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER, metavar="-- ARGS", help="after DATASET (and --): speculators train arguments; our options go before DATASET")


def trainer_argv(dataset: str, rows_dir: Path, trainer_args: list[str], aux_layer_ids: list[int]) -> list[str]:
    """speculators' argv: the user's arguments plus the data path, our backend and (unless given) the stored layer ids."""
    args = list(trainer_args[1:] if trainer_args[:1] == ["--"] else trainer_args)
    from hs_dataset.errors import UsageError

    clash = [a for a in args if a.split("=")[0] in _OURS]
    if clash:
        raise UsageError(f"{clash[0]} is set by hs-dataset train (the rows directory and the {dataset} backend); drop it")
    argv = args + ["--data-path", str(rows_dir), "--hidden-states-backend", "hs_dataset", "--hs-dataset-path", str(dataset)]
    if not any(a.split("=")[0] == "--target-layer-ids" for a in args):
        argv += ["--target-layer-ids", *map(str, aux_layer_ids)]
    return argv


def run(args: argparse.Namespace) -> int:
    from hs_dataset.formats.reader import open_dataset
    from hs_dataset.interop.speculators.backend import register, trainer_entry, write_rows

    from hs_dataset.formats.paths import check_local_path

    if args.rows_dir:  # before anything is written: a URL would become a local directory named 's3:'
        check_local_path(args.rows_dir, what="--rows-dir")
    register()  # before speculators' config module is imported: it reads backend flags once
    aux = [int(i) for i in open_dataset(args.dataset).manifest.aux_layer_ids]
    rows = Path(args.rows_dir) if args.rows_dir else Path(tempfile.mkdtemp(prefix="hs_dataset-speculators-rows-"))
    try:
        write_rows(args.dataset, rows)
        trainer_entry()(trainer_argv(args.dataset, rows, args.trainer_args, aux))
    finally:
        if not args.rows_dir:
            shutil.rmtree(rows, ignore_errors=True)
    return 0
