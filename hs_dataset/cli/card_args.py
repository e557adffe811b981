"""The card a command runs with: ``--config NAME`` or one derived from ``--model PATH``, then command-line overrides.

Shared by ``build``, ``serve`` and ``card init`` so that the same flags mean the same
card everywhere (``card init`` output builds exactly what ``build --model`` builds).
"""

from __future__ import annotations

import argparse
from typing import Any

from hs_dataset.cli.numbers import at_least, positive_int
from hs_dataset.layer_presets import PRESET_NAMES

__all__ = ["add_card_arguments", "add_override_arguments", "card_from_args"]


def add_card_arguments(parser: argparse.ArgumentParser, *, config: bool = True, backend: bool = True) -> None:
    """``--config`` or ``--model`` (with ``--backend``, ``--model-revision``, ``--trust-remote-code``)."""
    if config:
        parser.add_argument(
            "--config",
            default=None,
            help="card name (e.g. tiny-deepseek-hf, kimi-k25-sglang) or path to a .yaml card; without it the card is derived from --model",
        )
    parser.add_argument(
        "--model",
        default=None,
        metavar="PATH_OR_ID",
        help="model directory or Hub id in the local cache: derive the card from the model (EAGLE-3 default layers)",
    )
    if backend:
        parser.add_argument(
            "--backend",
            choices=["hf", "sglang"],
            default=None,
            help="capture backend of a derived card (default: hf; sglang with --server)",
        )
    parser.add_argument("--model-revision", default=None, help="model revision (Hub ids: which cached snapshot)")
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        default=None,
        help="run the Python code the snapshot ships (tokenizer, processor); only for snapshots you trust",
    )


def add_override_arguments(parser: argparse.ArgumentParser) -> None:
    """Every card field used for capture, settable on the command line."""
    parser.add_argument(
        "--aux-layer-ids",
        type=at_least(0),
        nargs="+",
        default=None,
        metavar="ID",
        help="aux layers as HF hidden_states indexes (e.g. 2 30 58)",
    )
    parser.add_argument(
        "--layer-preset",
        choices=PRESET_NAMES,
        default=None,
        help="a drafter family's layers, derived from the model's layer count (layers.preset; mtp: the final state only)",
    )
    parser.add_argument("--taps", type=positive_int, default=None, help="layers a DFlash-family preset taps (layers.taps, default 5)")
    parser.add_argument("--max-length", type=positive_int, default=None, help="longest sample in tokens")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], default=None, help="dtype the states are captured and stored in"
    )
    parser.add_argument("--chat-template", default=None, metavar="FILE", help="Jinja chat template used instead of the tokenizer's own")
    parser.add_argument("--final-state", choices=["pre_norm", "post_norm"], default=None, help="the final state the card asks for")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    model: dict[str, Any] = {}
    if getattr(args, "trust_remote_code", None):
        model["trust_remote_code"] = True
    if getattr(args, "chat_template", None):
        model["chat_template"] = args.chat_template
    layers: dict[str, Any] = {}
    if getattr(args, "layer_preset", None):  # the preset's ids, unless --aux-layer-ids names them
        layers.update(preset=args.layer_preset, taps=getattr(args, "taps", None), aux=None)
    elif getattr(args, "taps", None) is not None:
        layers["taps"] = args.taps
    if getattr(args, "aux_layer_ids", None):
        layers["aux"] = list(args.aux_layer_ids)
    if getattr(args, "final_state", None):
        layers["final"] = args.final_state
    out: dict[str, Any] = {key: value for key, value in (("model", model), ("layers", layers)) if value}
    for flag in ("max_length", "dtype"):
        if getattr(args, flag, None) is not None:
            out[flag] = getattr(args, flag)
    return out


def card_from_args(args: argparse.Namespace, *, default_backend: str = "hf") -> Any:
    """The card named by ``--config``, or derived from ``--model``; overrides applied and validated."""
    from hs_dataset.config import load_card
    from hs_dataset.errors import UsageError

    config, model = getattr(args, "config", None), getattr(args, "model", None)
    if config:
        card = load_card(config)
        if model:
            card = card.with_overrides(model={"path": model})
    elif model:
        from hs_dataset.model.card_from_model import card_from_model

        servers = getattr(args, "server", None)
        backend = getattr(args, "backend", None) or ("sglang" if servers else default_backend)
        card = card_from_model(
            model, backend=backend, servers=servers, trust_remote_code=bool(args.trust_remote_code), revision=args.model_revision
        )
    else:
        raise UsageError("name a card with --config NAME, or a model with --model PATH (the card is then derived from the model)")
    overrides = _overrides(args)
    return card.with_overrides(**overrides) if overrides else card
