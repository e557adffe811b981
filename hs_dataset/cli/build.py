"""``hs-dataset build``: capture a config's data into a dataset directory (resumable)."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import TYPE_CHECKING

from hs_dataset.cli.card_args import add_card_arguments, add_override_arguments, card_from_args
from hs_dataset.cli.numbers import at_least, positive_int
from hs_dataset.cli.signals import sigterm_as_interrupt
from hs_dataset.codecs.registry import STORAGE_CHOICES

if TYPE_CHECKING:
    from hs_dataset.pipeline.run_report import RunReport

__all__ = ["EXAMPLES", "HELP", "add_arguments", "run"]

HELP = "capture hidden states for a config and write a dataset"
EXAMPLES = """
  hs-dataset build --config tiny-deepseek-hf --out out/tiny          # embedded default, CPU
  hs-dataset build --config kimi-k25-sglang --model-path /models/Kimi-K2.5 \\
      --source chats.jsonl --out /data/kimi --server http://127.0.0.1:30000
  hs-dataset build --config tiny-deepseek-hf --out out/tiny --json   # the run report as JSON
  hs-dataset build --config tiny-deepseek-hf --out s3://bucket/tiny/rank-00000 --rank 0 --world-size 2   # staged, then uploaded
  hs-dataset build --model /models/my-model --out out/mine           # no card: derived from the model
  hs-dataset build --model moonshotai/Kimi-K2.5 --trust-remote-code --server http://127.0.0.1:30000 --out out/kimi
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_card_arguments(parser)
    add_override_arguments(parser)
    parser.add_argument(
        "--out", required=True, help="dataset directory, or an fsspec URL (s3://bucket/prefix, docs/REMOTE.md); an existing one is resumed"
    )
    parser.add_argument(
        "--stage-dir",
        default=None,
        help="--out URL: the local directory shards are written to before upload (default: $HS_DATASET_STAGE_DIR, else one per URL)",
    )
    parser.add_argument("--num-samples", type=positive_int, default=None, help="capture only the first N samples of the source")
    parser.add_argument(
        "--source",
        default=None,
        help="hf:ORG/NAME (a Hub dataset), a .jsonl/.json/.parquet/.arrow file or a saved datasets directory (default: the card's source)",
    )
    parser.add_argument("--subset", default=None, help="hf: sources: the dataset's config (subset)")
    parser.add_argument("--split", default=None, help="hf: sources and saved DatasetDicts: the split (default train), e.g. train_sft")
    parser.add_argument("--revision", default=None, help="hf: sources: branch, tag or commit of the dataset")
    parser.add_argument(
        "--columns",
        action="append",
        default=None,
        metavar="OURS=THEIRS",
        help="map a source column to our field, e.g. --columns messages=dialog (repeatable, or comma-separated)",
    )
    parser.add_argument(
        "--regenerate", action="store_true", help="the target rewrites every assistant turn before capture (card section regenerate)"
    )
    parser.add_argument(
        "--max-new-tokens", type=positive_int, default=None, help="with --regenerate: most tokens per turn (default: the card's)"
    )
    parser.add_argument("--thinking", choices=["on", "off"], default=None, help="with --regenerate: the template's thinking switch")
    parser.add_argument("--batch-size", type=positive_int, default=None, help="samples per forward (hf) or requests in flight (sglang)")
    parser.add_argument("--model-path", default=None, help="local model directory (overrides the card)")
    parser.add_argument("--device", default=None, help="hf backend: auto, cpu, cuda, cuda:1 ...")
    parser.add_argument("--server", action="append", default=None, metavar="URL", help="SGLang server URL (repeat for several)")
    parser.add_argument(
        "--storage",
        choices=STORAGE_CHOICES,
        default=None,
        help="state encoding on disk (fp8 halves bytes, mxfp4/nf4 about a quarter; default: the card's)",
    )
    parser.add_argument("--shard-bytes", type=positive_int, default=None, help="target shard size in bytes (< 4 GiB)")
    parser.add_argument(
        "--rank", type=at_least(0), default=None, help="this process's rank (default: from SLURM/torchrun variables, else 0)"
    )
    parser.add_argument(
        "--world-size", type=positive_int, default=None, help="number of ranks (default: from SLURM/torchrun variables, else 1)"
    )
    parser.add_argument("--strict", action="store_true", help="stop at the first malformed source row instead of reporting it")
    parser.add_argument("--json", action="store_true", help="print the run report as JSON")


def run(args: argparse.Namespace) -> int:
    from hs_dataset.distributed import rank_and_world_size

    rank, world = rank_and_world_size(args.rank, args.world_size)
    card = _source_and_regeneration(card_from_args(args), args)
    _check_servers_apply(card, args.server)
    with sigterm_as_interrupt():  # a stopped build says how many samples it stored and the command that resumes it
        report = _build(args, card, rank, world)
    print(json.dumps(report.to_json(), indent=1) if args.json else report.summary())
    return 0


def _build(args: argparse.Namespace, card, rank: int, world: int) -> RunReport:
    """The build the flags ask for; the manifest records this command line as the one that resumes it."""
    from hs_dataset.pipeline.build import build_dataset

    argv = getattr(args, "_argv", None)  # set by main(); without it the build records an equivalent command
    return build_dataset(
        card,
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
        progress=not args.no_progress,  # a bar on a terminal, else a line every --progress-interval (hs_dataset.cli.progress)
        remote={"stage_dir": args.stage_dir} if args.stage_dir else {},
        command=shlex.join(["hs-dataset", *argv]) if argv else None,
    )


def _check_servers_apply(card, servers: list[str] | None) -> None:
    """``--server`` with a card of the in-process backend would be ignored: refuse it instead."""
    from hs_dataset.errors import UsageError

    if servers and card.backend.name != "sglang":
        raise UsageError(
            f"--server: config {card.name!r} ({card.source_path}) captures in process (backend.name: {card.backend.name}), so no "
            "server is used; drop --server, or use a card with backend.name: sglang"
        )


def _columns(values: list[str] | None) -> dict[str, str]:
    """``--columns messages=dialog`` (repeatable, or comma-separated) -> ``{"messages": "dialog"}``."""
    from hs_dataset.errors import UsageError
    from hs_dataset.sources.shapes import FIELDS

    out: dict[str, str] = {}
    for item in ",".join(values or []).split(","):
        if not item.strip():
            continue
        ours, sep, theirs = item.partition("=")
        if not sep or ours.strip() not in FIELDS or not theirs.strip():
            raise UsageError(f"--columns {item!r}: write OURS=THEIRS with OURS one of {', '.join(FIELDS)} (e.g. messages=dialog)")
        out[ours.strip()] = theirs.strip()
    return out


def _source_and_regeneration(card, args: argparse.Namespace):
    """The card with the source flags (--subset/--split/--revision/--columns) and --regenerate applied."""
    source = {k: getattr(args, k) for k in ("subset", "split", "revision") if getattr(args, k) is not None}
    if args.columns:
        source["columns"] = _columns(args.columns)
    regenerate = {"enabled": True} if args.regenerate else {}
    for key in ("max_new_tokens", "thinking"):
        if getattr(args, key) is not None:
            regenerate[key] = getattr(args, key)
    overrides = {k: v for k, v in (("source", source), ("regenerate", regenerate)) if v}
    return card.with_overrides(**overrides) if overrides else card
