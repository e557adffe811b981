"""The product's spine: source rows -> tokens + loss mask -> capture backend -> shard writer.

``build_dataset`` is what the CLI, the ``datasets`` builder and the tests call. It is
resumable: the writer knows which sample ids are stored, so a rerun after a crash
only captures what is missing. For the in-process backend, batches are fixed
windows of the source order, and a batch is re-captured whole whenever any member is
missing, so a resumed build stores the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from hs_dataset.capture.base import CaptureBackend, CaptureFailure, CaptureInfo
from hs_dataset.config import Card, HFBackendSection
from hs_dataset.dtypes import state_dtype_name
from hs_dataset.errors import UsageError
from hs_dataset.faults import crash_point
from hs_dataset.formats.atomic import atomic_write_bytes
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.formats.writer_session import WriterReport
from hs_dataset.sample import TokenizedSample
from hs_dataset.sources.read_ahead import read_ahead

__all__ = [
    "RunReport", "build_dataset", "dataset_metadata", "make_backend", "RUN_REPORT_NAME", "partition",
    "limit_samples", "load_card_tokenizer", "open_rows", "resolve_source", "tokenizer_info",
]

RUN_REPORT_NAME = "run_report.json"
READ_AHEAD_WINDOWS = 2  # capture windows tokenized ahead of the backend


@dataclass
class RunReport:
    """What a build did: every input row is accounted for somewhere in here."""

    config: str
    out_dir: str
    samples_considered: int = 0
    samples_written: int = 0
    skipped_existing: int = 0
    tokens_written: int = 0
    bytes_written: int = 0
    truncated: int = 0
    capture_failures: list[dict[str, str]] = field(default_factory=list)
    quarantined: list[dict[str, str]] = field(default_factory=list)
    rejected_shards: list[str] = field(default_factory=list)
    source: dict[str, Any] = field(default_factory=dict)
    regeneration: dict[str, Any] | None = None
    elapsed_s: float = 0.0
    rank: int = 0
    world_size: int = 1

    @property
    def samples_per_s(self) -> float:
        return self.samples_written / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_written / self.elapsed_s if self.elapsed_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_s": round(self.samples_per_s, 3), "tokens_per_s": round(self.tokens_per_s, 1)}

    def summary(self) -> str:
        src = self.source
        dropped = src.get("issues", [])
        reasons: dict[str, int] = {}
        for issue in dropped:
            reasons[issue["kind"]] = reasons.get(issue["kind"], 0) + 1
        for failure in self.capture_failures:
            reasons["capture_failed"] = reasons.get("capture_failed", 0) + 1
        for _q in self.quarantined:
            reasons["quarantined_nonfinite"] = reasons.get("quarantined_nonfinite", 0) + 1
        lines = [
            f"run report for {self.config} -> {self.out_dir}",
            f"  rows read            {src.get('rows_read', 0)}",
            f"  samples written      {self.samples_written} ({self.tokens_written} tokens, {self.bytes_written / 2**20:.1f} MiB)",
            f"  already stored       {self.skipped_existing}",
            f"  truncated            {self.truncated}",
            f"  not written          {sum(reasons.values())}" + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(reasons.items()))})" if reasons else ""),
            f"  time                 {self.elapsed_s:.1f} s ({self.samples_per_s:.2f} samples/s, {self.tokens_per_s:.0f} tokens/s)",
        ]
        if self.regeneration:
            r = self.regeneration
            lines.append(
                f"  regenerated          {r['conversations']} conversations, {r['turns']} turns ({r['from_store']} from the stored file): "
                f"hit max_new_tokens {r['hit_max_new_tokens']}, empty {r['empty']}, failed {r['failed']}, dropped {r['dropped']}, "
                f"not regenerable {r['not_regenerable']}, unsupervised turns {r['unsupervised_turns']}"
            )
        if src.get("shapes"):
            lines.append("  shapes               " + ", ".join(f"{k}: {v}" for k, v in sorted(src["shapes"].items())))
        for keys, n in list((src.get("unknown_keys") or {}).items())[:5]:
            lines.append(f"    unknown shape, keys [{keys}]: {n} row(s) (map them with --columns)")
        for issue in dropped[:10]:
            lines.append(f"    row {issue['row_index']}: {issue['kind']}: {issue['reason']}")
        for failure in self.capture_failures[:10]:
            lines.append(f"    {failure['sample_id']}: capture failed: {failure['reason']}")
        for q in self.quarantined[:10]:
            lines.append(f"    {q['sample_id']}: quarantined: {q['reason']}")
        for name in self.rejected_shards:
            lines.append(f"    {name}: unlisted shard of another dataset, renamed to {name}.rejected")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- set-up
def make_backend(card: Card, *, model_path: str | None = None, device: str | None = None, servers: list[str] | None = None, **extra: Any) -> CaptureBackend:
    """Instantiate the backend a card names (``hf`` in-process, ``sglang`` client)."""
    backend = card.backend
    path = model_path or card.model.path or os.environ.get("HS_DATASET_MODEL_PATH")
    if not path:
        raise UsageError(f"config {card.name!r} needs a local model directory: pass --model-path DIR (hs_dataset never downloads weights)")
    if isinstance(backend, HFBackendSection):
        from hs_dataset.capture.hf import HFBackend
        from hs_dataset.model.snapshot import resolve_model_path
        from hs_dataset.model.remote_code import check_remote_code

        # the tokenizer is loaded after the model: refuse its remote code before minutes of loading
        check_remote_code(resolve_model_path(path), card.model.trust_remote_code, ("tokenizer_config.json",))

        return HFBackend(
            path,
            card.layers.aux,
            dtype=card.dtype,
            device=device or backend.device,
            text_module=card.model.text_module,
            model_revision=card.model.revision,
            trust_remote_code=card.model.trust_remote_code,
        )
    from hs_dataset.sglang.client.backend import SGLangBackend

    return SGLangBackend.from_card(card, model_path=path, servers=servers, **extra)


_TOKENIZERS: dict[tuple, Any] = {}


def _files_signature(directory: Path) -> tuple:
    """Names, sizes and mtimes of a snapshot's top-level files: a changed tokenizer file is a new key."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
        return tuple((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in entries if e.is_file())
    except OSError:
        return ()


def load_card_tokenizer(card: Card, directory: Path) -> Any:
    """The snapshot's tokenizer (remote code only if the card allows it), with the card's chat template if it names one.

    Loading a large vocabulary takes ~0.4 s; builds in one process (datasets parts,
    streams, benchmarks) share one tokenizer per unchanged snapshot. One with a
    card template override is loaded fresh, since the override changes the object.
    """
    from hs_dataset.model.tokenizer import load_tokenizer

    if not card.model.chat_template:
        key = (str(directory), card.model.trust_remote_code, _files_signature(directory))
        if key not in _TOKENIZERS:
            _TOKENIZERS.clear()  # one snapshot at a time: no unbounded growth
            _TOKENIZERS[key] = load_tokenizer(directory, trust_remote_code=card.model.trust_remote_code)
        return _TOKENIZERS[key]
    tokenizer = load_tokenizer(directory, trust_remote_code=card.model.trust_remote_code)
    if card.model.chat_template:
        template = Path(card.model.chat_template).expanduser()
        if not template.is_file():
            raise UsageError(f"model.chat_template: {template} is not a file; pass --chat-template FILE with a Jinja chat template")
        tokenizer.chat_template = template.read_text(encoding="utf-8")
    return tokenizer


def tokenizer_info(tokenizer: Any, path: Path) -> dict[str, Any]:
    template = getattr(tokenizer, "chat_template", None) or ""
    tok_file = next((path / name for name in ("tokenizer.json", "tiktoken.model") if (path / name).exists()), path / "tokenizer.json")
    return {
        "path": str(path),
        "class": type(tokenizer).__name__,
        "vocab_size": len(tokenizer),
        "fingerprint": hashlib.sha256(tok_file.read_bytes()).hexdigest() if tok_file.exists() else None,
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if template else None,
    }


def dataset_metadata(card: Card, info: CaptureInfo, tokenizer_info: dict[str, Any]) -> dict[str, Any]:
    """The manifest metadata: what every stored tensor means, and where it came from."""
    return {
        "config_name": card.name,
        "config_fingerprint": card.fingerprint,
        "model": {
            "path": info.model_path,
            "id": card.model.id,
            "revision": info.model_revision,
            "fingerprint": info.model_fingerprint,
        },
        "aux_layer_ids": list(info.aux_layer_ids),
        "layer_convention": "hf_hidden_states_index",
        "final_state": info.final_state,
        "final_norm": {"kind": "rmsnorm", "eps": info.final_norm_eps},
        "dtype": state_dtype_name(info.dtype),
        "hidden_size": info.hidden_size,
        "num_hidden_layers": info.num_hidden_layers,
        "vocab_size": info.vocab_size,
        "tokenizer": tokenizer_info,
        "max_length": card.max_length,
        "overflow": card.overflow,
        "backend": {"name": info.backend, **info.backend_details},
    }


def partition(samples: Iterable[TokenizedSample], rank: int, world_size: int) -> Iterator[TokenizedSample]:
    """Deterministic split of the source order across ranks: sample k goes to rank k % world_size."""
    for k, sample in enumerate(samples):
        if k % world_size == rank:
            yield sample


def limit_samples(samples: Iterable[TokenizedSample], n: int | None) -> Iterator[TokenizedSample]:
    for k, sample in enumerate(samples):
        if n is not None and k >= n:
            return
        yield sample


def _batches(samples: Iterable[TokenizedSample], size: int) -> Iterator[list[TokenizedSample]]:
    batch: list[TokenizedSample] = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def resolve_source(card: Card, source: Any) -> Any:
    if source is not None:
        return source
    path = card.source.path
    if path == "builtin:conversations":
        from hs_dataset.sources import bundled_conversations_path

        return bundled_conversations_path()
    if not path:
        raise UsageError(f"config {card.name!r} names no source data: pass --source PATH (JSONL or a saved datasets directory)")
    return path


# ---------------------------------------------------------------------------- the build
def build_dataset(
    card: Card,
    out_dir: str | os.PathLike,
    *,
    num_samples: int | None = None,
    source: Any = None,
    batch_size: int | None = None,
    backend: CaptureBackend | None = None,
    model_path: str | None = None,
    device: str | None = None,
    servers: list[str] | None = None,
    shard_bytes: int | None = None,
    storage: str | None = None,
    rank: int = 0,
    world_size: int = 1,
    strict: bool = False,
    progress: bool = False,
    writer_threads: int = 2,
) -> RunReport:
    """Capture ``card``'s data into ``out_dir`` (created or resumed). Returns the run report."""
    from hs_dataset.sources import SourceReport, iter_samples

    if not 0 <= rank < world_size:
        raise UsageError(f"rank must be in [0, world_size), got rank={rank} world_size={world_size}")
    started = time.perf_counter()
    out_dir = Path(out_dir)
    own_backend = backend is None
    backend = backend or make_backend(card, model_path=model_path, device=device, servers=servers)
    regen: _Regen | None = None
    try:
        info = backend.info()
        tokenizer_dir = Path(info.model_path)
        tokenizer = load_card_tokenizer(card, tokenizer_dir)
        metadata = dataset_metadata(card, info, tokenizer_info(tokenizer, tokenizer_dir))
        report = RunReport(config=card.name, out_dir=str(out_dir), rank=rank, world_size=world_size)
        source_report = SourceReport()
        resolved_source = resolve_source(card, source)
        rows = open_rows(card, resolved_source)
        samples = iter_samples(
            rows, tokenizer, max_length=card.max_length, overflow=card.overflow,
            strict=strict, report=source_report, vocab_size=info.vocab_size,
            columns=card.source.columns, keep_conversation=card.regenerate.enabled,
        )
        batch_size = batch_size or card.backend.batch_size
        # tokenization runs a few windows ahead of capture, on its own thread
        samples = read_ahead(partition(limit_samples(samples, num_samples), rank, world_size), depth=READ_AHEAD_WINDOWS * batch_size)
        if card.regenerate.enabled:
            name = f"rank{rank:05d}-regenerated.jsonl" if world_size > 1 else "regenerated.jsonl"
            regen = _open_regeneration(card, make_generator(card, backend, info, tokenizer), tokenizer, out_dir, name)
            metadata["regeneration"] = regeneration_metadata(regen)
        with ShardWriter(
            out_dir,
            metadata,
            final_norm_weight=info.final_norm_weight,
            storage=storage or card.shards.storage,
            shard_bytes=shard_bytes or card.shards.bytes,
            shard_prefix=f"rank{rank:05d}-" if world_size > 1 else "",
            writer_threads=writer_threads,
        ) as writer:
            if regen is not None:
                samples = _regenerate(samples, regen)
            bar = _progress(_expected_samples(resolved_source, num_samples, rank, world_size, rows.total)) if progress else None
            for result in _capture(backend, samples, batch_size, writer, report):
                if isinstance(result, CaptureFailure):
                    report.capture_failures.append({"sample_id": result.sample_id, "reason": result.reason})
                elif writer.add(result):
                    report.tokens_written += result.num_tokens
                if bar is not None:
                    bar.update(1)
                    _update_postfix(bar, writer, report, started)
            if bar is not None:
                bar.close()
        wrep: WriterReport = writer.report
        report.samples_written = wrep.written
        report.bytes_written = wrep.bytes_written
        report.quarantined = list(wrep.quarantined)
        report.rejected_shards = list(wrep.rejected_shards)
        report.truncated = source_report.truncated
        report.source = {
            "name": source_report.source_name,
            "rows_read": source_report.rows_read,
            "samples_out": source_report.samples_out,
            "truncated": source_report.truncated,
            "issues": [asdict(i) for i in source_report.issues],
            "notes": list(source_report.notes),
            "shapes": dict(source_report.shapes),
            "unknown_keys": dict(source_report.unknown_keys),
        }
        if regen is not None:
            report.regeneration = asdict(regen.report)
            _record_regenerated_file(out_dir, regen)
        report.elapsed_s = time.perf_counter() - started
        _save_report(out_dir, report)
        return report
    finally:
        if regen is not None and hasattr(regen.generator, "close"):
            regen.generator.close()
        if own_backend:
            backend.close()


def _capture(backend: CaptureBackend, samples: Iterable[TokenizedSample], batch_size: int, writer: ShardWriter, report: RunReport):
    """Yield capture results for every sample not yet stored.

    Fixed windows of the source order form the batches; a window whose members are
    all stored is skipped without a forward pass.
    """
    if not backend.fixed_batches:
        def missing() -> Iterator[TokenizedSample]:
            for sample in samples:
                report.samples_considered += 1
                if writer.contains(sample.sample_id):
                    report.skipped_existing += 1
                else:
                    yield sample

        yield from backend.capture_stream(missing(), batch_size)
        return
    for batch in _batches(samples, batch_size):
        report.samples_considered += len(batch)
        todo = [s for s in batch if not writer.contains(s.sample_id)]
        report.skipped_existing += len(batch) - len(todo)
        if not todo:
            continue
        wanted = {s.sample_id for s in todo}
        for result in backend.capture_batch(batch):
            if result.sample_id in wanted:
                yield result
        crash_point("pipeline.after_batch")


def _save_report(out_dir: Path, report: RunReport) -> None:
    path = out_dir / RUN_REPORT_NAME
    runs: list[Any] = []
    if path.exists():
        try:
            runs = json.loads(path.read_text()).get("runs", [])
        except (ValueError, AttributeError):
            runs = []
    runs.append(report.to_json())
    atomic_write_bytes(path, json.dumps({"runs": runs}, indent=1).encode())


def _expected_samples(source: Any, num_samples: int | None, rank: int, world_size: int, known: int | None = None) -> int | None:
    """Rows this rank will see, for the progress bar's total and ETA (None when unknown cheaply)."""
    rows: int | None = known
    if isinstance(source, (str, os.PathLike)) and str(source).endswith(".jsonl") and Path(source).is_file():
        with open(source, "rb") as f:
            rows = sum(1 for line in f if line.strip())
    elif hasattr(source, "__len__"):
        rows = len(source)
    if num_samples is not None:
        rows = num_samples if rows is None else min(rows, num_samples)
    if rows is None:
        return None
    return len(range(rank, rows, world_size))


def _progress(total: int | None):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="sample", dynamic_ncols=True, desc="capture")


