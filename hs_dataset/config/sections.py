"""The card's sections: one typed, frozen pydantic model per YAML section, every key described.

Every section refuses unknown keys and does not coerce types (``"512"`` is not 512).
The field descriptions are the one place the card schema is written down:
docs/CARDS.md is rendered from them (scripts/render_card_docs.py).
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from hs_dataset.codecs.registry import ENCODINGS, STORAGE_VALUES
from hs_dataset.dtypes import STATE_DTYPES
from hs_dataset.layer_presets import DEFAULT_TAPS, PRESET_NAMES, TAPPED_PRESETS, preset_aux_layers
from hs_dataset.server_patch.contract.mechanism import AUTO, CARD_CHOICES, Mechanism

__all__ = [
    "LAYER_CONVENTION",
    "MAX_SHARD_BYTES",
    "BackendSection",
    "DatasetCardSection",
    "HFBackendSection",
    "LayersSection",
    "LimitsSection",
    "ModelSection",
    "RegenerateSection",
    "SGLangBackendSection",
    "SGLangServerSection",
    "Section",
    "ShardsSection",
    "SourceSection",
    "StagingSection",
    "StateDtypeName",
    "StorageName",
]

LAYER_CONVENTION = "hf_hidden_states_index"
MAX_SHARD_BYTES = 4 * 1024**3 - 1  # shards stay < 4 GiB (32-bit offsets in some readers)

StateDtypeName = Literal[STATE_DTYPES]  # type: ignore[valid-type]  # one list: hs_dataset.dtypes
PresetName = Literal[PRESET_NAMES]  # type: ignore[valid-type]  # one list: hs_dataset.layer_presets
MechanismChoice = Literal[CARD_CHOICES]  # type: ignore[valid-type]  # one list: server_patch.contract.mechanism.Mechanism


def _scalar_to_str(value: Any) -> Any:
    """Numbers in ``env``/``args`` become strings (YAML reads ``4`` as an int); the rest is checked as is."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _one_to_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


CommandWord = Annotated[str, BeforeValidator(_scalar_to_str)]


class Section(BaseModel):
    """Every card section: unknown keys refused, immutable, no type coercion (``"512"`` is not 512)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelSection(Section):
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


class LayersSection(Section):
    """Which hidden states are captured, and what the indexes mean: explicit `aux` ids, or a drafter family's `preset`
    derived from the model's layer count (the preset table below says each rule and where it comes from)."""

    convention: Literal["hf_hidden_states_index"] = Field(
        LAYER_CONVENTION,
        description="How `aux` is counted: indexes into transformers' `output_hidden_states` tuple "
        "(`hidden_states[0]` = embedding output, `hidden_states[i]` = output of decoder layer `i-1`). The only value.",
    )
    preset: PresetName | None = Field(  # type: ignore[valid-type]
        None,
        description="A drafter family whose layers are derived from the model's layer count L when the capture starts "
        f"(one of {', '.join(f'`{n}`' for n in PRESET_NAMES)}; `eagle3` also serves Eagle 3.1, `mtp` captures the final state "
        "only). The manifest records the preset and the ids it gave. Default null: `aux` names the layers.",
    )
    taps: int | None = Field(
        None,
        ge=1,
        description=f"How many layers a DFlash-family preset ({', '.join(f'`{n}`' for n in TAPPED_PRESETS)}) taps. "
        f"Default null: {DEFAULT_TAPS}, as the published recipes.",
    )
    aux: list[int] | None = Field(
        None,
        description="The aux layers as HF `hidden_states` indexes, e.g. `[2, 30, 58]` for Kimi-K2.5; `[]` captures the final "
        "state only (an MTP dataset). Wins over `preset`. Default null: the preset's layers (one of the two is required).",
        json_schema_extra={"constraint": "ascending, distinct, each >= 0"},
    )
    final: Literal["pre_norm", "post_norm"] = Field(
        "pre_norm",
        description="The final state the config asks for: `pre_norm` (input of the final norm, what speculators trains on) "
        "or `post_norm` (what SpecForge trains on). Captures store the pre-norm state plus the norm's weight and eps, "
        "from which the post-norm state is derived exactly. Default `pre_norm`.",
    )

    @field_validator("aux")
    @classmethod
    def _ascending_indexes(cls, aux: list[int] | None) -> list[int] | None:
        if aux is None:
            return aux
        if aux and min(aux) < 0:
            raise ValueError(f"must be HF hidden_states indexes >= 0 (0 is the embedding output), got {aux}")
        if any(b <= a for a, b in itertools.pairwise(aux)):
            raise ValueError(f"must be ascending distinct HF hidden_states indexes, got {aux}")
        return aux

    @model_validator(mode="after")
    def _ids_or_preset(self) -> LayersSection:
        if self.aux is None and self.preset is None:
            raise ValueError(
                f"name the captured layers: `aux: [2, 30, 58]` (HF hidden_states indexes) or `preset: NAME` ({', '.join(PRESET_NAMES)})"
            )
        if self.taps is not None and self.preset not in TAPPED_PRESETS:
            raise ValueError(f"taps applies to the presets {', '.join(TAPPED_PRESETS)} only, not to preset {self.preset}; drop it")
        return self

    def resolve(self, num_layers: int) -> list[int]:
        """The aux ids (HF ``hidden_states`` indexes) captured on a ``num_layers``-layer model: ``aux``, else the preset's."""
        if self.aux is not None:
            return list(self.aux)
        try:
            return preset_aux_layers(str(self.preset), num_layers, self.taps)
        except ValueError as exc:
            raise ValueError(f"layers.preset {self.preset}: {exc}") from None

    def preset_record(self) -> dict[str, Any] | None:
        """What the manifest records of the preset: its name, its taps and whether explicit ``aux`` overrode it."""
        if self.preset is None:
            return None
        taps = (self.taps or DEFAULT_TAPS) if self.preset in TAPPED_PRESETS else None
        return {"name": self.preset, "taps": taps, "ids_from": "aux" if self.aux is not None else "preset"}


