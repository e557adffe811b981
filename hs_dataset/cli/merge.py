"""``hs-dataset merge PART... OUT``: per-rank datasets into one, then verified."""

from __future__ import annotations

import argparse
import sys

__all__ = ["HELP", "DESCRIPTION", "EXAMPLES", "add_arguments", "run"]

HELP = "merge per-rank datasets into one verified dataset"
DESCRIPTION = (
    HELP + ".\n\nShards are hard-linked (copied where links are impossible), never rewritten.\n"
    "exit status: 0 merged and verified; 1 merged but verification found problems (listed on stderr); 2 error."
)
EXAMPLES = """
  hs-dataset merge out/rank0 out/rank1 out/merged
  hs-dataset merge out/rank* out/merged        # the shell expands the parts
  hs-dataset merge s3://bucket/ds/rank-000{00..15} s3://bucket/ds   # parts under the prefix: no shard is copied
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("parts", nargs="+", metavar="PART", help="dataset directories (or URLs) to merge (e.g. one per rank)")
    parser.add_argument("out", metavar="OUT", help="directory (or URL, docs/REMOTE.md) of the merged dataset")


def run(args: argparse.Namespace) -> int:
    from hs_dataset.cli.verify import EXIT_PROBLEMS
    from hs_dataset.errors import UsageError
    from hs_dataset.formats.merge import merge_datasets
    from hs_dataset.formats.verify import verify_dataset
    from hs_dataset.remote.location import is_url
    from hs_dataset.remote.merge import merge_remote
    from hs_dataset.remote.verify import verify_remote

    urls = [is_url(p) for p in (*args.parts, args.out)]
    if any(urls) and not all(urls):
        raise UsageError("give every part and the output as URLs of one store, or all as local directories (upload local parts with build --out URL)")
    if all(urls):
        merge_remote(args.parts, args.out)
        result = verify_remote(args.out)
    else:
        merge_datasets(args.parts, args.out)
        result = verify_dataset(args.out)
    if not result.ok:
        for problem in result.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_PROBLEMS
    print(f"merged {len(args.parts)} parts: {result.summary()}")
    return 0
