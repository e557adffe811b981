"""The README's YAML front matter, read and written through ``huggingface_hub.DatasetCard``.

A repo holds several configs: the front matter merges what the repo's README already
says (other configs' ``configs:`` and ``dataset_info:`` entries, keys a person added)
with this config's entries, the config card's ``dataset_card:`` keys and the keys the
Hub indexes datasets by. Keys keep their order (the README's, then new ones), so an
unchanged push renders the same bytes and uploads nothing.
"""

from __future__ import annotations

from typing import Any

from hs_dataset.config import Card
from hs_dataset.errors import UsageError
from hs_dataset.formats.metadata import DatasetMetadata
from hs_dataset.hub.config_card import card_model_name
from hs_dataset.hub.index import IndexFiles
from hs_dataset.hub.public import bigger_size_category, hub_model_id, model_id, size_category, source_datasets

__all__ = ["configs_of", "merged_front_matter", "parse_readme", "render_front_matter"]

OUR_TAGS = ("eagle3", "speculative-decoding", "hidden-states", "hs_dataset")


def parse_readme(text: str) -> tuple[dict[str, Any], str]:
    """(front matter, Markdown body) of a README, as the Hub reads them; ({}, text) when it has no mapping up front."""
    from huggingface_hub import DatasetCard

    if not text:
        return {}, text
    try:
        card = DatasetCard(text)
    except ValueError:  # front matter that is not a mapping: replaced by ours
        return {}, text
    data = card.data.to_dict()  # DatasetCardData's own keys first: back to the file's order, as RepoCard.content does
    in_file_order = {key: data[key] for key in getattr(card, "_original_order", None) or [] if key in data}
    return {**in_file_order, **data}, card.text


def configs_of(readme_text: str) -> list[str]:
    """Names of the configs a README's ``configs:`` lists."""
    meta, _ = parse_readme(readme_text)
    return [str(c.get("config_name")) for c in _as_list(meta.get("configs")) if c.get("config_name")]


def render_front_matter(meta: dict[str, Any]) -> str:
    """``meta`` as the YAML between the README's ``---`` lines (huggingface_hub's rendering, keys in order)."""
    from huggingface_hub import DatasetCardData

    return DatasetCardData(**meta).to_yaml(original_order=list(meta)) + "\n"


def _as_list(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, dict):
        return [value]
    return [v for v in value if isinstance(v, dict)]


def merged_front_matter(
    existing: dict[str, Any], card: Card | None, manifest: Any, *, config: str, index: IndexFiles, run_source: str | None
) -> dict[str, Any]:
    """The front matter after pushing ``config``: ``existing`` (the repo's) with this config's keys merged in.

    Keys already in the repo's README win over the config card's ``dataset_card:``; this
    config's ``configs:`` and ``dataset_info:`` entries replace its old ones.
    """
    card_meta = card.dataset_card.front_matter() if card is not None else {}
    meta = dict(existing)
    for key, value in card_meta.items():  # license, license_name, pretty_name, language, ... from the config card
        if value is not None and key not in meta:
            meta[key] = value
    sources = [card.source.path if card is not None else None, run_source]
    meta.update(_ecosystem_front_matter(meta, card_meta, manifest.metadata, card_model_name(card), sources, manifest.num_samples))
    tags = list(meta.get("tags") or [])
    tags.extend(tag for tag in OUR_TAGS if tag not in tags)
    meta["tags"] = tags
    entry = {"config_name": config, "data_files": [{"split": "train", "path": f"{config}/train-*.parquet"}]}
    meta["configs"] = _replaced(meta.get("configs"), config, entry)
    info = _dataset_info_yaml(config, manifest.num_samples, index.arrow_bytes, index.download_bytes)
    meta["dataset_info"] = _replaced(meta.get("dataset_info"), config, info)
    return meta


def _replaced(entries: Any, config: str, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-config ``entries`` with ``config``'s replaced by ``entry``, sorted by config name."""
    kept = [c for c in _as_list(entries) if c.get("config_name") != config]
    kept.append(entry)
    return sorted(kept, key=lambda c: str(c.get("config_name")))


def _ecosystem_front_matter(
    meta: dict[str, Any], card_meta: dict[str, Any], md: DatasetMetadata, card_model: str | None, sources: list[Any], samples: int
) -> dict[str, Any]:
    """The keys the Hub and its dataset viewer index datasets by: task, size, sources, base model, license name.

    The config card's values win; ``size_categories`` states the largest config in the repo.
    """
    out: dict[str, Any] = {}
    out["task_categories"] = card_meta.get("task_categories") or meta.get("task_categories") or ["text-generation"]
    previous = (meta.get("size_categories") or [None])[0]
    out["size_categories"] = card_meta.get("size_categories") or [bigger_size_category(previous, size_category(samples))]
    out["source_datasets"] = sorted(set(meta.get("source_datasets") or []) | set(source_datasets(*sources)))
    if len(out["source_datasets"]) > 1 and "original" in out["source_datasets"]:
        out["source_datasets"].remove("original")
    base = hub_model_id(model_id(md, card_model))
    if base:
        out["base_model"] = base
    license_id = meta.get("license") or card_meta.get("license")
    if license_id == "other" and not (meta.get("license_name") or card_meta.get("license_name")):
        raise UsageError(
            f"config card {md.config_name!r}: dataset_card.license is 'other' but dataset_card.license_name is "
            "missing; the Hub requires a license_name (and a license_link) with license: other; set them in cards/NAME.yaml"
        )
    return out


def _dataset_info_yaml(config: str, rows: int, num_bytes: int, download_bytes: int) -> dict[str, Any]:
    """The ``dataset_info`` YAML entry datasets.push_to_hub writes (features = INDEX_FEATURES)."""
    import datasets
    from datasets.info import DatasetInfo, DatasetInfosDict
    from huggingface_hub import DatasetCardData

    from hs_dataset.formats.index import INDEX_FEATURES

    info = DatasetInfo(
        features=INDEX_FEATURES,
        config_name=config,
        splits=datasets.SplitDict({"train": datasets.SplitInfo(name="train", num_bytes=num_bytes, num_examples=rows)}),
        download_size=download_bytes,
        dataset_size=num_bytes,
    )
    data = DatasetCardData()
    DatasetInfosDict({config: info}).to_dataset_card_data(data)
    entry = data.to_dict()["dataset_info"]
    return entry[0] if isinstance(entry, list) else entry
