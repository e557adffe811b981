"""What a run opens from a card: the capture backend, the tokenizer, the manifest metadata and the samples.

``build_dataset`` and ``stream`` both open a card here, so both capture exactly the
samples the other would: the same rows, tokenized under the same rules, limited and
split across ranks the same way.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from hs_dataset.capture.base import CaptureBackend, CaptureInfo
from hs_dataset.config import Card, HFBackendSection, load_card
from hs_dataset.config.run import RunOptions
from hs_dataset.dtypes import state_dtype_name
from hs_dataset.errors import UsageError
from hs_dataset.formats.metadata import (
    HF_HIDDEN_STATES_INDEX,
    BackendRecord,
    DatasetMetadata,
    FinalNorm,
    LayerPreset,
    ModelRecord,
    SourceRecord,
    TokenizerRecord,
)
from hs_dataset.model.tokenizer import load_card_tokenizer, tokenizer_info
from hs_dataset.sample import TokenizedSample
from hs_dataset.sources.iterate import SampleRules, iter_samples
from hs_dataset.sources.read_ahead import read_ahead
from hs_dataset.sources.report import SourceReport
from hs_dataset.sources.rows import RowSource

__all__ = [
    "CaptureSession",
    "as_card",
    "dataset_metadata",
    "layer_preset_record",
    "limit_samples",
    "make_backend",
    "open_rows",
    "partition",
    "resolve_source",
    "source_record",
]


def as_card(card: Card | str | os.PathLike) -> Card:
    """A card as given, or loaded by shipped name or ``.yaml`` path."""
    return card if isinstance(card, Card) else load_card(card)


def make_backend(
    card: Card, *, model_path: str | None = None, device: str | None = None, servers: list[str] | None = None, batch_size: int | None = None
) -> CaptureBackend:
    """Instantiate the backend a card names (``hf`` in-process, ``sglang`` client); ``batch_size`` is the client's requests in flight."""
    if isinstance(card.backend, HFBackendSection):
        from hs_dataset.capture.hf import HFBackend

        return HFBackend.from_card(card, model_path=model_path, device=device)
    from hs_dataset.capture.sglang.backend import SGLangBackend

    return SGLangBackend.from_card(card, model_path=model_path, servers=servers, batch_size=batch_size)


def dataset_metadata(card: Card, info: CaptureInfo, tokenizer_info: dict[str, Any], source: Any = None) -> DatasetMetadata:
    """The manifest metadata: what every stored tensor means, and where it came from (``source``: as the run was given it)."""
    return DatasetMetadata(
        config_name=card.name,
        config_fingerprint=card.fingerprint,
        model=ModelRecord(path=info.model_path, id=card.model.id, revision=info.model_revision, fingerprint=info.model_fingerprint),
        aux_layer_ids=tuple(info.aux_layer_ids),
        layer_preset=layer_preset_record(card, info),
        layer_convention=HF_HIDDEN_STATES_INDEX,
        final_state=info.final_state,
        final_norm=FinalNorm(kind="rmsnorm", eps=info.final_norm_eps),
        dtype=state_dtype_name(info.dtype),
        hidden_size=info.hidden_size,
        num_hidden_layers=info.num_hidden_layers,
        vocab_size=info.vocab_size,
        tokenizer=TokenizerRecord(
            path=tokenizer_info["path"],
            class_name=tokenizer_info["class"],
            vocab_size=tokenizer_info["vocab_size"],
            fingerprint=tokenizer_info["fingerprint"],
            chat_template_sha256=tokenizer_info["chat_template_sha256"],
        ),
        max_length=card.max_length,
        overflow=card.overflow,
        source=source_record(card, source),
        limits=card.limits.model_dump(mode="json"),
        backend=BackendRecord(name=info.backend, extra=dict(info.backend_details)),
        capture=dict(info.verification),
    )


def layer_preset_record(card: Card, info: CaptureInfo) -> LayerPreset | None:
    """The card's ``layers.preset`` as the manifest records it (None without one), checked against what the backend captures."""
    record = card.layers.preset_record()
    if record is not None and record["ids_from"] == "preset":
        wanted = card.aux_layers_for(info.num_hidden_layers)
        if wanted != list(info.aux_layer_ids):
            raise UsageError(
                f"{card.source_path}: layers.preset {card.layers.preset} gives aux layers {wanted} on the {info.num_hidden_layers}-layer "
                f"model, but the backend captures {list(info.aux_layer_ids)}; open the backend from this card"
            )
    return None if record is None else LayerPreset(name=record["name"], taps=record["taps"], ids_from=record["ids_from"])


