"""Import speculators 0.9.0 offline data (Arrow dataset + ``hidden_states/hs_{idx}.safetensors``) into our format.

The last of ``hidden_states``' layers is the final state BEFORE the norm, stored as
``final_state: "pre_norm"``; the others are aux layers, HF ``hidden_states`` indexes
(speculators uses the same convention). Every file's ``token_ids`` must equal its Arrow
row's ``input_ids``. The token count is checked against the import's bound from the
Arrow row and the safetensors header's declared shapes, before the states are read
(safetensors itself refuses offsets that do not cover a tensor's bytes, so no tensor
can share storage). The shared rules are :mod:`hs_dataset.interop.importing`'s.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from hs_dataset.formats.paths import resolve_member
from hs_dataset.formats.vocabulary import non_integer_dtype
from hs_dataset.interop.importing import (
    ImportDataError,
    ImportReport,
    ResolvedImport,
    SampleItem,
    check_declared_tokens,
    check_file_sample_id,
    check_mask,
    prepare_import_dest,
    resolve_settings,
    run_import,
)
from hs_dataset.interop.settings import ImportSettings

__all__ = ["import_speculators"]


def import_speculators(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    settings: ImportSettings,
    *,
    hidden_states_path: str | os.PathLike | None = None,
    skip_missing: bool = False,
) -> ImportReport:
    """Import speculators 0.9.0 offline data; ``hidden_states_path`` holds the ``hs_{idx}`` files when not ``SRC/hidden_states``.

    ``skip_missing`` imports the rows whose file exists and lists the others in the report.
    """
    import datasets

    src, dest = Path(src), Path(dest)
    if not (src / "state.json").is_file():
        raise ImportDataError(f"{src}: no Arrow dataset (state.json missing); expected a `speculators prepare-data` output directory")
    # file names are ours, but the directory is untrusted: no links out of it (the one resolver)
    hs_root, hs_prefix = (Path(hidden_states_path), "") if hidden_states_path else (src, "hidden_states/")
    resolved = resolve_settings(src, "speculators", settings)
    prepare_import_dest(src, dest, settings.overwrite)
    data = datasets.load_from_disk(str(src))
    missing_cols = {"input_ids", "loss_mask"} - set(data.column_names)
    if missing_cols:
        raise ImportDataError(f"{src}: the Arrow dataset lacks column(s) {sorted(missing_cols)}")
    has_ids = "sample_id" in data.column_names
    sample_ids = list(data.with_format(None)["sample_id"]) if has_ids else None
    data = data.with_format("torch", columns=["input_ids", "loss_mask"])
    report = ImportReport("speculators", str(src), str(dest))

    def items() -> Iterator[SampleItem]:
        for idx in range(len(data)):
            path = resolve_member(hs_root, f"{hs_prefix}hs_{idx}.safetensors", what="hidden states file", where=str(hs_root))
            sid = check_file_sample_id(sample_ids[idx], f"{src} row {idx}") if sample_ids is not None else f"speculators-{idx:08d}"
            if not path.is_file():
                if skip_missing:
                    report.skipped_missing.append(str(path))
                    continue
                raise ImportDataError(f"{path}: missing (Arrow row {idx} has no hidden states); pass --skip-missing to import the rest")
            yield sid, str(path), lambda idx=idx, path=path: _load_sample(src, data[idx], idx, path, resolved)

    return run_import("speculators", src, dest, resolved, items(), report, settings, total=len(data))


def _load_sample(
    src: Path, row: dict[str, Any], idx: int, path: Path, resolved: ResolvedImport
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, loss_mask, aux [T, K, H], final [T, H]) of Arrow row ``idx`` and its ``hs_{idx}`` file."""
    from safetensors import SafetensorError, safe_open

    row_ids = row["input_ids"]
    check_declared_tokens(int(row_ids.numel()), resolved, where=f"{src} row {idx}", tensor="input_ids", shape=tuple(row_ids.shape))
    input_ids = row_ids.reshape(-1)  # as stored: the import checks their dtype before int64
    t = int(input_ids.shape[0])
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            if not {"hidden_states", "token_ids"} <= keys:
                raise ImportDataError(f"{path}: needs tensors hidden_states and token_ids, has {sorted(keys)}")
            for name in ("hidden_states", "token_ids"):  # [T, K+1, H] and [T]: the header's shapes, before a byte of data
                shape = tuple(f.get_slice(name).get_shape())
                check_declared_tokens(int(shape[0]) if shape else 0, resolved, where=str(path), tensor=name, shape=shape)
            hs = f.get_tensor("hidden_states")
            token_ids = f.get_tensor("token_ids")
    except SafetensorError as exc:
        raise ImportDataError(f"{path}: not a readable safetensors file ({exc}); truncated?") from None
    if hs.dim() != 3 or hs.shape[1] < 1:
        raise ImportDataError(f"{path}: hidden_states has shape {tuple(hs.shape)}, expected [T, K+1, H] (K = 0: the final state only)")
    if int(hs.shape[0]) != t or token_ids.reshape(-1).shape[0] != t:
        raise ImportDataError(
            f"{path}: hidden_states has {hs.shape[0]} tokens, token_ids {token_ids.numel()}, Arrow row {idx} input_ids {t}"
        )
    kind = non_integer_dtype(token_ids)
    if kind is not None:
        raise ImportDataError(f"{path}: token_ids holds {kind} values, not integer token ids; the file is not speculators data")
    stated, rows = token_ids.reshape(-1).to(torch.int64), input_ids.to(torch.int64)
    if not torch.equal(stated, rows):
        bad = int((stated != rows).nonzero()[0])
        raise ImportDataError(
            f"{path}: token_ids differ from Arrow row {idx}'s input_ids (first at token {bad}); the states belong to another prompt"
        )
    mask = check_mask(row["loss_mask"], t, f"{src} row {idx}")
    return input_ids, mask, hs[:, :-1], hs[:, -1]
