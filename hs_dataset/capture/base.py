"""The backend interface every capture path (in-process HF, SGLang client) implements.

A backend turns :class:`TokenizedSample` s into :class:`CapturedSample` s. It also
describes *exactly* what it captures (:class:`CaptureInfo`), because the meaning of
"layer 30" and "final state" differs between tools; the description is copied into
the dataset manifest. What a backend is asked to capture (:class:`CaptureTarget`) is
the same for every backend, so it is one value built once from a card.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from hs_dataset.errors import UsageError
from hs_dataset.model.snapshot import resolve_model_path
from hs_dataset.sample import CapturedSample, TokenizedSample

if TYPE_CHECKING:
    from hs_dataset.config import Card, RegenerateSection
    from hs_dataset.regenerate.generator import Generator

__all__ = ["CaptureBackend", "CaptureFailure", "CaptureInfo", "CaptureResult", "CaptureTarget", "card_aux_layers"]


@dataclass(frozen=True)
class CaptureTarget:
    """What is captured, whatever the backend: the model snapshot, the aux layers and the dtype.

    ``aux_layer_ids`` are HF ``hidden_states`` indexes (see :class:`CaptureInfo`), a
    card's preset already turned into ids for the model's layer count; ``()``
    captures the final state only;
    ``dtype`` ``None`` means "whatever the backend produces" (the SGLang client takes
    the server's, the in-process backend float32). A path-like ``model_path`` is kept
    as its string, the ids as a tuple of ints.
    """

    model_path: str
    aux_layer_ids: tuple[int, ...]
    dtype: str | None = None
    model_revision: str | None = None
    text_module: str | None = None
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_path", str(self.model_path))
        object.__setattr__(self, "aux_layer_ids", tuple(int(i) for i in self.aux_layer_ids))

    @classmethod
    def from_card(cls, card: Card, model_path: str | os.PathLike | None = None) -> CaptureTarget:
        """The card's target; the model path is ``model_path``, else the card's, else ``$HS_DATASET_MODEL_PATH``, resolved."""
        path = model_path or card.model.path or os.environ.get("HS_DATASET_MODEL_PATH")
        if not path:
            raise UsageError(
                f"config {card.name!r} needs a local model directory: pass --model-path DIR (hs_dataset never downloads weights)"
            )
        directory = resolve_model_path(str(path))
        return cls(
            model_path=str(directory),
            aux_layer_ids=tuple(card_aux_layers(card, directory)),
            dtype=card.dtype,
            model_revision=card.model.revision,
            text_module=card.model.text_module,
            trust_remote_code=card.model.trust_remote_code,
        )


def card_aux_layers(card: Card, model_dir: str | os.PathLike) -> list[int]:
    """The aux ids the card captures on the model in ``model_dir``: its ``layers.aux``, or its preset for the model's layer count."""
    if card.layers.aux is not None:
        return list(card.layers.aux)
    from hs_dataset.model.model_config import load_text_config

    return card.aux_layers_for(int(load_text_config(model_dir)["num_hidden_layers"]))


@dataclass
class CaptureInfo:
    """What a backend captures, in the convention the manifest records.

    ``aux_layer_ids`` are indexes into transformers' ``output_hidden_states`` tuple:
    ``hidden_states[0]`` is the embedding output and ``hidden_states[i]`` the output of
    decoder layer ``i-1`` (the residual stream entering layer ``i``).
    ``final_state`` is ``"pre_norm"`` (output of the last decoder layer, before the
    model's final norm) or ``"post_norm"``.
    """

    model_path: str
    model_fingerprint: str
    aux_layer_ids: list[int]
    hidden_size: int
    num_hidden_layers: int
    dtype: torch.dtype
    final_state: str = "pre_norm"
    final_norm_eps: float | None = None
    final_norm_weight: torch.Tensor | None = None  # [H], stored next to the shards
    model_revision: str | None = None
    vocab_size: int | None = None
    backend: str = ""
    backend_details: dict = field(default_factory=dict)
    # {"verified": bool, "by": what ran this capture path against an independent forward, or why none did}
    verification: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CaptureFailure:
    """A sample the backend could not capture; the pipeline reports it, never drops it silently."""

    sample_id: str
    reason: str


CaptureResult = CapturedSample | CaptureFailure


class CaptureBackend(abc.ABC):
    """Base class of capture backends.

    Subclasses implement :meth:`info` and :meth:`capture_batch`; backends that can keep
    many requests in flight (the SGLang client) override :meth:`capture_stream`. A
    backend whose model can also write text (``--regenerate``) overrides :meth:`generator`,
    and one that captures groups of regenerated conversations best in bursts overrides
    :meth:`capture_burst`.
    """

    # True when a sample's bytes depend on which samples share its batch (padded
    # forwards): the pipeline then forms batches from fixed windows of the source
    # order, so a resumed build stores the same bytes as an uninterrupted one.
    fixed_batches: bool = False

    @abc.abstractmethod
    def info(self) -> CaptureInfo:
        """Describe the captured states (model, layers, norm); called once before work starts."""

    @abc.abstractmethod
    def capture_batch(self, samples: Sequence[TokenizedSample]) -> list[CaptureResult]:
        """Capture one batch; results are in input order, one per sample."""

    def in_flight(self, batch_size: int) -> int:
        """Samples :meth:`capture_stream` works on at once: one batch here; the SGLang client keeps more requests going."""
        return batch_size

    def generator(self, regenerate: RegenerateSection, tokenizer: Any) -> Generator:
        """The generator beside this backend, on the same model, for the card's ``regenerate`` section; refused here."""
        raise UsageError(f"--regenerate needs the hf or sglang backend; {type(self).__name__} cannot generate")

    def capture_burst(self, batch_size: int) -> tuple[int, int] | None:
        """(tokens, samples) a group of finished conversations fills before going to capture; None: no grouping."""
        return None

    def capture_stream(self, samples: Iterable[TokenizedSample], batch_size: int) -> Iterator[CaptureResult]:
        """Capture an iterable in batches of ``batch_size``; results may be yielded in any order."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        batch: list[TokenizedSample] = []
        for sample in samples:
            batch.append(sample)
            if len(batch) == batch_size:
                yield from self.capture_batch(batch)
                batch = []
        if batch:
            yield from self.capture_batch(batch)

    def close(self) -> None:  # noqa: B027  (optional hook: backends holding nothing need no close)
        """Release resources (servers, sessions, GPU memory)."""

    def __enter__(self) -> CaptureBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
