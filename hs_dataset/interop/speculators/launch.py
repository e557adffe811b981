"""What a dataset tells speculators' trainer, and why the trainer cannot run, before it starts.

speculators 0.9.0 takes the aux layers from ``--target-layer-ids`` and falls back to
``[2, L//2, L-3]`` with only a warning (``speculators/models/utils.py``), and its data
carries no layer record. A dataset's manifest knows the layers it holds, the drafter
family its ``layers.preset`` captured for, and the verifier it was captured from: they
are handed to the trainer (:func:`dataset_flags`), so no default of the trainer's picks
other layers. What the trainer cannot do is refused here in one line each
(:class:`TrainerUnavailableError`, exit 2), instead of a traceback minutes in: layers the
dataset does not hold, missing verifier weights, MTP on a model speculators' MTP lacks,
and a machine without the accelerator its trainer places the model on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hs_dataset.errors import UsageError

__all__ = [
    "DatasetFacts",
    "TrainerUnavailableError",
    "dataset_facts",
    "dataset_flags",
    "flag_values",
    "preflight",
    "trainer_argv",
]

_OURS = ("--data-path", "--hidden-states-backend", "--hs-dataset-path")
_DEFAULT_TYPE = "eagle3"  # speculators 0.9.0's TrainConfig.speculator_type default


class TrainerUnavailableError(UsageError):
    """speculators' trainer cannot run on this dataset, verifier or machine; the message names the cause and the fix."""


@dataclass(frozen=True)
class DatasetFacts:
    """What a manifest says the trainer needs: the stored aux layers, the family they were captured for, the verifier."""

    aux_layer_ids: list[int]
    speculator_type: str | None  # the ``layers.preset`` of the capture (its names are speculators' types)
    verifier: str | None  # the model directory the states were captured from
    num_hidden_layers: int | None


def dataset_facts(manifest: Any) -> DatasetFacts:
    md = manifest.metadata
    layers = md.num_hidden_layers
    return DatasetFacts(
        aux_layer_ids=[int(i) for i in manifest.aux_layer_ids],
        speculator_type=None if md.layer_preset is None else md.layer_preset.name,
        verifier=None if md.model is None else md.model.path,
        num_hidden_layers=int(layers) if layers is not None else None,
    )


def dataset_flags(facts: DatasetFacts, speculator_type: str | None = None) -> list[str]:
    """The trainer flags the dataset states: the type, its layers (none for MTP, which reads the final state only), the verifier."""
    kind = speculator_type or facts.speculator_type
    flags = ["--speculator-type", kind] if kind else []
    if facts.aux_layer_ids and kind != "mtp":
        flags += ["--target-layer-ids", *map(str, facts.aux_layer_ids)]
    if facts.verifier:
        flags += ["--verifier-name-or-path", facts.verifier]
    return flags


def flag_values(args: Sequence[str], name: str) -> list[str] | None:
    """The values given to ``name`` (``--x a b`` or ``--x=a``; the last use wins), or None when it is not given."""
    found: list[str] | None = None
    for i, arg in enumerate(args):
        if arg == name:
            found = []
            for value in args[i + 1 :]:
                if value.startswith("--"):
                    break
                found.append(value)
        elif arg.startswith(name + "="):
            found = [arg.split("=", 1)[1]]
    return found


def trainer_argv(dataset: str, rows_dir: Path, trainer_args: Sequence[str], manifest: Any) -> list[str]:
    """speculators' argv: the user's arguments, the data path and our backend, then what the dataset knows that the user left out."""
    args = list(trainer_args[1:] if trainer_args[:1] == ["--"] else trainer_args)
    clash = [a for a in args if a.split("=")[0] in _OURS]
    if clash:
        raise UsageError(f"{clash[0]} is set by hs-dataset train (the rows directory and the {dataset} backend); drop it")
    facts = dataset_facts(manifest)
    given_type = flag_values(args, "--speculator-type")
    kind = (given_type or [None])[0] or facts.speculator_type or _DEFAULT_TYPE
    if not facts.aux_layer_ids and kind != "mtp":
        raise TrainerUnavailableError(
            f"{dataset} holds the final state only (no aux layers), which only speculators' MTP trains on: pass "
            f"--speculator-type mtp, or capture with layers.preset: {kind} for --speculator-type {kind}"
        )
    asked = flag_values(args, "--target-layer-ids")
    if asked is not None and kind != "mtp":
        _check_held(dataset, asked, facts.aux_layer_ids)
    argv = args + ["--data-path", str(rows_dir), "--hidden-states-backend", "hs_dataset", "--hs-dataset-path", str(dataset)]
    known = dataset_flags(facts, kind)
    for name in ("--speculator-type", "--target-layer-ids", "--verifier-name-or-path"):
        if flag_values(args, name) is None and name in known:
            argv += [name, *flag_values(known, name)]  # type: ignore[misc]
    if flag_values(argv, "--verifier-name-or-path") is None:
        raise TrainerUnavailableError(
            f"{dataset}: the manifest records no verifier model; pass --verifier-name-or-path DIR (the model the states were captured from)"
        )
    return argv


