"""How the commands treat a dataset whose build has not finished: the ``--allow-incomplete`` flag.

Why: a build killed with kill -9 leaves a dataset that reads and verifies clean, byte
for byte; without this, ``push`` would share half of it and ``merge`` bury it in a
whole. ``verify`` and ``info`` say so on their first line, ``push``, ``export`` and
``merge`` refuse it unless told otherwise: the Python API refuses it (``allow_incomplete=False``,
:func:`hs_dataset.formats.build_state.refuse_unfinished`) and these commands pass the flag on. A
dataset without the build record (older, or not written by ``hs-dataset build``) counts as finished.
"""

from __future__ import annotations

import argparse

from hs_dataset.errors import ALLOW_INCOMPLETE

__all__ = ["ALLOW_INCOMPLETE", "add_allow_incomplete"]


def add_allow_incomplete(parser: argparse.ArgumentParser, what: str) -> None:
    """The flag that lets a command go on with an unfinished build; ``what`` says what it then does.

    The refusal itself is the API's (``formats/build_state.refuse_unfinished``): the command passes the flag on.
    """
    parser.add_argument(
        ALLOW_INCOMPLETE,
        action="store_true",
        help=f"{what} a dataset whose build has not finished (killed or stopped; manifest.json build.state 'running')",
    )