def _update_postfix(bar, writer: ShardWriter, report: RunReport, started: float) -> None:
    elapsed = max(time.perf_counter() - started, 1e-9)
    bar.set_postfix_str(
        f"{report.tokens_written / elapsed:.0f} tok/s, {writer.report.bytes_written / 2**20:.1f} MiB written",
        refresh=False,
    )



# ---------------------------------------------------------------------------- regeneration
@dataclass
class RegenerationReport:
    """What regeneration did, per conversation and per turn (in the run report)."""

    conversations: int = 0
    from_store: int = 0
    turns: int = 0
    hit_max_new_tokens: int = 0
    empty: int = 0
    failed: int = 0
    dropped: int = 0
    not_regenerable: int = 0
    unsupervised_turns: int = 0
    cut_by_max_length: int = 0

    def count(self, record: dict[str, Any]) -> None:
        self.conversations += 1
        for turn in record["turns"]:
            self.turns += 1
            self.hit_max_new_tokens += turn["finish"] == "length"
            self.empty += bool(turn["empty"])
            self.failed += turn["finish"] == "failed"
        self.dropped += record["dropped"] is not None and not record["dropped"].startswith("not regenerable")
        self.unsupervised_turns += sum(not s for s in record["supervised_turns"])


def make_generator(card: Card, backend: CaptureBackend, info: CaptureInfo, tokenizer: Any) -> Any:
    """The generator beside the capture backend: the same in-process model, or the same SGLang servers."""
    from hs_dataset.regenerate.generator import HFGenerator

    model = getattr(backend, "model", None)
    if model is not None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        return HFGenerator(model, pad_token_id=int(pad), model_fingerprint=info.model_fingerprint)
    endpoints = getattr(backend, "endpoints", None)
    if endpoints:
        from hs_dataset.sglang.client.generate import SGLangGenerator

        return SGLangGenerator(
            [e.url for e in endpoints], concurrency=card.regenerate.concurrency,
            request_timeout_s=getattr(backend, "request_timeout_s", 600.0), model_fingerprint=info.model_fingerprint,
        )
    raise UsageError(f"--regenerate needs the hf or sglang backend; {type(backend).__name__} cannot generate")