class SourceSection(Section):
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
        None,
        description="`hf:` sources (and saved `DatasetDict`s): the split to read (`--split`, e.g. `train_sft`). Default null: `train`.",
    )
    revision: str | None = Field(
        None, description="`hf:` sources: branch, tag or commit of the dataset repo (`--revision`). Default null: main."
    )
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


SLOWEST_DECODE_TOKENS_PER_S = 5.0  # one request's decode rate the default generation timeout allows for


class RegenerateSection(Section):
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
        None,
        ge=1,
        description="Regenerate at most this many assistant turns per conversation; the conversation ends after the last one. Default null: all.",
    )
    policy: Literal["keep", "drop"] = Field(
        "keep",
        description="A turn that hit `max_new_tokens`, came back empty or failed: `keep` the conversation up to "
        "and including it (failed turns end it before), or `drop` the whole conversation. Counted either way. Default `keep`.",
    )
    concurrency: int | None = Field(
        None,
        ge=1,
        description="SGLang: the most generation requests in flight, all servers together; the number kept in flight is what the "
        "servers report they run at once (max running requests, KV cache / `max_new_tokens`), at most this. HF: conversations "
        "per batch. Default null: the servers' figure (HF: 16).",
    )
    capture: Literal["auto", "one_pass", "prefill"] = Field(
        "auto",
        description="SGLang: how regenerated conversations are captured. `one_pass`: their states are kept while the server "
        "generates them (prompt rows from the prefill generation runs anyway, one row per decode step), so no token is "
        "prefilled again; refused where a server cannot. `prefill`: each finished conversation is sent back as a second "
        "prefill. Default `auto`: one pass where every server reports it can, else prefill with one line saying why. "
        "Either way the stored sample is the last turn's prompt and answer, token for token what the server saw.",
    )
    request_timeout_s: float | None = Field(
        None,
        gt=0,
        description="SGLang: seconds one generation request may take. An answer of `max_new_tokens` decodes for minutes on a "
        "loaded server, so the capture requests' `backend.request_timeout_s` is too short for it. Default null: "
        "`backend.request_timeout_s` + `max_new_tokens` / 5 (an answer decoding at 5 tokens/s or faster ends in time).",
    )

    def generation_timeout_s(self, request_timeout_s: float) -> float:
        """Seconds one generation request may take, given the backend's per-request timeout (the default's base)."""
        if self.request_timeout_s is not None:
            return self.request_timeout_s
        return request_timeout_s + self.max_new_tokens / SLOWEST_DECODE_TOKENS_PER_S


