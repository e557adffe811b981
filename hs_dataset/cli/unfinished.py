"""How the commands treat a dataset whose build has not finished: ``--allow-incomplete`` and the one-line refusal.

Why: a build killed with kill -9 leaves a dataset that reads and verifies clean, byte
for byte; without this, ``push`` would share half of it and ``merge`` bury it in a
whole. ``verify`` and ``info`` say so on their first line, ``push``, ``export`` and
``merge`` refuse it unless told otherwise. A dataset without the build record (older,
or not written by ``hs-dataset build``) counts as finished (:mod:`hs_dataset.formats.build_state`).
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from hs_dataset.errors import IncompleteDatasetError

if TYPE_CHECKING:  # hs_dataset.formats imports torch: ``hs-dataset --help`` builds every parser and must stay light
    from hs_dataset.formats.manifest import Manifest

__all__ = ["ALLOW_INCOMPLETE", "add_allow_incomplete", "refuse_unfinished"]

ALLOW_INCOMPLETE = "--allow-incomplete"


def add_allow_incomplete(parser: argparse.ArgumentParser, what: str) -> None:
    """The flag that lets a command go on with an unfinished build; ``what`` says what it then does."""
    parser.add_argument(
        ALLOW_INCOMPLETE,
        action="store_true",
        help=f"{what} a dataset whose build has not finished (killed or stopped; manifest.json build.state 'running')",
    )


def refuse_unfinished(path: str | os.PathLike, manifest: Manifest, verb: str) -> None:
    """Raise one line naming the dataset, how much of it is stored, the resume command and the flag; nothing if finished."""
    from hs_dataset.formats.build_state import progress_phrase, resume_hint

    build = manifest.build
    if build is None or build.finished:
        return
    raise IncompleteDatasetError(
        f"{os.fspath(path)}: unfinished build ({progress_phrase(manifest.num_samples, build.samples_expected)}; "
        f"manifest.json build.state is {build.state!r}): resume it with `{resume_hint(build)}`, "
        f"or pass {ALLOW_INCOMPLETE} to {verb} it as it is"
    )
