"""speculators' part of ``hs-dataset export``, ``import`` and ``train``: its help lines, its own options, and the calls.

``hs-dataset train speculators DATASET -- ARGS`` runs speculators' own trainer, reading our
shards in place: what the dataset knows -- its aux layers, the drafter family its layer
preset captured for, the verifier -- reaches the trainer unless the arguments say
otherwise (:mod:`hs_dataset.interop.speculators.launch`); what would stop the trainer is
refused first, in one line (exit 2).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = [
    "EXPORT_DESCRIPTION",
    "EXPORT_HELP",
    "IMPORT_DESCRIPTION",
    "IMPORT_HELP",
    "TRAIN_HELP",
    "add_export_arguments",
    "add_import_arguments",
    "add_train_arguments",
    "export",
    "import_",
    "train",
]

EXPORT_HELP = "speculators 0.9.0: Arrow dataset + hidden_states/hs_{idx}.safetensors (pre-norm final last)"
EXPORT_DESCRIPTION = (
    "Arrow dataset (save_to_disk, torch format: input_ids, loss_mask, seq_len) plus hidden_states/hs_{idx}.safetensors "
    "with hidden_states [T, K+1, H] (aux ascending, pre-norm final last) and token_ids [T], as "
    "speculators.train.data.ArrowDataset reads them."
)
IMPORT_HELP = "speculators 0.9.0: Arrow dataset + hidden_states/hs_{idx}.safetensors (final = pre-norm)"
IMPORT_DESCRIPTION = "Import a speculators offline-data directory; the last layer of hidden_states is stored as the pre-norm final state."
TRAIN_HELP = "speculators 0.9.0's own trainer, in process, reading the dataset's shards in place"


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-hidden-layers", type=int, default=None, help="L, if the manifest does not record it (the final state's id)")
    parser.add_argument("--no-token-freq", action="store_true", help="do not write token_freq.pt")


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hidden-states-path", default=None, help="directory of hs_{idx}.safetensors (default SRC/hidden_states)")
    parser.add_argument("--skip-missing", action="store_true", help="import rows whose hs_{idx}.safetensors exists, list the others")


def export(args: argparse.Namespace, **common: Any) -> Any:
    from hs_dataset.interop.speculators.export import export_speculators
    from hs_dataset.interop.speculators.settings import SpeculatorsExportSettings

    settings = SpeculatorsExportSettings(**common, num_hidden_layers=args.num_hidden_layers, token_freq=not args.no_token_freq)
    return export_speculators(args.src, args.dest, settings)


def import_(args: argparse.Namespace, settings: Any) -> Any:
    from hs_dataset.interop.speculators.import_ import import_speculators

    return import_speculators(args.src, args.dest, settings, hidden_states_path=args.hidden_states_path, skip_missing=args.skip_missing)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", help="hs_dataset dataset directory (holds manifest.json)")
    parser.add_argument(
        "--rows-dir",
        default=None,
        help="where speculators' Arrow rows and token_freq.pt (ids and masks only, no states) go; it also caches its "
        "vocab mappings there. Default: a temporary directory, removed afterwards",
    )
    parser.add_argument(
        "trainer_args",
        nargs=argparse.REMAINDER,
        metavar="-- ARGS",
        help="after DATASET (and --): speculators train arguments; --speculator-type, --target-layer-ids and "
        "--verifier-name-or-path default to the dataset's layer preset, aux layers and model. Our options go before DATASET",
    )


def train(args: argparse.Namespace) -> int:
    """Write the rows speculators reads (ids and masks), then run its trainer on the dataset's shards in place."""
    import shutil
    import tempfile
    from pathlib import Path

    from hs_dataset.formats.paths import check_local_path
    from hs_dataset.formats.reader import open_dataset
    from hs_dataset.interop.speculators.backend import register, trainer_entry, write_rows
    from hs_dataset.interop.speculators.launch import preflight, trainer_argv

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
