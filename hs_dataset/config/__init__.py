"""Builder configs ("cards"): one YAML file per config, validated into typed, frozen models.

Cards live in the repository's ``cards/`` folder, which installs as the
``hs_dataset.cards`` package. A card names the model, the aux layers (as HF
``hidden_states`` indexes), the final-state kind, dtype, length policy, source
data, backend settings, shard size, dataset-card metadata and the SGLang server.
Every key is declared here with its meaning; an unknown key, a wrong type or a value
out of range is refused with a :class:`CardError` naming the file, the key path and
the fix, instead of being silently ignored. docs/CARDS.md is rendered from these
models (scripts/render_card_docs.py). :attr:`Card.fingerprint` hashes the
normalised card so the manifest can prove which config produced a dataset.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.resources
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from hs_dataset.dtypes import STATE_DTYPES
from hs_dataset.errors import HsDatasetError

__all__ = [
    "Card",
    "CardError",
    "ModelSection",
    "LayersSection",
    "SourceSection",
    "RegenerateSection",
    "HFBackendSection",
    "SGLangBackendSection",
    "BackendSection",
    "ShardsSection",
    "DatasetCardSection",
    "StagingSection",
    "SGLangServerSection",
    "load_card",
    "list_cards",
    "card_from_dict",
    "DOCS_HINT",
]

LAYER_CONVENTION = "hf_hidden_states_index"
MAX_SHARD_BYTES = 4 * 1024**3 - 1  # shards stay < 4 GiB (32-bit offsets in some readers)
DOCS_HINT = "every key is documented in docs/CARDS.md"

StateDtypeName = Literal[STATE_DTYPES]  # type: ignore[valid-type]  # one list: hs_dataset.dtypes


class CardError(HsDatasetError, ValueError):
    """A card is missing, malformed or inconsistent; the message names the file, the key and the fix."""


def _scalar_to_str(value: Any) -> Any:
    """Numbers in ``env``/``args`` become strings (YAML reads ``4`` as an int); the rest is checked as is."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _one_to_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


CommandWord = Annotated[str, BeforeValidator(_scalar_to_str)]