@dataclass
class _Regen:
    """One regeneration run: generator, template, parameters, the stored records and the counts."""

    generator: Any
    renderer: Any
    params: Any
    section: Any
    store: Any
    report: RegenerationReport
    max_length: int


def _stop_ids(chat: Any, tokenizer: Any) -> tuple[int, ...]:
    """End-of-turn ids: the mask rule's end token (``<|im_end|>``) and the tokenizer's EOS."""
    ids = [getattr(getattr(chat, "_compiled", None), "end_id", None), tokenizer.eos_token_id]
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def _open_regeneration(card: Card, generator: Any, tokenizer: Any, out_dir: Path, name: str) -> _Regen:
    from hs_dataset.regenerate.generator import GenerationParams
    from hs_dataset.formats.regenerated import RegeneratedStore
    from hs_dataset.sources.chat import ChatTokenizer
    from hs_dataset.sources.masking import resolve_mask_rule
    from hs_dataset.regenerate.turns import TurnRenderer

    section = card.regenerate
    chat = ChatTokenizer(tokenizer, resolve_mask_rule(tokenizer))
    params = GenerationParams(
        max_new_tokens=section.max_new_tokens, temperature=section.temperature, top_p=section.top_p,
        seed=section.seed, stop_token_ids=_stop_ids(chat, tokenizer),
    )
    thinking = None if section.thinking is None else section.thinking == "on"
    return _Regen(generator, TurnRenderer(chat, thinking), params, section, RegeneratedStore(out_dir, name), RegenerationReport(), card.max_length)


