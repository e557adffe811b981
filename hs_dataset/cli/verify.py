"""``hs-dataset verify``: prove a dataset directory is complete and uncorrupted.

Problems found are a result, not a crash: each is listed on stderr and the exit
status is 1; a directory that cannot be checked at all is an error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["DESCRIPTION", "EXAMPLES", "EXIT_PROBLEMS", "HELP", "add_arguments", "run"]

EXIT_PROBLEMS = 1

HELP = "check every shard, hash, shape and offset of a dataset"
DESCRIPTION = (
    HELP + '.\n\nexit status: 0 verified; 1 problems found (each listed on stderr, or under "problems" with --json);\n'
    "2 the directory cannot be checked (not a dataset, unreadable)."
)
EXAMPLES = """
  hs-dataset verify out/tiny
  hs-dataset verify out/tiny --no-hashes --no-values   # structure only, seconds on any size
  hs-dataset verify out/tiny --json
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


def run(args: argparse.Namespace) -> int:
    from hs_dataset.dataset_access import verify

    # a URL's shards are downloaded, and every download checks its hash, --no-hashes or not
    result = verify(args.path, check_hashes=not args.no_hashes, check_values=not args.no_values)
    if args.json:
        print(
            json.dumps(
                {"ok": result.ok, "samples": result.samples, "tokens": result.tokens, "shards": result.shards, "problems": result.problems}
            )
        )
    elif result.ok:
        print(result.summary())
    else:
        for problem in result.problems:
            print(f"error: {problem}", file=sys.stderr)
        print(f"verification FAILED: {len(result.problems)} problem(s) in {args.path}", file=sys.stderr)
    return 0 if result.ok else EXIT_PROBLEMS