class LimitsSection(Section):
    """Per-row and per-template bounds that keep memory and time set by the card, not by the input (docs/LIMITS.md)."""

    row_turns: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="Most messages a conversation row may have; a longer row is skipped and counted `oversized`. Default 1024.",
    )
    row_chars: int | None = Field(
        None,
        ge=1,
        le=1 << 32,
        description="Most characters of text (every string of the row together) before anything is expanded; a longer row is "
        "skipped and counted `oversized`. Default null: the JSONL line cap, `max(16 MiB, 64 * max(65536, 16 * max_length))`.",
    )
    row_depth: int = Field(
        64,
        ge=8,
        le=512,
        description="Deepest nesting of lists and objects in a row (tool-call arguments and tool schemas included); "
        "a deeper row is skipped and counted `oversized`. Default 64.",
    )
    template_chars: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        le=1 << 28,
        description="Most characters a chat template may render for one row (and the largest "
        "string or list one template operation may build; a render may build twice this in all); over it the row is skipped and "
        "counted `oversized`. A render is also refused, before it is tokenized, past 4 times the row character cap (what "
        "`max_length` tokens can use). Default 16777216.",
    )
    template_seconds: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="Seconds a chat template may take for one row, all of its renders together (a regenerated "
        "row renders once or twice per turn); over it the row is skipped and counted `oversized`. Default 5.",
    )
    template_failures: int = Field(
        8,
        ge=1,
        le=1_000_000,
        description="Rows in a row that may fail in the chat template the same way, before any row got "
        "through it, until the build stops naming the template (a broken template would otherwise cost every row its "
        "`template_seconds` and write nothing). Default 8.",
    )


class HFBackendSection(Section):
    """In-process transformers capture (`name: hf`)."""

    name: Literal["hf"] = Field(description="Selects this backend.")
    device: str = Field(
        "auto",
        description="Torch device: `auto` (CUDA when present, else CPU), `cpu`, `cuda`, `cuda:N`. `--device` overrides it. Default `auto`.",
    )
    batch_size: int = Field(1, gt=0, description="Samples per forward pass (`--batch-size` overrides it). Default 1.")


class SGLangBackendSection(Section):
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
    retries: int = Field(
        2, ge=0, description="Extra attempts per sample for retryable failures (server errors, timeouts, staging full). Default 2."
    )
    backoff_s: float = Field(0.5, ge=0, description="First back-off between retries in seconds; doubles per attempt. Default 0.5.")
    max_new_tokens: Literal[0, 1] = Field(
        1, description="Tokens generated per request: 1 (safest) or 0 (prefill only; not with speculative decoding). Default 1."
    )
    allow_radix_cache: bool = Field(
        False,
        description="Accept a server whose prefix cache is on (prompts that hit it are refused by the server and reported as failures). Default false.",
    )
    force_full_prefill: bool | None = Field(
        None,
        description="Send `return_logprob` with `logprob_start_len=0` so SGLang recomputes every prompt token even with the "
        "prefix cache on (costs logits for every prompt token). Default null: on for servers whose prefix cache is on "
        "(a regeneration server keeps it on), off elsewhere.",
    )
    staging_dir: str | None = Field(
        None,
        description="Where the server's dumps appear. Default null: `sglang.staging.dir` for a single server, else what each server reports.",
    )
    endpoint_cooldown_s: float = Field(
        5.0, ge=0, description="Seconds a failing server stays out of rotation (grows with repeated failures). Default 5."
    )
    max_response_bytes: int = Field(
        16 * 1024 * 1024,
        ge=4096,
        le=1024**3,
        description="Largest HTTP answer body read from a server (`/server_info`, `/generate`), read in bounded chunks; a larger "
        "one is refused. Default 16777216 (16 MiB).",
    )


BackendSection = Annotated[HFBackendSection | SGLangBackendSection, Field(discriminator="name")]


# ``shards.storage`` values and the CLIs' choices: the codec registry's (hs_dataset.codecs.registry)
StorageName = Literal[STORAGE_VALUES]  # type: ignore[valid-type]
_STORAGE_DOC = "; ".join(f"`{e.storage}` ({e.summary}; full name `{e.name}`)" for e in ENCODINGS.values() if e.storage)


class ShardsSection(Section):
    """How the captured states are laid out on disk."""

    bytes: int = Field(
        2 * 1024**3,
        gt=0,
        le=MAX_SHARD_BYTES,
        description="Target shard size in bytes (`--shard-bytes` overrides it). Default 2147483648 (2 GiB).",
    )
    storage: StorageName = Field(
        "native",
        description=f"State encoding on disk: `native` (the capture dtype); {_STORAGE_DOC}. See docs/FORMAT.md for their "
        "errors. `--storage` overrides it. Default `native`.",
    )


class DatasetCardSection(Section):
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