def regeneration_metadata(regen: _Regen) -> dict[str, Any]:
    """Generation parameters, engine and model, for the manifest and the dataset card."""
    s = regen.section
    return {
        "file": regen.store.name, **regen.params.to_json(), "thinking": s.thinking, "turns": s.turns, "policy": s.policy,
        "concurrency": s.concurrency, "generator": regen.generator.describe(),
    }


def _regenerate(samples: Iterable[TokenizedSample], regen: _Regen) -> Iterator[TokenizedSample]:
    """Replace each conversation's assistant turns with the target's own, in fixed windows of the source order."""
    for window in _batches(samples, regen.section.concurrency):
        missing = [s for s in window if regen.store.get(s.sample_id) is None]
        if missing:
            regen.store.append_chunk(_regenerate_window(missing, regen))
            crash_point("regenerate.after_chunk")
        regen.report.from_store += len(window) - len(missing)
        for sample in window:
            record = regen.store.get(sample.sample_id)
            regen.report.count(record)
            out = _sample_from_record(sample, record, regen)
            if out is not None:
                yield out


@dataclass
class _Conv:
    sample: TokenizedSample
    turns: list[int]
    messages: list[dict[str, Any]] = field(default_factory=list)
    pos: int = 0
    prompts: list[list[int]] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None


