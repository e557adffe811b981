"""How every ``hs-dataset`` parser looks and complains: defaults shown, examples kept as written,
usage errors on one line like every other error (see :mod:`hs_dataset.cli.main`)."""

from __future__ import annotations

import argparse
from typing import NoReturn

from hs_dataset.cli.progress import add_progress_flags

__all__ = ["HelpFormatter", "Parser", "add_global_flags", "add_subcommand"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows ``(default: X)`` where a default means something, and keeps epilogs' line breaks.

    ``None`` and on/off flags are left out: "(default: None)" says nothing a user can act on.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or isinstance(action.default, bool) or "default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line ``hs-dataset CMD: error: ...``, exit 2."""

    def error(self, message: str) -> NoReturn:
        command = " ".join(self.prog.split()[:2])  # "hs-dataset export speculators" -> "hs-dataset export"
        self.exit(2, f"{command}: error: {message} (see '{self.prog} --help')\n")


def add_global_flags(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    """``--debug``, ``-v`` and the progress flags: accepted before and after the command name alike.

    Below the top level they default to SUPPRESS, so a sub-parser never resets a flag given earlier.
    """
    default = False if top_level else argparse.SUPPRESS
    parser.add_argument("--debug", action="store_true", default=default, help="show the traceback of errors (also: HS_DATASET_DEBUG=1)")
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help="also show the INFO logs of HTTP and Hub libraries")
    add_progress_flags(parser, top_level=top_level)


def add_subcommand(
    sub: argparse._SubParsersAction, name: str, *, help: str, description: str | None = None, examples: str
) -> argparse.ArgumentParser:
    """A sub-parser in the shared style, with an ``examples:`` epilog (every command has one)."""
    parser = sub.add_parser(
        name,
        help=help,
        description=description or help,
        epilog="examples:\n" + examples.strip("\n"),
        formatter_class=HelpFormatter,
    )
    add_global_flags(parser, top_level=False)
    return parser