class StagingSection(Section):
    """The server's private directory of per-request dumps and its limits (see docs/SGLANG.md)."""

    dir: str | None = Field(
        None, description="Staging directory (`--staging-dir` overrides it). Default null: `/dev/shm/hs_dataset-<uid>/<host>-<port>`."
    )
    max_bytes: int | None = Field(
        None, ge=1, description="Bytes of dumps waiting for the client before new ones are refused. Default null: 16 GiB."
    )
    max_files: int | None = Field(
        None, ge=1, description="Dump files waiting for the client before new ones are refused. Default null: 4096."
    )
    max_wait_s: float | None = Field(
        None,
        ge=0,
        description="Seconds one forward pass may wait, in total, for staging room or pinned memory before its dumps are refused. Default null: 2.0.",
    )
    writer_threads: int | None = Field(
        None,
        ge=1,
        description="Threads writing dumps off the forward path (each dump one `writev` from its pinned buffer). Default null: 4.",
    )
    pinned_pool_bytes: int | None = Field(
        None,
        ge=0,
        description="Host memory for the capture copies, in bytes: pinned for device-to-host copies, plain on a CPU server. Default null: 2 GiB.",
    )
    orphan_ttl_s: float | None = Field(
        None, gt=0, description="Seconds after which unclaimed dumps and temporaries are deleted. Default null: 3600."
    )
    rid_prefix: str | None = Field(
        None, pattern=r"^hs-[A-Za-z0-9-]*$", description="Request-id prefix whose requests are captured. Default null: `hs-`."
    )


class SGLangServerSection(Section):
    """How `hs-dataset serve` starts the SGLang capture server."""

    python: str | None = Field(
        None,
        description="Server interpreter; a relative path with a `/` is relative to the repository. `--python` overrides it. "
        "Default null: `$HS_SGLANG_PYTHON` or `<repo>/.sglang-venv/bin/python`.",
    )
    device: Literal["cuda", "cpu"] = Field(
        "cuda", description="`cuda`, or `cpu` for CPU test servers (adds the CPU support files). Default `cuda`."
    )
    tp: int = Field(1, ge=1, description="Tensor-parallel size (`--tp-size`). Default 1.")
    host: str = Field("127.0.0.1", description="Listen address (`--host` overrides it). Default `127.0.0.1`.")
    port: int = Field(30000, ge=1, le=65535, description="Listen port (`--port` overrides it). Default 30000.")
    module_path: str | None = Field(
        None, description="Decoder-stack module the hooks attach to. Default null: `model.text_module`, else `model`."
    )
    mechanism: MechanismChoice = Field(
        AUTO,
        description="How aux states leave the server: `auto` (the first of these the installed SGLang supports), "
        + ", ".join(f"`{m}` ({m.summary})" for m in Mechanism)
        + "; one the installed SGLang lacks is refused, naming the one it has. Default `auto`.",
    )
    radix_cache: bool | None = Field(
        None,
        description="Keep SGLang's prefix cache on. Default null: on for a regeneration server (`regenerate.enabled`, "
        "`serve --regenerate`) unless `regenerate.capture` is `prefill`, as a server for generation alone runs (later turns "
        "prefill only what the cache lacks; one-pass capture keeps what each pass computes); off elsewhere "
        "(`--disable-radix-cache`: every capture prompt computed whole).",
    )

    def keeps_radix_cache(self, regenerate: RegenerateSection) -> bool:
        """Whether the server keeps its prefix cache (see ``radix_cache``)."""
        if self.radix_cache is not None:
            return self.radix_cache
        return regenerate.enabled and regenerate.capture != "prefill"

    chunked_prefill_size: int | None = Field(
        None,
        gt=0,
        description="`--chunked-prefill-size`; chunks of a long prompt are assembled into one dump. Default null: SGLang's default.",
    )
    startup_timeout_s: float = Field(900.0, gt=0, description="Seconds to wait for `/health` after starting. Default 900.")
    env: dict[str, CommandWord] = Field(
        default_factory=dict, description="Extra environment variables for the server (numbers become strings). Default none."
    )
    args: list[CommandWord] = Field(
        default_factory=list,
        description="Extra SGLang command-line arguments (numbers become strings); `-- ARGS` on the command line adds more. Default none.",
    )
    staging: StagingSection = Field(
        default_factory=StagingSection, description="The dump staging directory and its limits (section below)."
    )
    architectures: list[str] | None = Field(
        None, description="Model architectures, only used when the model directory has no readable config.json. Default null."
    )
    num_hidden_layers: int | None = Field(
        None, gt=0, description="Decoder layers, only used when the model directory has no readable config.json. Default null."
    )