def _regenerate_window(window: list[TokenizedSample], regen: _Regen) -> list[dict[str, Any]]:
    """Turn k of every conversation of the window in one generate call, for k = 1, 2, ..."""
    from hs_dataset.regenerate.turns import regenerable_turns

    convs = []
    for sample in window:
        conv = sample.meta.get("conversation")
        convs.append(_Conv(sample, regenerable_turns(conv, regen.section.turns) if conv is not None else []))
    for k in itertools.count():
        active = [c for c in convs if c.stopped is None and k < len(c.turns)]
        if not active:
            break
        prompts = [_next_prompt(c, regen) for c in active]
        ready = [(c, p) for c, p in zip(active, prompts) if p is not None]
        results = regen.generator.generate([p for _, p in ready], regen.params)
        for (conv, prompt), result in zip(ready, results):
            _take_turn(conv, prompt, result, regen)
    return [_record(c, regen) for c in convs]


def _next_prompt(conv: _Conv, regen: _Regen) -> list[int] | None:
    from hs_dataset.sources.report import MalformedRowError

    source = conv.sample.meta["conversation"]
    index = conv.turns[len(conv.prompts)]
    context = conv.messages + source.messages[conv.pos:index]
    try:
        prompt = regen.renderer.prompt_ids(context, source.tools)
        if conv.prompts:
            prompt = _spliced(conv, prompt, source.tools, regen) or prompt
    except MalformedRowError as exc:
        conv.answers.append({"finish": "failed", "empty": False, "token_ids": [], "error": str(exc), "prompt_tokens": 0})
        conv.stopped = "failed"
        return None
    conv.messages, conv.pos = context, index + 1
    return prompt


