"""speculators' part of ``hs-dataset export`` and ``import``: its help lines, its own options, and the calls."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["EXPORT_HELP", "EXPORT_DESCRIPTION", "IMPORT_HELP", "IMPORT_DESCRIPTION", "add_export_arguments", "add_import_arguments", "export", "import_"]

EXPORT_HELP = "speculators 0.9.0: Arrow dataset + hidden_states/hs_{idx}.safetensors (pre-norm final last)"
EXPORT_DESCRIPTION = (
    "Arrow dataset (save_to_disk, torch format: input_ids, loss_mask, seq_len) plus hidden_states/hs_{idx}.safetensors "
    "with hidden_states [T, K+1, H] (aux ascending, pre-norm final last) and token_ids [T], as "
    "speculators.train.data.ArrowDataset reads them."
)
IMPORT_HELP = "speculators 0.9.0: Arrow dataset + hidden_states/hs_{idx}.safetensors (final = pre-norm)"
IMPORT_DESCRIPTION = "Import a speculators offline-data directory; the last layer of hidden_states is stored as the pre-norm final state."


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-hidden-layers", type=int, default=None, help="L, if the manifest does not record it (the final state's id)")
    parser.add_argument("--no-token-freq", action="store_true", help="do not write token_freq.pt")


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hidden-states-path", default=None, help="directory of hs_{idx}.safetensors (default SRC/hidden_states)")
    parser.add_argument("--skip-missing", action="store_true", help="import rows whose hs_{idx}.safetensors exists, list the others")


def export(args: argparse.Namespace, **common: Any) -> Any:
    from hs_dataset.interop.settings import ExportSettings
    from hs_dataset.interop.speculators.export import export_speculators

    settings = ExportSettings(**common, num_hidden_layers=args.num_hidden_layers, token_freq=not args.no_token_freq)
    return export_speculators(args.src, args.dest, settings)


def import_(args: argparse.Namespace, settings: Any) -> Any:
    from hs_dataset.interop.speculators.import_ import import_speculators

    return import_speculators(args.src, args.dest, settings, hidden_states_path=args.hidden_states_path, skip_missing=args.skip_missing)
