"""Whole-number options checked by the parser, so ``--num-samples -3`` is refused naming the option.

Without these, a negative or zero count reached ``build_dataset()`` and was refused there,
in terms of its Python keyword (``build_dataset(): num_samples``), not of the flag typed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["at_least", "port_number", "positive_int"]


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` taking a whole number >= ``minimum`` (argparse names the option in its one-line error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    parse.__name__ = f"whole number >= {minimum}"  # argparse shows it when int() itself fails
    return parse


positive_int = at_least(1)


def port_number(text: str) -> int:
    """An argparse ``type`` taking a TCP port, 1 to 65535."""
    value = at_least(1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port, 1 to 65535, got {value}")
    return value