def source_record(card: Card, source: Any) -> SourceRecord:
    """Which rows a run reads, as the dataset's identity records it: the source's name and the card's selection.

    A local path is recorded by its last component (the data, not where it lies: a moved
    source resumes); ``hf:``, ``builtin:`` and URLs as given; rows from Python as ``<TYPE>``.
    """
    given = source if source is not None else card.source.path
    if isinstance(given, (str, os.PathLike)):
        text = os.fspath(given)
        name = text if text.startswith(("hf:", "builtin:")) or "://" in text else Path(text.rstrip("/")).name
    else:
        name = f"<{type(given).__name__}>"
    src = card.source
    return SourceRecord(name=name, subset=src.subset, split=src.split, revision=src.revision, columns=dict(src.columns))


def resolve_source(card: Card, source: Any) -> Any:
    """The source given, else the card's (``builtin:conversations``: the bundled file)."""
    if source is not None:
        return source
    path = card.source.path
    if path == "builtin:conversations":
        from hs_dataset.sources import bundled_conversations_path

        return bundled_conversations_path()
    if not path:
        raise UsageError(f"config {card.name!r} names no source data: pass --source PATH (JSONL or a saved datasets directory)")
    return path


def open_rows(card: Card, source: Any) -> RowSource:
    """The source as rows: ``hf:`` names and saved splits take the card's subset/split/revision/streaming."""
    from hs_dataset.sources import open_source
    from hs_dataset.sources.iterate import line_byte_cap

    src = card.source
    hub = {"subset": src.subset, "split": src.split, "revision": src.revision, "streaming": src.streaming}
    return open_source(source, max_line_bytes=line_byte_cap(card.max_length), hub=hub)


def partition(samples: Iterable[TokenizedSample], rank: int, world_size: int) -> Iterator[TokenizedSample]:
    """Deterministic split of the source order across ranks: sample k goes to rank k % world_size."""
    for k, sample in enumerate(samples):
        if k % world_size == rank:
            yield sample


def limit_samples(samples: Iterable[TokenizedSample], n: int | None) -> Iterator[TokenizedSample]:
    """The first ``n`` samples (all when None)."""
    for k, sample in enumerate(samples):
        if n is not None and k >= n:
            return
        yield sample


class CaptureSession:
    """One run's view of a card: backend, tokenizer, metadata and the sample stream, opened once.

    ``card`` is the card with the run's card settings applied (batch size, shard size,
    storage, paths): everything downstream reads them from it. The manifest metadata
    records the card as given, since run settings do not change which dataset this is.
    A backend passed in is the caller's to close; one the session made is closed by
    :meth:`close` (or leaving the ``with`` block).
    """

    def __init__(self, card: Card, options: RunOptions, *, backend: CaptureBackend | None = None) -> None:
        self.card = options.apply_to(card)
        self.num_samples = options.num_samples
        self.source = resolve_source(card, options.source)
        self._own_backend = backend is None
        self.backend: CaptureBackend | None = backend or make_backend(self.card)
        try:
            self.info = self.backend.info()
            directory = Path(self.info.model_path)
            self.tokenizer = load_card_tokenizer(self.card, directory)
            self.metadata = dataset_metadata(card, self.info, tokenizer_info(self.tokenizer, directory), options.source)
        except BaseException:
            self.close()
            raise

    def open_rows(self) -> RowSource:
        """The source's rows, opened anew (one pass)."""
        return open_rows(self.card, self.source)

    def samples(
        self,
        rows: RowSource,
        *,
        report: SourceReport | None = None,
        strict: bool = False,
        rank: int = 0,
        world_size: int = 1,
        depth: int = 0,
    ) -> Iterator[TokenizedSample]:
        """The tokenized samples of ``rows`` under the card's rules, the first ``num_samples``, this rank's share.

        ``depth`` > 0 tokenizes that many samples ahead on a thread (``read_ahead``).
        """
        card = self.card
        rules = SampleRules(
            max_length=card.max_length,
            overflow=card.overflow,
            strict=strict,
            vocab_size=self.info.vocab_size,
            columns=card.source.columns,
            keep_conversation=card.regenerate.enabled,
            limits=card.limits,
            template_source=f"the chat template {card.model.chat_template} (model.chat_template)" if card.model.chat_template else None,
        )
        samples = iter_samples(rows, self.tokenizer, rules, report=report)
        return read_ahead(partition(limit_samples(samples, self.num_samples), rank, world_size), depth=depth)

    def close(self) -> None:
        """Close the backend the session made (a backend passed in is the caller's)."""
        if self._own_backend and self.backend is not None:
            self.backend.close()
            self.backend = None

    def __enter__(self) -> CaptureSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