class _Section(BaseModel):
    """Every card section: unknown keys refused, immutable, no type coercion (``"512"`` is not 512)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# ---------------------------------------------------------------------------- sections
class ModelSection(_Section):
    """The target model whose hidden states are captured."""

    path: str | None = Field(
        None,
        description="Local snapshot directory (holding config.json), or `builtin:NAME` for a model built on first use "
        "(`builtin:tiny-deepseek-v3`). null: pass `--model-path` or set `HS_DATASET_MODEL_PATH`; hs_dataset never downloads weights.",
    )
    id: str | None = Field(
        None,
        description="Hub repository id (e.g. `moonshotai/Kimi-K2.5`), recorded in the manifest; `hs-dataset serve` "
        "falls back to it as the model path when no path is given.",
    )
    revision: str | None = Field(None, description="Model revision (branch, tag or commit), recorded in the manifest. Default null.")
    text_module: str | None = Field(
        None,
        description="Dotted path of the decoder stack (the module with `embed_tokens`, `layers`, `norm`), e.g. "
        "`language_model.model` for Kimi-K2.5. Default null: auto-detected (hf) or `model` (serve).",
    )
    trust_remote_code: bool = Field(
        False,
        description="Run the Python code a snapshot ships (`auto_map`: Kimi-K2.5's tiktoken tokenizer, its processor) when "
        "loading its tokenizer, config or model, and pass `--trust-remote-code` to SGLang. Only for snapshots you trust. "
        "`--trust-remote-code` overrides it. Default false: a snapshot that needs remote code is refused by name.",
    )
    chat_template: str | None = Field(
        None,
        description="A Jinja file rendering the conversations instead of the tokenizer's own chat template "
        "(`--chat-template FILE` overrides it). Default null: the tokenizer's own template.",
    )


class LayersSection(_Section):
    """Which hidden states are captured, and what the indexes mean."""

    convention: Literal["hf_hidden_states_index"] = Field(
        LAYER_CONVENTION,
        description="How `aux` is counted: indexes into transformers' `output_hidden_states` tuple "
        "(`hidden_states[0]` = embedding output, `hidden_states[i]` = output of decoder layer `i-1`). The only value.",
    )
    aux: list[int] = Field(
        description="The EAGLE-3 aux layers as HF `hidden_states` indexes, e.g. `[2, 30, 58]` for Kimi-K2.5. Required.",
        json_schema_extra={"constraint": "non-empty, ascending, distinct, each >= 0"},
    )
    final: Literal["pre_norm", "post_norm"] = Field(
        "pre_norm",
        description="The final state the config asks for: `pre_norm` (input of the final norm, what speculators trains on) "
        "or `post_norm` (what SpecForge trains on). Captures store the pre-norm state plus the norm's weight and eps, "
        "from which the post-norm state is derived exactly. Default `pre_norm`.",
    )

    @field_validator("aux")
    @classmethod
    def _ascending_indexes(cls, aux: list[int]) -> list[int]:
        if not aux:
            raise ValueError("must list at least one HF hidden_states index, e.g. [2, 3, 4]")
        if min(aux) < 0:
            raise ValueError(f"must be HF hidden_states indexes >= 0 (0 is the embedding output), got {aux}")
        if any(b <= a for a, b in zip(aux, aux[1:])):
            raise ValueError(f"must be ascending distinct HF hidden_states indexes, got {aux}")
        return aux


class SourceSection(_Section):
    """Where the conversations (or pre-tokenized rows) come from."""

    kind: str = Field(
        "conversations",
        description="What the rows hold, for readers of the card (`conversations`); rows are recognised one by one "
        "(chat messages or pre-tokenized `input_ids`), see docs/SOURCES.md. Default `conversations`.",
    )
    path: str | None = Field(
        None,
        description="A JSONL file, a saved `datasets` directory, or `builtin:conversations` (the bundled 42 "
        "conversations). null: pass `--source PATH`.",
    )
    subset: str | None = Field(
        None, description="`hf:` sources: the dataset's config (subset) name (`--subset`). Default null: the dataset's default."
    )
    split: str | None = Field(
        None, description="`hf:` sources (and saved `DatasetDict`s): the split to read (`--split`, e.g. `train_sft`). Default null: `train`."
    )
    revision: str | None = Field(None, description="`hf:` sources: branch, tag or commit of the dataset repo (`--revision`). Default null: main.")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Our field name -> the source's column name, for sources that name them differently "
        "(`--columns messages=dialog`). Fields: `messages`, `conversations`, `prompt`, `response`, `system`, `tools`, "
        "`id`, `input_ids`, `loss_mask`. Default none.",
    )
    streaming: bool = Field(
        True,
        description="`hf:` sources: stream rows instead of downloading the whole split first (the local cache is used "
        "when offline). Default true.",
    )


class RegenerateSection(_Section):
    """Regenerate every assistant turn with the target model before capture (`--regenerate`); see docs/SOURCES.md."""

    enabled: bool = Field(False, description="Regenerate assistant turns before capture (`--regenerate` sets it). Default false.")
    max_new_tokens: int = Field(512, gt=0, description="Most tokens the model may write per assistant turn. Default 512.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature; 0 is greedy. Default 0.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (with temperature > 0). Default 1.")
    seed: int = Field(0, ge=0, description="Sampling seed (with temperature > 0), so a rerun writes the same turns. Default 0.")
    thinking: Literal["on", "off"] | None = Field(
        None,
        description="For templates with a thinking switch (`thinking` template variable): `on` or `off`. "
        "Default null: the template's default.",
    )
    turns: int | None = Field(
        None, ge=1, description="Regenerate at most this many assistant turns per conversation; the conversation ends after the last one. Default null: all."
    )
    policy: Literal["keep", "drop"] = Field(
        "keep",
        description="A turn that hit `max_new_tokens`, came back empty or failed: `keep` the conversation up to "
        "and including it (failed turns end it before), or `drop` the whole conversation. Counted either way. Default `keep`.",
    )
    concurrency: int = Field(16, ge=1, description="Conversations regenerated together (SGLang: requests in flight; HF: batch rows). Default 16.")


class HFBackendSection(_Section):
    """In-process transformers capture (`name: hf`)."""

    name: Literal["hf"] = Field(description="Selects this backend.")
    device: str = Field(
        "auto",
        description="Torch device: `auto` (CUDA when present, else CPU), `cpu`, `cuda`, `cuda:N`. `--device` overrides it. Default `auto`.",
    )
    batch_size: int = Field(1, gt=0, description="Samples per forward pass (`--batch-size` overrides it). Default 1.")


class SGLangBackendSection(_Section):
    """Capture through hs_dataset-enabled SGLang servers (`name: sglang`); see docs/SGLANG.md."""

    name: Literal["sglang"] = Field(description="Selects this backend.")
    urls: list[str] = Field(
        default_factory=list,
        description="Server URLs (`http://host:port`); load is spread over them. Default empty: "
        "`http://{sglang.host}:{sglang.port}`. `--server URL` (repeatable) overrides it.",
    )
    batch_size: int = Field(
        1, gt=0, description="Samples handed to the client per step; requests in flight are max(batch_size, concurrency). Default 1."
    )
    concurrency: int = Field(8, ge=1, description="Requests in flight, all servers together (`--batch-size` overrides it). Default 8.")
    request_timeout_s: float = Field(120.0, gt=0, description="Seconds one HTTP request may take. Default 120.")
    dump_timeout_s: float = Field(60.0, gt=0, description="Seconds to wait for a request's dump file to appear. Default 60.")
    retries: int = Field(2, ge=0, description="Extra attempts per sample for retryable failures (server errors, timeouts, staging full). Default 2.")
    backoff_s: float = Field(0.5, ge=0, description="First back-off between retries in seconds; doubles per attempt. Default 0.5.")
    max_new_tokens: Literal[0, 1] = Field(
        1, description="Tokens generated per request: 1 (safest) or 0 (prefill only; not with speculative decoding). Default 1."
    )
    allow_radix_cache: bool = Field(
        False,
        description="Accept a server whose prefix cache is on (prompts that hit it are refused by the server and reported as failures). Default false.",
    )
    force_full_prefill: bool = Field(
        False,
        description="Send `return_logprob` with `logprob_start_len=0` so SGLang recomputes every prompt token even with the "
        "prefix cache on (costs logits for every prompt token). Default false.",
    )
    staging_dir: str | None = Field(
        None,
        description="Where the server's dumps appear. Default null: `sglang.staging.dir` for a single server, else what each server reports.",
    )
    endpoint_cooldown_s: float = Field(
        5.0, ge=0, description="Seconds a failing server stays out of rotation (grows with repeated failures). Default 5."
    )


BackendSection = Annotated[Union[HFBackendSection, SGLangBackendSection], Field(discriminator="name")]


class ShardsSection(_Section):
    """How the captured states are laid out on disk."""

    bytes: int = Field(
        2 * 1024**3,
        gt=0,
        le=MAX_SHARD_BYTES,
        description="Target shard size in bytes (`--shard-bytes` overrides it). Default 2147483648 (2 GiB).",
    )
    storage: Literal["native", "fp8", "fp8_e4m3_per_token"] = Field(
        "native",
        description="State encoding on disk: `native` (the capture dtype) or `fp8` (float8 e4m3 plus a float32 scale per "
        "token, half the bytes of bf16; `fp8_e4m3_per_token` is its full name). `--storage` overrides it. Default `native`.",
    )


class DatasetCardSection(_Section):
    """Front-matter keys of the Hub dataset card written by `hs-dataset push` (see docs/HUB.md)."""

    license: str | None = Field(None, description="Hub license id (`apache-2.0`, `other`, ...). Default null: none written.")
    license_name: str | None = Field(None, description="Name of a custom license (with `license: other`). Default null.")
    license_link: str | None = Field(None, description="Link to a custom license's text (with `license: other`). Default null.")
    pretty_name: str | None = Field(None, description="Human-readable dataset title; also the README's heading. Default null: the repo id.")
    language: Annotated[list[str], BeforeValidator(_one_to_list)] | None = Field(
        None, description="Language codes of the text (`en`, or a list). Default null."
    )
    tags: list[str] | None = Field(
        None, description="Extra Hub tags; `eagle3`, `speculative-decoding`, `hidden-states`, `hs_dataset` are always added. Default null."
    )
    task_categories: list[str] | None = Field(None, description="Hub task categories. Default null.")
    size_categories: list[str] | None = Field(None, description="Hub size categories (`1K<n<10K`, ...). Default null.")

    def front_matter(self) -> dict[str, Any]:
        """The keys this card sets (nulls left out), ready for the README's YAML front matter."""
        return self.model_dump(mode="json", exclude_none=True)


