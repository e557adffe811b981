"""``hs-dataset info``: what a dataset holds, what its states mean, and how big it is."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hs_dataset.formats.manifest import Manifest
    from hs_dataset.formats.metadata import DatasetMetadata

__all__ = ["EXAMPLES", "HELP", "add_arguments", "describe", "human_bytes", "run"]

HELP = "print a dataset's metadata and sizes (optionally plots)"
EXAMPLES = """
  hs-dataset info out/tiny
  hs-dataset info out/tiny --json              # the whole manifest
  hs-dataset info out/tiny --plots out/plots   # lengths.png, layer_stats.png
"""


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``: sizes people can compare at a glance."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def trainer_layer_flags(md: DatasetMetadata) -> str:
    """What each trainer must be told about the stored aux layers (docs/TRAINING.md)."""
    from hs_dataset.formats.metadata import HF_HIDDEN_STATES_INDEX

    aux = [int(i) for i in md.aux_layer_ids or ()]
    if md.convention != HF_HIDDEN_STATES_INDEX:
        return "n/a (not hf_hidden_states_index)"
    if not aux:
        return "speculators --speculator-type mtp (the final state only); SpecForge: n/a (needs 3 aux layers)"
    forge = f"SpecForge aux_hidden_state_layer_ids {[i - 1 for i in aux]}" if min(aux) >= 1 else "SpecForge: n/a (layer 0)"
    return f"speculators --target-layer-ids {' '.join(map(str, aux))}; {forge}"


def layer_preset_line(md: DatasetMetadata) -> str:
    """The drafter family the layers were captured for (``layers.preset``), or that the card named them."""
    preset = md.layer_preset
    if preset is None:
        return "none (the card named the layers)"
    taps = f", {preset.taps} taps" if preset.taps else ""
    pinned = "; ids pinned by layers.aux" if preset.ids_from == "aux" else ""
    return f"{preset.name}{taps}{pinned}"


def build_line(manifest: Manifest) -> str:
    """Whether the build finished (and the command it ran), or that the dataset does not record it."""
    from hs_dataset.formats.build_state import NOT_RECORDED, progress_phrase

    build = manifest.build
    if build is None:
        return NOT_RECORDED
    state = "finished" if build.finished else f"running or stopped, {progress_phrase(manifest.num_samples, build.samples_expected)}"
    return f"{state} ({build.command or 'a merge'})"


def regeneration_line(md: DatasetMetadata) -> str:
    """Whether turns were regenerated, and the ids an answer is cut at (stop) and refused for (structure)."""
    record = md.regeneration
    if record is None:
        return "no (the source's assistant turns)"
    stop = None if record.stop_token_ids is None else list(record.stop_token_ids)
    structure = "not recorded" if record.structure_token_ids is None else list(record.structure_token_ids)
    return f"max_new_tokens {record.max_new_tokens}; stop ids {stop}; structure ids {structure}"


def describe(manifest: Manifest) -> str:
    """A human-readable summary of a manifest."""
    md = manifest.metadata
    from hs_dataset.formats.metadata import FinalNorm, ModelRecord

    model = md.model or ModelRecord()
    norm = md.final_norm or FinalNorm()
    bytes_per_token = manifest.num_bytes / manifest.num_tokens if manifest.num_tokens else 0.0
    lines = [
        f"format           {manifest.format} v{manifest.format_version} (dataset {manifest.dataset_id})",
        f"created by       {manifest.created_by}",
        f"config           {md.config_name} (fingerprint {str(md.config_fingerprint)[:16]})",
        f"model            {model.path or model.id} (revision/fingerprint {model.revision or str(model.fingerprint)[:16]})",
        f"aux layers       {None if md.aux_layer_ids is None else list(md.aux_layer_ids)} ({md.convention})",
        f"layer preset     {layer_preset_line(md)}",
        f"trainer layers   {trainer_layer_flags(md)}",
        f"final state      {md.final_state} (norm eps {norm.eps}, weight in {norm.weight_file})",
        f"dtype / hidden   {md.dtype} / {md.hidden_size}; stored as {manifest.state_encoding}",
        f"tokenizer        {None if md.tokenizer is None else md.tokenizer.to_json()}",
        f"regenerated      {regeneration_line(md)}",
        f"samples          {manifest.num_samples}",
        f"tokens           {manifest.num_tokens}",
        f"shards           {len(manifest.shards)}",
        f"bytes            {human_bytes(manifest.num_bytes)} ({bytes_per_token:.0f} B/token incl. ids and mask)",
        f"quarantined      {len(manifest.quarantine)}",
        f"build            {build_line(manifest)}",
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="dataset directory (holds manifest.json)")
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON (an unfinished build: build.state 'running')")
    parser.add_argument(
        "--plots",
        metavar="DIR",
        help="also write length and per-layer statistics plots (PNG) to DIR (refused if a file of that name is there)",
    )


def run(args: argparse.Namespace) -> int:
    from hs_dataset.formats.manifest import Manifest
    from hs_dataset.formats.paths import check_local_path

    if args.plots:  # before anything is read or printed: a URL would become a local directory named 's3:'
        check_local_path(args.plots, what="--plots directory")
    from hs_dataset.formats.build_state import unfinished_line

    manifest = Manifest.load(Path(args.path))
    notice = unfinished_line(args.path, manifest.num_samples, manifest.build)
    if notice and not args.json:  # the first line: a killed build looks like any other dataset below it
        print(notice)
    print(json.dumps(manifest.to_json(), indent=1) if args.json else describe(manifest))
    if args.plots:
        from hs_dataset.formats.stats import write_plots

        for path in write_plots(args.path, args.plots):
            print(f"wrote {path}")
    return 0
