"""``hs-dataset merge PART... OUT``: per-rank datasets into one, then verified."""

from __future__ import annotations

import argparse
import sys

from hs_dataset.cli.unfinished import add_allow_incomplete

__all__ = ["DESCRIPTION", "EXAMPLES", "HELP", "add_arguments", "run"]

HELP = "merge per-rank datasets into one verified dataset"
DESCRIPTION = (
    HELP + ".\n\nShards are hard-linked (copied where links are impossible), never rewritten.\n"
    "A part whose build has not finished is refused (--allow-incomplete merges it; the merged dataset then records\n"
    "an unfinished build too).\n"
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
    add_allow_incomplete(parser, "merge")


def run(args: argparse.Namespace) -> int:
    from hs_dataset.cli.verify import EXIT_PROBLEMS
    from hs_dataset.dataset_access import merge
    from hs_dataset.formats.build_state import unfinished_line

    result = merge(args.parts, args.out, allow_incomplete=args.allow_incomplete)  # refuses an unfinished part without it
    if not result.ok:
        for problem in result.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_PROBLEMS
    notice = unfinished_line(args.out, result.samples, result.build)
    if notice:
        print(notice)
    print(f"merged {len(args.parts)} parts: {result.summary()}")
    return 0