class StagingSection(_Section):
    """The server's private directory of per-request dumps and its limits (see docs/SGLANG.md)."""

    dir: str | None = Field(
        None, description="Staging directory (`--staging-dir` overrides it). Default null: `/dev/shm/hs_dataset-<uid>/<host>-<port>`."
    )
    max_bytes: int | None = Field(None, ge=1, description="Bytes of dumps waiting for the client before new ones are refused. Default null: 16 GiB.")
    max_files: int | None = Field(None, ge=1, description="Dump files waiting for the client before new ones are refused. Default null: 4096.")
    max_wait_s: float | None = Field(None, ge=0, description="Seconds one forward pass may wait, in total, for staging room or pinned memory before its dumps are refused. Default null: 2.0.")
    writer_threads: int | None = Field(None, ge=1, description="Threads writing dumps off the forward path (each dump one `writev` from its pinned buffer). Default null: 4.")
    pinned_pool_bytes: int | None = Field(None, ge=0, description="Host memory for the capture copies, in bytes: pinned for device-to-host copies, plain on a CPU server. Default null: 2 GiB.")
    orphan_ttl_s: float | None = Field(None, gt=0, description="Seconds after which unclaimed dumps and temporaries are deleted. Default null: 3600.")
    rid_prefix: str | None = Field(
        None, pattern=r"^hs-[A-Za-z0-9-]*$", description="Request-id prefix whose requests are captured. Default null: `hs-`."
    )


