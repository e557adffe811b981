"""The ``hs-dataset`` command line.

Each subcommand lives in the module that owns its concept and exposes
``add_arguments(parser)`` and ``run(args) -> int``; this file only wires them.
Command modules keep heavy imports (torch, transformers, datasets) inside ``run``
so that building the parser stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

__all__ = ["main", "COMMANDS"]

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "build": ("hs_dataset.cli.build", "capture hidden states for a config and write a dataset"),
    "verify": ("hs_dataset.formats.verify", "check every shard, hash, shape and offset of a dataset"),
    "info": ("hs_dataset.formats.info", "print a dataset's metadata and sizes (optionally plots)"),
    "merge": ("hs_dataset.formats.merge", "merge per-rank datasets into one verified dataset"),
    "serve": ("hs_dataset.serve.plan", "start a SGLang server with everything capture needs"),
    "patch": ("hs_dataset.cli.patch", "check / apply / revert the source patch for SGLang <= 0.5.5"),
    "export": ("hs_dataset.cli.export", "export to a trainer's layout (speculators, specforge)"),
    "import": ("hs_dataset.cli.import_", "import a speculators or SpecForge layout"),
    "push": ("hs_dataset.hub.push", "upload a dataset (index, shards, manifest, card) to the Hub"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hs-dataset", description="EAGLE-3 hidden-state datasets.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.set_defaults(_module=module_name)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                cmd.set_defaults(_missing=f"'{name}' is not available in this installation ({exc})")
                continue
            raise
        module.add_arguments(cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    missing = getattr(args, "_missing", None)
    if missing:
        print(f"hs-dataset: {missing}", file=sys.stderr)
        return 2
    module = importlib.import_module(args._module)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
