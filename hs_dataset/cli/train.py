"""``hs-dataset train TRAINER DATASET -- ARGS``: a trainer's own code, reading our shards in place.

The trainer comes from the registry (:mod:`hs_dataset.interop.trainers`): each one that
``hs-dataset train`` launches brings its options and its launcher in its ``cli`` module
(speculators: :mod:`hs_dataset.interop.speculators.cli`). A registered trainer without a
launcher is refused in one line naming those that have one (exit 2); an unknown name is
an argparse ``invalid choice``.
"""

from __future__ import annotations

import argparse

from hs_dataset.cli.style import add_global_flags
from hs_dataset.interop.trainers import (
    TRAINERS,
    launcher_cli,
    train_launchers,
    trainer_cli,
)

__all__ = ["EXAMPLES", "HELP", "add_arguments", "run"]

HELP = f"train a drafter with a trainer's own code, straight from a dataset ({', '.join(train_launchers())})"
EXAMPLES = """
  hs-dataset train speculators out/kimi -- --save-path ckpt --epochs 1
  hs-dataset train speculators out/qwen-dflash2 -- --save-path ckpt --max-steps 400   # type and layers from the manifest
  hs-dataset train speculators --rows-dir out/tiny-rows out/tiny -- --verifier-name-or-path DIR --max-steps 40
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trainer", metavar="TRAINER")
    sub.required = True
    for name, trainer in TRAINERS.items():
        if trainer.launches_training:
            module = trainer_cli(name)
            target = _trainer_parser(sub, parser, name, module.TRAIN_HELP)
            module.add_train_arguments(target)
        else:  # parsed, so that the refusal names the trainers that have a launcher
            _add_refused(_trainer_parser(sub, parser, name, f"no train launcher: hs-dataset export {name}, then its own trainer"))


def _trainer_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser, name: str, help: str
) -> argparse.ArgumentParser:
    """One trainer's sub-parser, in the command's help style and with its examples."""
    target: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=help, formatter_class=parent.formatter_class, epilog=parent.epilog
    )
    add_global_flags(target, top_level=False)
    return target


def _add_refused(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", nargs="?", help="hs_dataset dataset directory")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER, metavar="-- ARGS", help="the trainer's arguments")


def run(args: argparse.Namespace) -> int:
    return int(launcher_cli(args.trainer).train(args))
