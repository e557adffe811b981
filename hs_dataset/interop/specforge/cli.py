"""SpecForge's part of ``hs-dataset export`` and ``import``: its help lines, its own options, and the calls."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = [
    "EXPORT_DESCRIPTION",
    "EXPORT_HELP",
    "IMPORT_DESCRIPTION",
    "IMPORT_HELP",
    "add_export_arguments",
    "add_import_arguments",
    "export",
    "import_",
]

EXPORT_HELP = "SpecForge 0.2.0: rows_{g}-{g+2000}/data_{idx}.ckpt with a post-norm hidden_state"
EXPORT_DESCRIPTION = (
    "rows_{g}-{g+N}/data_{idx}.ckpt (torch.save) with input_ids, loss_mask, aux_hidden_state [1, T, 3H] and hidden_state "
    "[1, T, H] after the final norm (derived from the stored pre-norm state), as SpecForge's OfflineManifestReader reads "
    "them; in bfloat16 unless --keep-dtype."
)
IMPORT_HELP = "SpecForge 0.2.0: rows_*/data_{idx}.ckpt (final = post-norm)"
IMPORT_DESCRIPTION = (
    "Import SpecForge offline data; hidden_state is stored as a post_norm final state "
    "(files are read with torch.load(weights_only=True) only)."
)


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group-size", type=int, default=2000, help="files per rows_{g}-{g+N} directory")
    parser.add_argument(
        "--keep-dtype",
        action="store_true",
        help="keep the stored dtype instead of bfloat16 (SpecForge 0.2.0 trains only on bfloat16: its target head is bf16)",
    )


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    """SpecForge's import takes only the common options."""


def export(args: argparse.Namespace, **common: Any) -> Any:
    from hs_dataset.interop.specforge.export import export_specforge
    from hs_dataset.interop.specforge.settings import SpecForgeExportSettings

    return export_specforge(args.src, args.dest, SpecForgeExportSettings(**common, group_size=args.group_size, keep_dtype=args.keep_dtype))


def import_(args: argparse.Namespace, settings: Any) -> Any:
    from hs_dataset.interop.specforge.import_ import import_specforge

    return import_specforge(args.src, args.dest, settings)