def _spliced(conv: _Conv, fresh: list[int], tools: Any, regen: _Regen) -> list[int] | None:
    """The next prompt holding the previous turn's ids as the model wrote them (None: the template rewrote it)."""
    from hs_dataset.regenerate.turns import splice

    history = regen.renderer.render_ids(conv.messages, tools, generation_prompt=False)
    answer = conv.answers[-1]["token_ids"]
    end_id = next((t for t in regen.params.stop_token_ids if answer and t == answer[-1]), regen.params.stop_token_ids[0])
    return splice(conv.prompts[-1], answer, history, fresh, end_id)


def _take_turn(conv: _Conv, prompt: list[int], result: Any, regen: _Regen) -> None:
    stop = regen.params.stop_token_ids
    body = [t for t in result.token_ids if t not in stop]
    turn = {"prompt_tokens": len(prompt), "token_ids": list(result.token_ids), "finish": result.finish, "empty": not body and result.finish != "failed", "error": result.error}
    conv.answers.append(turn)
    if result.finish == "failed":
        conv.stopped = "failed"
        return
    conv.prompts.append(prompt)
    conv.messages = conv.messages + [regen.renderer.message(result.token_ids, stop)]
    flawed = "hit max_new_tokens" if result.finish == "length" else ("empty" if turn["empty"] else None)
    if flawed and regen.section.policy == "drop":
        conv.stopped = f"drop: a turn {flawed}"


