"""The ``hs-dataset`` command line: the parser, the dispatch and the one error boundary.

Every command is a module of this package exposing ``HELP`` (one line), ``EXAMPLES``
(the ``examples:`` epilog), ``add_arguments(parser)`` and ``run(args) -> int``.
Command modules import torch, transformers and datasets only inside ``run``, so
``hs-dataset --help`` stays fast.

Errors are handled here and nowhere else: an error hs_dataset raises on purpose
(:class:`~hs_dataset.errors.HsDatasetError`), an OS error or Ctrl-C prints one line
``hs-dataset CMD: error: MESSAGE`` and exits 2 (with the traceback under ``--debug``
or ``HS_DATASET_DEBUG=1``); anything else is a bug: traceback, exit 70 (sysexits' EX_SOFTWARE), so a
script can tell it from exit 1, which ``verify`` (and ``merge``, ``patch check``) use for "found problems".
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from hs_dataset.cli.progress import progress_settings
from hs_dataset.cli.signals import ignore_further_stops
from hs_dataset.cli.style import HelpFormatter, Parser, add_global_flags, add_subcommand
from hs_dataset.errors import HsDatasetError
from hs_dataset.progress.settings import showing
from hs_dataset.version import __version__

__all__ = ["COMMANDS", "EXIT_BUG", "EXIT_ERROR", "EXIT_PROBLEMS", "build_parser", "main"]

# command name -> module (under hs_dataset.cli) holding HELP, EXAMPLES, add_arguments, run
COMMANDS: dict[str, str] = {
    "build": "hs_dataset.cli.build",
    "verify": "hs_dataset.cli.verify",
    "repair": "hs_dataset.cli.repair",
    "info": "hs_dataset.cli.info",
    "merge": "hs_dataset.cli.merge",
    "serve": "hs_dataset.cli.serve",
    "patch": "hs_dataset.cli.patch",
    "export": "hs_dataset.cli.export",
    "import": "hs_dataset.cli.import_",
    "train": "hs_dataset.cli.train",
    "push": "hs_dataset.cli.push",
    "card": "hs_dataset.cli.card",
}

EXIT_PROBLEMS = 1  # verify / merge / patch check ran and found problems (listed above the status)
EXIT_ERROR = 2  # a known error: bad input, missing file, refused operation, Ctrl-C
EXIT_BUG = 70  # an unexpected exception (EX_SOFTWARE): please report it, with the traceback

_KNOWN_ERRORS = (HsDatasetError, OSError, KeyboardInterrupt)

# Libraries whose INFO/DEBUG chatter (HTTP requests, lock files) hides our own output.
_NOISY_LOGGERS = ("httpx", "httpcore", "urllib3", "huggingface_hub", "filelock", "datasets", "fsspec")

_EPILOG = """examples:
  hs-dataset build --config tiny-deepseek-hf --out out/tiny
  hs-dataset verify out/tiny
  hs-dataset CMD --help           # the options and examples of one command

exit status: 0 success, 1 verify/merge/check found problems (listed), 2 error (one line on
stderr; --debug or HS_DATASET_DEBUG=1 adds the traceback), 70 a bug (traceback shown: please report it)."""


def build_parser() -> argparse.ArgumentParser:
    """The full parser; command modules are imported here, so they must stay light."""
    parser = Parser(prog="hs-dataset", description="EAGLE-3 hidden-state datasets.", epilog=_EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"hs-dataset {__version__}")
    add_global_flags(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        cmd = add_subcommand(sub, name, help=module.HELP, description=getattr(module, "DESCRIPTION", None), examples=module.EXAMPLES)
        module.add_arguments(cmd)
        cmd.set_defaults(_module=module_name, _parser=cmd)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Like ``parse_args``, but unknown options are blamed on the command (``hs-dataset build: error: ...``)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        getattr(args, "_parser", parser).error("unrecognized arguments: " + " ".join(unknown))
    return args


def _configure_logging(verbose: bool) -> None:
    """Our own INFO messages always; library noise only with ``-v``."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")
    logging.getLogger("hs_dataset").setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)


def _debug_wanted(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get("HS_DATASET_DEBUG", "") not in ("", "0")


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line (multi-line messages are joined with ' | ')."""
    if isinstance(exc, KeyboardInterrupt):  # a bare Ctrl-C says nothing; a build's says what it stored and how to resume
        return str(exc) or "interrupted"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " | ".join(lines) or type(exc).__name__


def _report_error(command: str, exc: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc)
    print(f"hs-dataset {command}: error: {_one_line(exc)}", file=sys.stderr, flush=True)
    return EXIT_ERROR


def _report_bug(command: str, exc: BaseException) -> int:
    traceback.print_exception(exc)
    print(
        f"hs-dataset {command}: internal error ({type(exc).__name__}); this is a bug, please report it with the traceback above",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_BUG


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the command and turn its errors into an exit status (never raises)."""
    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except SystemExit as exc:  # --help, --version, usage errors: already printed; hand back the status
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    _configure_logging(args.verbose)
    args._argv = list(sys.argv[1:] if argv is None else argv)  # as typed: a build records it as the command that resumes it
    module = importlib.import_module(args._module)
    try:
        with showing(progress_settings(args)):  # every command's long loops show progress the same way
            return int(module.run(args) or 0)
    except _KNOWN_ERRORS as exc:
        if isinstance(exc, KeyboardInterrupt) and argv is None:  # the program itself: a second Ctrl-C must not change its status
            ignore_further_stops()
        return _report_error(args.command, exc, _debug_wanted(args))
    except Exception as exc:  # noqa: BLE001 -- the boundary: anything else is a bug
        return _report_bug(args.command, exc)


if __name__ == "__main__":
    sys.exit(main())
