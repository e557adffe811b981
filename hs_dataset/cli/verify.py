"""``hs-dataset verify``: prove a dataset directory is complete and uncorrupted.

Problems found are a result, not a crash: each is listed on stderr and the exit
status is 1; a directory that cannot be checked at all is an error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from hs_dataset.cli.unfinished import ALLOW_INCOMPLETE, add_allow_incomplete

if TYPE_CHECKING:
    from hs_dataset.formats.build_state import BuildState

__all__ = ["DESCRIPTION", "EXAMPLES", "EXIT_PROBLEMS", "HELP", "add_arguments", "run"]

EXIT_PROBLEMS = 1

HELP = "check every shard, hash, shape and offset of a dataset"
DESCRIPTION = (
    HELP + '.\n\nexit status: 0 verified; 1 problems found (each listed on stderr, or under "problems" with --json),\n'
    "or the build that writes the dataset has not finished (first line; --allow-incomplete checks it as it is);\n"
    "2 the directory cannot be checked (not a dataset, unreadable). A dataset that does not record its build\n"
    "(older, or not written by build) counts as finished."
)
EXAMPLES = """
  hs-dataset verify out/tiny
  hs-dataset verify out/tiny --no-hashes --no-values   # structure only, seconds on any size
  hs-dataset verify out/tiny --json
  hs-dataset verify out/killed --allow-incomplete      # a build still running or stopped: check what it stored
  hs-dataset verify s3://bucket/kimi          # through the bounded cache (HS_DATASET_CACHE_DIR, HS_DATASET_CACHE_BYTES)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="dataset directory (holds manifest.json), or an fsspec URL (s3://bucket/prefix, docs/REMOTE.md)")
    parser.add_argument(
        "--no-hashes",
        action="store_true",
        help="skip the shard hash checks (BLAKE3, or sha256 for format-1 shards): a fast structural check only",
    )
    parser.add_argument("--no-values", action="store_true", help="skip the NaN/inf scan of every state")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_allow_incomplete(parser, "verify")


def run(args: argparse.Namespace) -> int:
    from hs_dataset.dataset_access import verify

    told = _unfinished_first(args)  # before the shards are read: progress lines come while they are
    # a URL's shards are downloaded, and every download checks its hash, --no-hashes or not
    result = verify(args.path, check_hashes=not args.no_hashes, check_values=not args.no_values)
    notice = _notice(args.path, result.samples, result.build, args.allow_incomplete)
    if notice and not args.allow_incomplete:  # an unfinished build is a finding: the first problem listed
        result.problems.insert(0, notice)
    if args.json:
        build = None if result.build is None else result.build.to_json()
        fields = {"ok": result.ok, "finished": result.finished, "build": build, "samples": result.samples, "tokens": result.tokens}
        print(json.dumps({**fields, "shards": result.shards, "problems": result.problems, "leftovers": result.leftovers}))
    elif result.ok:
        if notice and notice != told:
            print(notice)
        for leftover in result.leftovers:  # a running or killed build's shards in flight: its resume adopts them
            print(f"note: {leftover}")
        print(result.summary())
    else:
        for problem in result.problems:
            if problem != told:
                print(f"error: {problem}", file=sys.stderr)
        print(f"verification FAILED: {len(result.problems)} problem(s) in {args.path}", file=sys.stderr)
    return 0 if result.ok else EXIT_PROBLEMS


def _notice(path: str, stored: int, build: BuildState | None, allow_incomplete: bool) -> str | None:
    """The unfinished-build line (a problem unless ``--allow-incomplete``), or None."""
    from hs_dataset.formats.build_state import unfinished_line

    notice = unfinished_line(path, stored, build)
    if notice and not allow_incomplete:
        return f"{notice} (or pass {ALLOW_INCOMPLETE} to verify it as it is)"
    return notice


def _unfinished_first(args: argparse.Namespace) -> str | None:
    """Say an unfinished build first, from the manifest alone (stdout with --allow-incomplete, else an error line)."""
    from hs_dataset.dataset_access import read_manifest

    if args.json:
        return None
    try:
        manifest = read_manifest(args.path)
    except Exception:  # unreadable: verify itself says why, in its own words
        return None
    notice = _notice(args.path, manifest.num_samples, manifest.build, args.allow_incomplete)
    if notice:
        print(notice if args.allow_incomplete else f"error: {notice}", file=sys.stdout if args.allow_incomplete else sys.stderr, flush=True)
    return notice
