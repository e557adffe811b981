"""The dataset card (the repo's README.md): one section per config, rendered from the Jinja templates in cards/.

A config's section (``dataset_card_config.md.j2``) states what its tensors are (model,
layers, final state and norm, dtype), its size, run report, figures, statistics, shards
and how to load it. The README (``dataset_card.md.j2``) puts the front matter
(:mod:`hs_dataset.hub.front_matter`) above every config's section: pushing one config
keeps the others', found between their ``<!-- hs_dataset:begin NAME -->`` markers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hs_dataset.config import Card
from hs_dataset.formats.metadata import MetadataRecord
from hs_dataset.formats.paths import open_regular, resolve_member
from hs_dataset.hub.config_card import card_model_name
from hs_dataset.hub.front_matter import merged_front_matter, parse_readme, render_front_matter
from hs_dataset.hub.index import IndexFiles
from hs_dataset.hub.public import public_metadata, public_model

__all__ = ["render_card"]

_SECTION_RE = re.compile(r"<!-- hs_dataset:begin (?P<name>[^ ]+) -->.*?<!-- hs_dataset:end (?P=name) -->", re.S)
_MAX_RUN_REPORT_BYTES = 64 * 1024 * 1024
_MAX_SHARD_ROWS = 64  # shards listed in the card; the manifest lists them all


def render_card(
    dataset: Any,
    card: Card | None,
    *,
    repo_id: str,
    config: str,
    index: IndexFiles,
    figures: list[str],
    stats: Any = None,
    existing: str | None = None,
) -> str:
    """The README.md for ``repo_id`` with this config's section (other configs' kept from ``existing``).

    ``card`` is the config card that built the dataset (:mod:`hs_dataset.hub.config_card`),
    or None; ``figures`` are repo paths of the pictures; ``stats`` the
    :func:`hs_dataset.formats.stats.compute_stats` result they were drawn from.
    """
    run = _run_summary(Path(dataset.root))
    context = {
        **_tensor_facts(dataset.manifest, card),
        **_size_facts(dataset.manifest, index.supervised_tokens),
        **_picture_facts(figures, stats),
        "config": config,
        "repo_id": repo_id,
        "description": (card.description if card is not None else "") or f"hs_dataset config `{dataset.manifest.metadata.config_name}`.",
        "run": run,
    }
    section = _load_template("dataset_card_config.md.j2").render(**context).strip()

    old_meta, old_body = parse_readme(existing or "")
    sections: dict[str, str] = {m.group("name"): m.group(0) for m in _SECTION_RE.finditer(old_body)}
    sections[config] = section
    meta = merged_front_matter(old_meta, card, dataset.manifest, config=config, index=index, run_source=(run or {}).get("source"))
    names = sorted(sections)
    text = _load_template("dataset_card.md.j2").render(
        front_matter=render_front_matter(meta),
        title=meta.get("pretty_name") or repo_id,
        format_version=dataset.manifest.format_version,
        config_names=names,
        sections=[sections[n] for n in names],
    )
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"


def _load_template(name: str):
    import importlib.resources

    import jinja2

    text = importlib.resources.files("hs_dataset.cards").joinpath(name).read_text(encoding="utf-8")
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined, keep_trailing_newline=True, trim_blocks=False, autoescape=False)
    return env.from_string(text)


def _shown(record: MetadataRecord | None) -> dict[str, Any]:
    """A metadata record as the card template reads it (an empty object when unrecorded)."""
    return {} if record is None else record.to_json()


def _tensor_facts(manifest: Any, card: Card | None) -> dict[str, Any]:
    """What the tensors are and where they came from; no local model or tokenizer directory reaches the card."""
    md = manifest.metadata
    card_model = card_model_name(card)
    public = public_metadata(md, card_model)
    return {
        "model": public_model(md, card_model).to_json(),
        "aux_layer_ids": list(md.aux_layer_ids or ()),
        "layer_convention": md.convention,
        "num_hidden_layers": md.num_hidden_layers,
        "layer_rows": [{"index": i, "meaning": _layer_meaning(int(i), md.num_hidden_layers)} for i in md.aux_layer_ids or ()],
        "final_state": md.final_state or "pre_norm",
        "final_norm": _shown(md.final_norm),
        "dtype": md.dtype,
        "encoding": (manifest.tensors.get("final_hidden_state") or {}).get("encoding"),
        "hidden_size": md.hidden_size,
        "vocab_size": md.vocab_size,
        "tokenizer": _shown(public.tokenizer),
        "max_length": md.max_length,
        "overflow": md.overflow,
        "backend": _shown(public.backend),
        "regeneration": _shown(md.regeneration),
        "config_fingerprint": md.config_fingerprint,
        "dataset_id": manifest.dataset_id,
        "created_by": manifest.created_by,
    }


def _size_facts(manifest: Any, supervised_tokens: int) -> dict[str, Any]:
    tokens = manifest.num_tokens
    return {
        "samples": manifest.num_samples,
        "tokens": tokens,
        "supervised_tokens": supervised_tokens,
        "supervised_share": f"{supervised_tokens / tokens:.0%}" if tokens else "n/a",
        "bytes": manifest.num_bytes,
        "bytes_human": _human(manifest.num_bytes),
        "bytes_per_token": f"{manifest.num_bytes / tokens:,.0f}" if tokens else "n/a",
        "quarantined": len(manifest.quarantine),
        "shards": [r.to_json() for r in manifest.shards],
        "max_shard_rows": _MAX_SHARD_ROWS,
    }


def _picture_facts(figures: list[str], stats: Any) -> dict[str, Any]:
    return {
        "figures": [{"alt": Path(f).stem.replace("_", " "), "path": f} for f in figures],
        "layer_stats": [layer.to_json() for layer in stats.layers] if stats is not None else [],
        "stats_complete": bool(stats.complete) if stats is not None else True,
        "stats_samples": stats.samples if stats is not None else 0,
    }


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _layer_meaning(index: int, num_layers: int | None) -> str:
    if index == 0:
        return "the embedding output (input of decoder layer 0)"
    text = f"output of decoder layer {index - 1}"
    if num_layers is None or index < num_layers:
        text += f" (= residual stream entering layer {index})"
    return text


def _run_summary(root: Path) -> dict[str, Any] | None:
    """The card's digest of ``run_report.json`` (None when there is none, or it cannot be read)."""
    path = resolve_member(root, "run_report.json", what="run report")
    if not path.exists():
        return None
    try:
        with open_regular(path, what="run report") as f:
            runs = json.loads(f.read(_MAX_RUN_REPORT_BYTES)).get("runs") or []
        runs = [r for r in runs if isinstance(r, dict)]
    except (ValueError, AttributeError, TypeError):
        return None
    if not runs:
        return None
    elapsed = sum(float(r.get("elapsed_s") or 0) for r in runs)
    reasons = _not_written_reasons(runs)
    return {
        "runs": len(runs),
        "source": (runs[0].get("source") or {}).get("name") or "?",
        "rows_read": max(int((r.get("source") or {}).get("rows_read") or 0) for r in runs),
        "samples_written": sum(int(r.get("samples_written") or 0) for r in runs),
        "tokens_written": sum(int(r.get("tokens_written") or 0) for r in runs),
        "truncated": max(int(r.get("truncated") or 0) for r in runs),
        "not_written": sum(reasons.values()),
        "reasons": ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items())),
        "elapsed": f"{elapsed:.1f} s",
    }


def _not_written_reasons(runs: list[dict[str, Any]]) -> dict[str, int]:
    """{reason: samples} the runs did not write: source issues by kind, capture failures, quarantined states."""
    reasons: dict[str, int] = {}
    for run in runs:
        for issue in (run.get("source") or {}).get("issues", []):
            reasons[issue.get("kind", "issue")] = reasons.get(issue.get("kind", "issue"), 0) + 1
        if run.get("capture_failures"):
            reasons["capture_failed"] = reasons.get("capture_failed", 0) + len(run["capture_failures"])
        if run.get("quarantined"):
            reasons["quarantined_nonfinite"] = reasons.get("quarantined_nonfinite", 0) + len(run["quarantined"])
    return reasons