class SGLangServerSection(_Section):
    """How `hs-dataset serve` starts the SGLang capture server."""

    python: str | None = Field(
        None,
        description="Server interpreter; a relative path with a `/` is relative to the repository. `--python` overrides it. "
        "Default null: `$HS_SGLANG_PYTHON` or `<repo>/.sglang-venv/bin/python`.",
    )
    device: Literal["cuda", "cpu"] = Field("cuda", description="`cuda`, or `cpu` for CPU test servers (adds the CPU support files). Default `cuda`.")
    tp: int = Field(1, ge=1, description="Tensor-parallel size (`--tp-size`). Default 1.")
    host: str = Field("127.0.0.1", description="Listen address (`--host` overrides it). Default `127.0.0.1`.")
    port: int = Field(30000, ge=1, le=65535, description="Listen port (`--port` overrides it). Default 30000.")
    module_path: str | None = Field(
        None, description="Decoder-stack module the hooks attach to. Default null: `model.text_module`, else `model`."
    )
    mechanism: Literal["auto", "aux_return", "layer_hooks"] = Field(
        "auto",
        description="How aux states leave the server: `auto` (what the installed SGLang supports), `aux_return` "
        "(`--enable-return-aux-hidden-states`) or `layer_hooks` (forward hooks on the layers). Default `auto`.",
    )
    radix_cache: bool = Field(False, description="Keep SGLang's prefix cache on. Default false (`--disable-radix-cache`).")
    chunked_prefill_size: int | None = Field(
        None, gt=0, description="`--chunked-prefill-size`; chunks of a long prompt are assembled into one dump. Default null: SGLang's default."
    )
    startup_timeout_s: float = Field(900.0, gt=0, description="Seconds to wait for `/health` after starting. Default 900.")
    env: dict[str, CommandWord] = Field(default_factory=dict, description="Extra environment variables for the server (numbers become strings). Default none.")
    args: list[CommandWord] = Field(
        default_factory=list, description="Extra SGLang command-line arguments (numbers become strings); `-- ARGS` on the command line adds more. Default none."
    )
    staging: StagingSection = Field(default_factory=StagingSection, description="The dump staging directory and its limits (section below).")
    architectures: list[str] | None = Field(
        None, description="Model architectures, only used when the model directory has no readable config.json. Default null."
    )
    num_hidden_layers: int | None = Field(
        None, gt=0, description="Decoder layers, only used when the model directory has no readable config.json. Default null."
    )


