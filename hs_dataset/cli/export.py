"""``hs-dataset export speculators|specforge SRC DEST``: write a dataset in a trainer's own layout."""

from __future__ import annotations

import argparse
import json

from hs_dataset.cli.style import add_global_flags

__all__ = ["HELP", "EXAMPLES", "add_arguments", "run"]

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
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in DEST (only its own files; never a dataset, a link or files of yours)")
    p.add_argument(
        "--aux-layer-ids",
        type=int,
        nargs="+",
        default=None,
        metavar="ID",
        help="export only these stored aux layers (HF hidden_states indexes, ascending); default: all stored",
    )
    p.add_argument("--verify-hashes", action="store_true", help="check every shard's sha256 while reading")
    p.add_argument("--json", action="store_true", help="print the export report as JSON")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="target", metavar="TARGET")
    sub.required = True
    style = dict(formatter_class=parser.formatter_class, epilog=parser.epilog)  # same help style and examples
    spec = sub.add_parser(
        "speculators",
        **style,
        help="speculators 0.9.0: Arrow dataset + hidden_states/hs_{idx}.safetensors (pre-norm final last)",
        description="Arrow dataset (save_to_disk, torch format: input_ids, loss_mask, seq_len) plus "
        "hidden_states/hs_{idx}.safetensors with hidden_states [T, K+1, H] (aux ascending, pre-norm final last) "
        "and token_ids [T], as speculators.train.data.ArrowDataset reads them.",
    )
    _common(spec)
    spec.add_argument("--num-hidden-layers", type=int, default=None, help="L, if the manifest does not record it (the final state's id)")
    spec.add_argument("--no-token-freq", action="store_true", help="do not write token_freq.pt")
    forge = sub.add_parser(
        "specforge",
        **style,
        help="SpecForge 0.2.0: rows_{g}-{g+2000}/data_{idx}.ckpt with a post-norm hidden_state",
        description="rows_{g}-{g+N}/data_{idx}.ckpt (torch.save) with input_ids, loss_mask, aux_hidden_state [1, T, 3H] "
        "and hidden_state [1, T, H] after the final norm (derived from the stored pre-norm state), as SpecForge's "
        "OfflineManifestReader reads them; in bfloat16 unless --keep-dtype.",
    )
    _common(forge)
    forge.add_argument("--group-size", type=int, default=2000, help="files per rows_{g}-{g+N} directory")
    forge.add_argument(
        "--keep-dtype",
        action="store_true",
        help="keep the stored dtype instead of bfloat16 (SpecForge 0.2.0 trains only on bfloat16: its target head is bf16)",
    )


def run(args: argparse.Namespace) -> int:
    from hs_dataset.formats.paths import check_local_path

    check_local_path(args.dest, what="export destination")
    if args.target == "speculators":
        from hs_dataset.interop.speculators.export import export_speculators

        report = export_speculators(
            args.src,
            args.dest,
            overwrite=args.overwrite,
            aux_layer_ids=args.aux_layer_ids,
            num_hidden_layers_override=args.num_hidden_layers,
            verify_hashes=args.verify_hashes,
            token_freq=not args.no_token_freq,
        )
    else:
        from hs_dataset.interop.specforge.export import export_specforge

        report = export_specforge(
            args.src,
            args.dest,
            overwrite=args.overwrite,
            aux_layer_ids=args.aux_layer_ids,
            group_size=args.group_size,
            verify_hashes=args.verify_hashes,
            keep_dtype=args.keep_dtype,
        )
    print(json.dumps(report.to_json(), indent=1) if args.json else report.summary())
    return 0