def _record(conv: _Conv, regen: _Regen) -> dict[str, Any]:
    """The stored outcome of one conversation: its turns, the regenerated messages and the sample's ids and mask spans."""
    source = conv.sample.meta.get("conversation")
    record: dict[str, Any] = {
        "sample_id": conv.sample.sample_id, "row_index": conv.sample.meta.get("row_index"), "turns": conv.answers,
        "messages": conv.messages, "tools": source.tools if source is not None else None,
        "input_ids": None, "loss_spans": [], "supervised_turns": [], "dropped": None,
    }
    if not conv.turns:
        record["dropped"] = "not regenerable (pre-tokenized, or its first assistant turn calls tools): kept as it was"
        return record
    if conv.stopped and conv.stopped.startswith("drop"):
        record["dropped"] = conv.stopped
        return record
    if not conv.prompts:
        record["dropped"] = "the first turn failed: " + conv.answers[-1]["error"]
        return record
    from hs_dataset.regenerate.turns import assemble

    kept = [a["token_ids"] for a in conv.answers if a["finish"] != "failed"]
    ids, mask, supervised = assemble(conv.prompts, kept)
    record.update(input_ids=ids, loss_spans=_spans(mask), supervised_turns=supervised)
    return record


def _spans(mask: list[bool]) -> list[list[int]]:
    spans: list[list[int]] = []
    for i, bit in enumerate(mask):
        if bit and (not spans or spans[-1][1] != i):
            spans.append([i, i + 1])
        elif bit:
            spans[-1][1] = i + 1
    return spans


def _sample_from_record(sample: TokenizedSample, record: dict[str, Any], regen: _Regen) -> TokenizedSample | None:
    import torch

    if record["input_ids"] is None:
        if record["dropped"].startswith("not regenerable"):
            regen.report.not_regenerable += 1
            return sample
        return None
    ids = record["input_ids"]
    mask = [False] * len(ids)
    for start, stop in record["loss_spans"]:
        mask[start:stop] = [True] * (stop - start)
    full = len(ids)
    ids, mask = ids[: regen.max_length], mask[: regen.max_length]
    if not any(mask):
        regen.report.cut_by_max_length += 1
        return None
    meta = {k: v for k, v in sample.meta.items() if k != "conversation"}
    meta.update(format="regenerated", full_length=full)
    return TokenizedSample(
        sample_id=sample.sample_id, input_ids=torch.tensor(ids, dtype=torch.int64),
        loss_mask=torch.tensor(mask, dtype=torch.bool), truncated=full > regen.max_length, meta=meta,
    )


def open_rows(card: Card, source: Any) -> Any:
    """The source as rows: ``hf:`` names and saved splits take the card's subset/split/revision/streaming."""
    from hs_dataset.sources import open_source
    from hs_dataset.sources.iterate import line_byte_cap

    src = card.source
    hub = {"subset": src.subset, "split": src.split, "revision": src.revision, "streaming": src.streaming}
    return open_source(source, max_line_bytes=line_byte_cap(card.max_length), hub=hub)


def _record_regenerated_file(out_dir: Path, regen: _Regen) -> None:
    """Hash the regenerated-conversations file into the manifest (``metadata.regeneration.files``)."""
    from hs_dataset.formats.dirlock import acquire_dir_lock, release_dir_lock
    from hs_dataset.formats.manifest import Manifest

    fd = acquire_dir_lock(out_dir)
    try:
        manifest = Manifest.load(out_dir)
        entry = dict(manifest.metadata.get("regeneration") or regeneration_metadata(regen))
        files = dict(entry.get("files") or {})
        files[regen.store.name] = {"sha256": regen.store.sha256(), "records": len(regen.store.records)}
        entry["files"] = files
        manifest.metadata["regeneration"] = entry
        manifest.save(out_dir)
    finally:
        release_dir_lock(fd)