def _check_held(dataset: str, asked: list[str], held: list[int]) -> None:
    try:
        ids = [int(v) for v in asked]
    except ValueError:
        raise UsageError(f"--target-layer-ids takes integer layer ids, got {' '.join(asked)}") from None
    missing = [i for i in ids if i not in held]
    if missing or not ids:
        raise TrainerUnavailableError(
            f"--target-layer-ids {' '.join(asked)}: layer(s) {missing or '(none)'} are not in {dataset}, which holds aux layers "
            f"{held} (HF hidden_states indexes); ask for stored layers or leave the flag out to train on all of them"
        )


def preflight(argv: Sequence[str]) -> None:
    """Refuse, in one line, what would stop speculators' trainer: the verifier's weights, MTP's model types, the accelerator."""
    verifier = _verifier_dir((flag_values(argv, "--verifier-name-or-path") or [""])[0])
    kind = (flag_values(argv, "--speculator-type") or [_DEFAULT_TYPE])[0]
    if kind == "mtp":
        _check_mtp_verifier(verifier)
    _check_accelerator()


def _verifier_dir(path: str) -> Path:
    """The verifier's local snapshot, holding its config and its weights (the trainer recomputes every target from them)."""
    from hs_dataset.model.snapshot import ModelPathError, resolve_model_path

    try:
        directory = resolve_model_path(path)
    except ModelPathError as exc:
        raise TrainerUnavailableError(f"verifier {path!r}: {exc}") from None
    if not any(directory.glob("*.safetensors")) and not any(directory.glob("*.bin")):
        raise TrainerUnavailableError(
            f"verifier {directory}: no weights (*.safetensors) next to its config.json; speculators' trainer reads the "
            "verifier's embeddings, final norm and lm_head from them: download the full snapshot"
        )
    return directory


def _check_mtp_verifier(directory: Path) -> None:
    """speculators 0.9.0's MTP fine-tunes a verifier's own ``mtp.*`` head, on the model types it has MTP layers for."""
    from speculators.models.mtp.model_definitions import mtp_model_classes
    from speculators.utils.loading import list_checkpoint_keys

    from hs_dataset.model.model_config import load_text_config

    model_type = load_text_config(directory).get("model_type")
    supported = sorted(mtp_model_classes)
    if model_type not in mtp_model_classes:
        raise TrainerUnavailableError(
            f"--speculator-type mtp: speculators' MTP supports {', '.join(supported)} verifiers with native mtp.* weights; "
            f"{directory} is {model_type!r} (DeepSeek-V3 and Kimi-K2.5 keep theirs as model.layers.N.*): train another type"
        )
    if not any(key.startswith("mtp.") for key in list_checkpoint_keys(directory)):
        raise TrainerUnavailableError(
            f"--speculator-type mtp: {directory} holds no mtp.* weights; speculators' MTP fine-tunes the verifier's own MTP head"
        )


def _check_accelerator() -> None:
    """speculators 0.9.0's trainer moves the draft to its local rank (``model.to(local_rank)``, ``train/trainer.py``): a GPU index."""
    import torch
    from speculators.train import trainer

    try:
        torch.empty(0).to(trainer.get_local_rank())
    except RuntimeError as exc:
        raise TrainerUnavailableError(
            f"speculators' trainer needs a GPU: it places the draft model on accelerator {trainer.get_local_rank()!r} "
            f"({str(exc).strip()}); run hs-dataset train on a machine with CUDA"
        ) from None
