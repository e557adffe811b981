"""``hs-dataset card init``: write the card derived from a model, every field with its meaning as a comment.

The YAML is written from the card's own pydantic field descriptions (one source,
as for docs/CARDS.md), values as JSON (a YAML subset, so nothing is reinterpreted).
Loading the output gives the same card as ``build --model`` derives, so both build
the same bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from typing import Any

from hs_dataset.cli.card_args import add_card_arguments, add_override_arguments, card_from_args

__all__ = ["EXAMPLES", "HELP", "add_arguments", "card_yaml", "run"]

HELP = "write the card derived from a model (every field commented) to edit or keep"
EXAMPLES = """
  hs-dataset card init --model /models/my-model > my.yaml
  hs-dataset card init --model moonshotai/Kimi-K2.5 --trust-remote-code --backend sglang > kimi.yaml
  hs-dataset build --config my.yaml --out out/mine       # the same dataset as build --model /models/my-model
"""

_WIDTH = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["init"], help="init: print the derived card as YAML")
    add_card_arguments(parser, config=False)
    add_override_arguments(parser)
    parser.add_argument(
        "--server", action="append", default=None, metavar="URL", help="SGLang server URL of a derived sglang card (repeatable)"
    )


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(" ".join(text.split()), _WIDTH - len(indent) - 2, break_on_hyphens=False)]


def _lines(section: Any, indent: str) -> list[str]:
    from pydantic import BaseModel

    out: list[str] = []
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        out += _comment(field.description or "", indent)
        if isinstance(value, BaseModel):
            out.append(f"{indent}{name}:")
            out += _lines(value, indent + "  ")
        else:
            out.append(
                f"{indent}{name}: {json.dumps(value.model_dump(mode='json') if hasattr(value, 'model_dump') else value, ensure_ascii=False)}"
            )
    return out


def card_yaml(card: Any) -> str:
    """The card as YAML with every field preceded by its description."""
    head = [
        "# hs_dataset card derived from the model; edit and build with `hs-dataset build --config THIS.yaml`.",
        "# Every key is documented in docs/CARDS.md.",
    ]
    return "\n".join(head + _lines(card, "")) + "\n"


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(card_yaml(card_from_args(args)))
    return 0
