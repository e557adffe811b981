"""Per-run settings of a build or a stream: validated, frozen, unknown keys refused.

A card says what a dataset is; these say how one run makes it (how many samples, from
which source, on which device or servers). The settings that are also card fields
(batch size, shard size, storage, model path, device, servers) are applied to the card
once (:meth:`RunOptions.apply_to`), so everything downstream reads them from the card.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from hs_dataset.config.card import Card
from hs_dataset.config.remote import RemoteOptions
from hs_dataset.config.sections import MAX_SHARD_BYTES, StorageName
from hs_dataset.errors import UsageError

__all__ = ["BuildOptions", "RunOptions", "StreamOptions", "parse_options"]

Options = TypeVar("Options", bound="RunOptions")


def _path_text(value: Any) -> Any:
    """A path object becomes its text (the card's ``model.path`` is a string)."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


class RunOptions(BaseModel):
    """What a build and a stream both take besides the card (validated; unknown keys refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_samples: int | None = Field(None, ge=0, description="Use only the first N samples of the source.")
    source: Any = Field(
        None, description="What iter_samples reads (a path, hf:NAME, a datasets.Dataset, a list of rows); default: the card's source."
    )
    batch_size: int | None = Field(
        None,
        gt=0,
        description="Samples per forward (hf) or samples handed to the client per step (sglang); default: the card's backend.batch_size.",
    )
    model_path: Annotated[str | None, BeforeValidator(_path_text)] = Field(
        None, description="Local model snapshot; default: the card's model.path."
    )
    device: str | None = Field(None, description="hf backend: the torch device; default: the card's backend.device.")
    servers: list[str] | None = Field(None, description="sglang backend: server URLs; default: the card's backend.urls.")
    shard_bytes: int | None = Field(None, gt=0, le=MAX_SHARD_BYTES, description="Target shard size; default: the card's shards.bytes.")
    storage: StorageName | None = Field(None, description="State encoding on disk (as the card's shards.storage); default: the card's.")

    def apply_to(self, card: Card) -> Card:
        """``card`` with the settings given here that are card fields (a backend ignores the other backend's)."""
        backend = self._backend_fields(card.backend.name)
        shards = {key: value for key, value in (("bytes", self.shard_bytes), ("storage", self.storage)) if value}
        model = {"path": self.model_path} if self.model_path else {}
        overrides = {key: value for key, value in (("backend", backend), ("shards", shards), ("model", model)) if value}
        return card.with_overrides(**overrides) if overrides else card

    def _backend_fields(self, name: str) -> dict[str, Any]:
        fields: dict[str, Any] = {"batch_size": self.batch_size} if self.batch_size else {}
        if self.device and name == "hf":
            fields["device"] = self.device
        if self.servers and name == "sglang":
            fields["urls"] = list(self.servers)
        return fields

    def settings(self) -> dict[str, Any]:
        """The fields as keywords (values as given, not copied): what a caller passes on to another options model."""
        return {name: getattr(self, name) for name in type(self).model_fields}


class BuildOptions(RunOptions):
    """What :func:`hs_dataset.pipeline.build.build_dataset` takes besides the card and the output directory."""

    rank: int = Field(0, description="This process's part of the source: sample k goes to rank k % world_size.")
    world_size: int = Field(1, description="Number of ranks.")
    strict: bool = Field(False, description="Stop at the first malformed source row instead of reporting it.")
    progress: bool = Field(False, description="Show a progress bar.")
    writer_threads: int = Field(2, description="Background threads that write shards.")
    remote: RemoteOptions = Field(default_factory=RemoteOptions, description="An output URL: where it is staged, how often uploaded.")
    command: str | None = Field(
        None,
        max_length=16_384,
        description="The command line that resumes this build, recorded in the manifest; default: an equivalent `hs-dataset build` line.",
    )

    @model_validator(mode="after")
    def _rank_in_range(self) -> BuildOptions:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={self.rank} world_size={self.world_size}")
        return self


class StreamOptions(RunOptions):
    """What :func:`hs_dataset.streaming.stream.stream` takes besides the card.

    ``shard_bytes`` is the cache's shard size here; default min(card's, max_cache_bytes / 8).
    """

    cache_dir: Path = Field(description="The cache: a dataset directory (created, or resumed if it holds this card's data).")
    max_cache_bytes: int = Field(gt=0, description="Bytes the cache directory may hold on disk, every file counted.")
    final_alignment: Literal["next", "current"] = Field("next", description="As training.shift_sample.")
    on_failure: Literal["raise", "skip"] = Field(
        "raise", description="A sample the server cannot capture: one CaptureError, or counted and skipped."
    )

    def _backend_fields(self, name: str) -> dict[str, Any]:
        """As a build's, and the stream's batch size is also the sglang client's requests in flight."""
        fields = super()._backend_fields(name)
        if self.batch_size and name == "sglang":
            fields["concurrency"] = self.batch_size
        return fields


def parse_options(model: type[Options], caller: str, values: Mapping[str, Any]) -> Options:
    """``values`` validated into ``model``; the first problem becomes one :class:`UsageError` naming the option."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise UsageError(_problem(exc.errors()[0], model, caller)) from None


def _problem(err: Mapping[str, Any], model: type[RunOptions], caller: str) -> str:
    name = ".".join(str(p) for p in err["loc"]) or "options"
    if err["type"] == "extra_forbidden":
        return f"{caller}: unknown option {name!r}; known options: {', '.join(sorted(model.model_fields))}"
    if err["type"] == "value_error" and not err["loc"]:
        return str(err["ctx"]["error"])
    return f"{caller}: {name}: {err['msg']} (got {str(err.get('input'))[:80]}); see {model.__module__}.{model.__name__}"