# ---------------------------------------------------------------------------- the card
class Card(_Section):
    """A validated builder config: one `cards/NAME.yaml`. Sections are described below."""

    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Config name; a shipped card's name equals its file name. Names the dataset config (Hub folder, manifest). Required.",
    )
    description: str = Field("", description="What this config captures, for people and the Hub dataset card. Default empty.")
    model: ModelSection = Field(description="The target model (section below). Required.")
    layers: LayersSection = Field(description="The captured layers (section below). Required.")
    dtype: StateDtypeName = Field(description="Dtype the states are captured and stored in. Required.")
    max_length: int = Field(4096, gt=0, description="Longest sample in tokens; longer ones follow `overflow`. Default 4096.")
    overflow: Literal["truncate", "drop"] = Field(
        "truncate", description="What happens to a sample longer than `max_length`: cut to it, or left out (and reported). Default `truncate`."
    )
    source: SourceSection = Field(default_factory=SourceSection, description="The source rows (section below).")
    regenerate: RegenerateSection = Field(
        default_factory=RegenerateSection, description="Regenerating assistant turns with the target before capture (section below)."
    )
    backend: BackendSection = Field(description="The capture backend, chosen by `name`: `hf` or `sglang` (sections below). Required.")
    shards: ShardsSection = Field(default_factory=ShardsSection, description="Shard size and storage encoding (section below).")
    dataset_card: DatasetCardSection = Field(default_factory=DatasetCardSection, description="Hub dataset-card metadata (section below).")
    sglang: SGLangServerSection = Field(default_factory=SGLangServerSection, description="The SGLang server for `hs-dataset serve` (section below).")

    _source_path: str = PrivateAttr("<dict>")

    @field_validator("description")
    @classmethod
    def _strip(cls, text: str) -> str:
        return text.strip()

    @property
    def source_path(self) -> str:
        """Where this card came from (a file, ``cards/NAME.yaml``, or ``<dict>``), for error messages."""
        return self._source_path

    @property
    def aux_layer_ids(self) -> list[int]:
        return list(self.layers.aux)

    @property
    def final_state(self) -> str:
        return self.layers.final

    @property
    def fingerprint(self) -> str:
        """sha256 of the normalised card: key order, and stating a default versus leaving it out, do not matter."""
        normal = self.model_dump(mode="json", exclude_defaults=True)
        return hashlib.sha256(json.dumps(normal, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """Every key with its value (defaults filled in), as plain JSON types; :func:`card_from_dict` reads it back."""
        return self.model_dump(mode="json")

    def with_overrides(self, **sections: Any) -> "Card":
        """A new validated card with top-level sections shallow-merged (e.g. ``model={"path": ...}``).

        A mapping (or section model) is merged key by key into the section; anything else
        replaces it. A backend override naming another backend replaces the backend.
        """
        raw = self.to_dict()
        for key, value in sections.items():
            if isinstance(value, BaseModel):
                value = value.model_dump(mode="json", exclude_unset=True)
            old = raw.get(key)
            switches_backend = key == "backend" and isinstance(value, Mapping) and value.get("name", old["name"]) != old["name"]
            if isinstance(value, Mapping) and isinstance(old, dict) and not switches_backend:
                raw[key] = {**old, **value}
            else:
                raw[key] = value
        card = _validated(raw, f"{self.source_path} (with overrides)")
        card._source_path = self.source_path
        return card


# ---------------------------------------------------------------------------- errors
def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> ``X``; ``Annotated[X, ...]`` -> ``X``."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
    return annotation


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _backend_for(annotation: Any, tag: str) -> type[BaseModel] | None:
    """The member of a discriminated union whose ``name`` is ``tag``."""
    for member in typing.get_args(annotation):
        if _is_section(member) and "name" in member.model_fields and tag in typing.get_args(member.model_fields["name"].annotation):
            return member
    return None


def _walk(loc: tuple[Any, ...]) -> tuple[str, type[BaseModel] | None]:
    """An error location -> (dotted key path, the section holding its last key)."""
    path, annotation, holder = "", Card, None
    for part in loc:
        annotation = _unwrap(annotation)
        if _is_section(annotation):
            holder = annotation
            field = annotation.model_fields.get(str(part))
            path = f"{path}.{part}" if path else str(part)
            annotation = field.annotation if field is not None else None
        elif typing.get_origin(annotation) in (Union, types.UnionType) and isinstance(part, str):
            annotation = _backend_for(annotation, part)  # a discriminator tag, not a key
        elif isinstance(part, int):
            path, annotation = f"{path}[{part}]", (typing.get_args(annotation) or (None,))[0]
        else:
            args = typing.get_args(annotation)
            path, annotation = f"{path}.{part}", args[-1] if args else None
    return path or "(top level)", holder


def _got(err: Mapping[str, Any]) -> str:
    value = err.get("input")
    shown = repr(value)
    return f", got {shown if len(shown) <= 80 else shown[:77] + '...'}"


_EXPECTED = {
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string (quote it in YAML)",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be a mapping (a YAML section)",
    "model_type": "must be a mapping (a YAML section)",
    "model_attributes_type": "must be a mapping (a YAML section)",
    "none_required": "must be null",
}


def _problem(err: Mapping[str, Any]) -> str:
    """One pydantic error -> ``key.path: what is wrong; how to fix it``."""
    kind, ctx = err["type"], err.get("ctx") or {}
    path, holder = _walk(tuple(err["loc"]))
    if kind == "extra_forbidden":
        key = str(err["loc"][-1])
        known = sorted(holder.model_fields) if holder is not None else []
        close = difflib.get_close_matches(key, known, n=1)
        fix = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(known)}"
        return f"{path}: unknown key; {fix}"
    if kind == "missing":
        return f"{path}: required key is missing"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tags = ctx.get("expected_tags", "'hf', 'sglang'")
        what = f"unknown backend {ctx['tag']!r}" if kind == "union_tag_invalid" else "missing"
        return f"{path}.name: {what}; use one of {tags}"
    if kind == "value_error":
        return f"{path}: {ctx.get('error', err['msg'])}"
    if kind == "literal_error":
        return f"{path}: must be one of {ctx['expected']}{_got(err)}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
        bound = next(iter(ctx.values()))
        return f"{path}: must be {op} {bound}{_got(err)}"
    if kind == "string_pattern_mismatch":
        return f"{path}: must match {ctx['pattern']}{_got(err)}"
    if kind == "too_short":
        return f"{path}: must not be empty{_got(err)}"
    return f"{path}: {_EXPECTED.get(kind, err['msg'])}{_got(err)}"


def _card_error(exc: ValidationError, where: str) -> CardError:
    problems = list(dict.fromkeys(_problem(err) for err in exc.errors(include_url=False)))
    lines = [f"{where}: {p}" for p in problems]
    return CardError("\n".join(lines) + f"\n({DOCS_HINT})")


# ---------------------------------------------------------------------------- loading
def _validated(raw: Any, where: str) -> Card:
    """Validate a mapping as a card; every problem becomes one :class:`CardError` (never a pydantic error)."""
    if not isinstance(raw, Mapping):
        raise CardError(f"{where}: a card must be a YAML mapping of sections, got {type(raw).__name__}")
    try:
        # Through JSON so that strict types behave the same for YAML and Python input
        # (tuples are lists, YAML dates are strings).
        card = Card.model_validate_json(json.dumps(raw, default=str))
    except ValidationError as exc:
        raise _card_error(exc, where) from None
    card._source_path = where
    return card


def card_from_dict(raw: Mapping[str, Any], where: str = "<dict>") -> Card:
    """Validate a card given as a mapping (e.g. :meth:`Card.to_dict` sent to a worker process as JSON)."""
    return _validated(raw, where)


def _builtin_cards() -> dict[str, Any]:
    root = importlib.resources.files("hs_dataset.cards")
    return {entry.name[: -len(".yaml")]: entry for entry in root.iterdir() if entry.name.endswith(".yaml")}


def list_cards() -> list[str]:
    """Names of the cards shipped with hs_dataset."""
    return sorted(_builtin_cards())


def load_card(name_or_path: str | Path) -> Card:
    """Load a shipped card by name, or any card file by path."""
    path = Path(name_or_path)
    is_file = path.suffix in (".yaml", ".yml")
    if is_file and path.exists():
        text, where = path.read_text(encoding="utf-8"), str(path)
    else:
        cards = _builtin_cards()
        if str(name_or_path) not in cards:
            raise CardError(f"unknown config {str(name_or_path)!r}; available: {', '.join(sorted(cards))} (or pass a path to a .yaml card)")
        entry = cards[str(name_or_path)]
        text, where = entry.read_text(encoding="utf-8"), f"cards/{entry.name}"
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CardError(f"{where}: not valid YAML ({exc})") from None
    card = _validated(raw, where)
    if not is_file and card.name != str(name_or_path):
        raise CardError(f"{where}: name: {card.name!r} must match the file name; write `name: {name_or_path}`")
    return card
