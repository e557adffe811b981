"""``hs-dataset push DIR REPO_ID``: upload a dataset (index, shards, manifest, card) to the Hub."""

from __future__ import annotations

import argparse
import importlib

from hs_dataset.cli.numbers import positive_int
from hs_dataset.cli.unfinished import add_allow_incomplete

__all__ = ["EXAMPLES", "HELP", "add_arguments", "run"]

HELP = "upload a dataset (index, shards, manifest, card) to the Hub"
EXAMPLES = """
  hs-dataset push out/kimi user/kimi-k25-eagle3
  hs-dataset push out/kimi user/kimi-k25-eagle3 --revision v2 --private --no-plots
  HF_TOKEN=... hs-dataset push out/kimi user/kimi-k25-eagle3 --endpoint https://hub.example.org
  hs-dataset push out/mine user/mine-eagle3 --card my-card.yaml      # built from a card file of your own
  hs-dataset push out/imported user/imported-eagle3 --no-card        # built from no card (an import)
"""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="dataset directory (holds manifest.json)")
    parser.add_argument("repo_id", help="dataset repository, e.g. user/kimi-k25-eagle3")
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--card",
        help="the config card that built the dataset (a shipped name or a .yaml file); its dataset_card: keys "
        "go into the README. Default: the shipped card the manifest names",
    )
    which.add_argument(
        "--no-card",
        dest="card",
        action="store_false",
        default=None,
        help="push without a config card's metadata (a dataset built from no card)",
    )
    parser.add_argument(
        "--config", dest="config_name", help="config (repo folder and datasets config); default: the manifest's config_name"
    )
    parser.add_argument("--revision", help="branch to push to (created from main if missing)")
    parser.add_argument("--private", action="store_true", default=None, help="create the repo private")
    parser.add_argument("--token", help="Hub token (default: the saved login / HF_TOKEN)")
    parser.add_argument("--endpoint", help="Hub endpoint URL (default: HF_ENDPOINT or huggingface.co)")
    parser.add_argument("--commit-bytes", type=_positive_int, help="max shard bytes per commit (default: 16 GiB)")
    parser.add_argument("--commit-files", type=_positive_int, help="max files per commit (default: 50)")
    parser.add_argument("--no-plots", dest="plots", action="store_false", help="skip the statistics pass and the figures")
    parser.add_argument("--stats-samples", type=positive_int, help="compute the figures' statistics over the first N samples only")
    add_allow_incomplete(parser, "push")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Network failures of the HTTP clients huggingface_hub may use; unlike its own errors they are no OSError."""
    found = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def run(args: argparse.Namespace) -> int:
    from huggingface_hub import HfApi

    from hs_dataset.errors import HubError
    from hs_dataset.formats.paths import check_local_path
    from hs_dataset.hub.repo_id import check_repo_id
    from hs_dataset.hub.timeouts import limit_hub_timeouts
    from hs_dataset.hub.upload import PushOptions, push_to_hub

    check_repo_id(args.repo_id)  # before the dataset is read or the Hub asked: a typo is a usage error, not exit 70
    check_local_path(args.path, what="dataset")  # push_to_hub refuses an unfinished build before any request
    timeout = limit_hub_timeouts()  # no hang without a network: every request gives up after this
    api = HfApi(endpoint=args.endpoint, token=args.token)
    limits = {k: v for k, v in (("commit_bytes", args.commit_bytes), ("commit_files", args.commit_files)) if v is not None}
    options = PushOptions(
        config_name=args.config_name,
        revision=args.revision,
        private=args.private,
        plots=args.plots,
        stats_samples=args.stats_samples,
        **limits,
    )
    try:
        report = push_to_hub(
            args.path, args.repo_id, card=args.card, api=api, token=args.token, options=options, allow_incomplete=args.allow_incomplete
        )
    except _transport_errors() as exc:
        where = args.endpoint or "the Hub"
        raise HubError(
            f"cannot reach {where} ({type(exc).__name__}: {exc or f'no answer within {timeout:g} s'}); "
            "check the network, --endpoint or HF_ENDPOINT (HS_DATASET_HUB_TIMEOUT_S sets the wait)"
        ) from exc
    print(report.summary())
    return 0
