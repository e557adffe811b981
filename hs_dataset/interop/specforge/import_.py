"""Import SpecForge 0.2.0 offline data (``rows_*/data_{idx}.ckpt``) into our format.

``hidden_state`` is AFTER the final norm, stored as ``final_state: "post_norm"`` (a
different dataset identity than a pre-norm capture, on purpose); ``aux_hidden_state``
is K aux layers concatenated, HF ids = the SGLang capture ids + 1. ``.ckpt`` files are
read with ``torch.load(..., weights_only=True)`` only: never an arbitrary unpickle;
``.ckpt.gz`` files are expanded with a size cap (:mod:`hs_dataset.interop.bounded_gzip`),
so a gzip bomb is refused with its name instead of filling memory. Before any tensor is
copied, each must own its bytes (:mod:`hs_dataset.interop.tensor_storage`: no zero-stride
or overlapping tensor) and the declared token count must be within the import's bound
(:func:`~hs_dataset.interop.importing.check_declared_tokens`). The shared rules are
:mod:`hs_dataset.interop.importing`'s.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from hs_dataset.formats.atomic import is_temp_name
from hs_dataset.formats.paths import resolve_member
from hs_dataset.interop.bounded_gzip import CompressedInputError, gunzip_to_temp
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
from hs_dataset.interop.tensor_storage import SharedStorageError, check_own_storage

__all__ = ["import_specforge"]

_DATA_RE = re.compile(r"^data_(\d+)\.ckpt(\.gz)?$")
_NEEDED = ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state")
_STATES_FIRST = ("aux_hidden_state", "hidden_state", "input_ids", "loss_mask")  # the costly tensors are named first


def import_specforge(src: str | os.PathLike, dest: str | os.PathLike, settings: ImportSettings) -> ImportReport:
    """Import SpecForge 0.2.0 offline data (``rows_*/data_{idx}.ckpt``); the final state is stored as post_norm."""
    src, dest = Path(src), Path(dest)
    if not src.is_dir():
        raise ImportDataError(f"{src}: not a directory")
    resolved = resolve_settings(src, "specforge", settings)
    files = _specforge_files(src)
    if not files:
        raise ImportDataError(f"{src}: no *.ckpt / *.ckpt.gz files (SpecForge offline data) found")
    prepare_import_dest(src, dest, settings.overwrite)
    report = ImportReport("specforge", str(src), str(dest))
    hidden_hint: list[int] = []

    def items() -> Iterator[SampleItem]:
        for pos, (idx, path) in enumerate(files):
            number = idx if idx is not None else pos
            # The sample id lives inside the file (our exports) or derives from the index; peek (memory-mapped) for ours.
            # The loader reads the file again rather than keep the mapping: the import remembers every id's loader
            # (a duplicate id is compared with its first file), and must not hold a mapping open per file.
            sid = f"specforge-{number:08d}"
            if (src / "hs_dataset_export.json").exists():
                stored = _load_ckpt(path).get("sample_id")
                if stored is not None:
                    sid = check_file_sample_id(stored, str(path))

            def load(path: Path = path) -> tuple[torch.Tensor, ...]:
                return _sample_of(_load_ckpt(path), path, hidden_hint, resolved)

            yield sid, str(path), load

    return run_import("specforge", src, dest, resolved, items(), report, settings, total=len(files))


def _specforge_files(src: Path) -> list[tuple[int | None, Path]]:
    """Every SpecForge file under ``src`` (with its sample index, when all are ``data_N``), in import order.

    Whatever bears a SpecForge file name must be a regular file: a link (dangling, looping or
    not: it could lead the import outside the source), a FIFO or a directory under such a name
    is refused by name, not skipped: skipping it would import the other samples and lose that
    one without a word.
    """
    files = [p for p in src.rglob("*") if (p.name.endswith(".ckpt") or p.name.endswith(".ckpt.gz")) and not is_temp_name(p.name)]
    for p in files:
        resolve_member(src, p.relative_to(src).as_posix(), what="SpecForge file", where=str(src))
        if not p.is_file():
            raise ImportDataError(
                f"{p}: not a regular file (a directory, FIFO or device under a SpecForge file name); "
                "replace it with the data file, or move it out of the source directory"
            )
    indexed = [(int(m.group(1)) if (m := _DATA_RE.match(p.name)) else None, p) for p in files]
    if indexed and all(i is not None for i, _ in indexed):
        seen: dict[int, Path] = {}
        for i, p in indexed:
            if i in seen:
                raise ImportDataError(f"{p} and {seen[i]}: two files for sample index {i}")
            seen[i] = p  # type: ignore[index]
        return sorted(indexed, key=lambda x: x[0])  # type: ignore[arg-type, return-value]
    return sorted(indexed, key=lambda x: str(x[1]))


def _torch_load(path: Path) -> Any:
    """``torch.load`` of a plain or gzipped ckpt, memory-mapped; a .gz is expanded with a cap (bounded_gzip)."""
    if not path.name.endswith(".gz"):
        return torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    with gunzip_to_temp(path) as plain:  # the mapping outlives the (unlinked) temporary file
        return torch.load(plain.name, weights_only=True, mmap=True, map_location="cpu")


def _load_ckpt(path: Path) -> dict[str, Any]:
    try:
        raw = _torch_load(path)
    except CompressedInputError as exc:
        raise ImportDataError(str(exc)) from None
    except Exception as exc:  # truncated zip, or a pickle weights_only refuses
        raise ImportDataError(f"{path}: cannot be read with torch.load(weights_only=True) ({type(exc).__name__}: {exc})") from None
    if not isinstance(raw, dict):
        raise ImportDataError(f"{path}: holds a {type(raw).__name__}, expected a dict of tensors")
    return raw


def _check_declared(raw: dict[str, Any], path: Path, resolved: ResolvedImport) -> None:
    """Every needed tensor owns its bytes, and the declared token count is within the bound: checked before any copy."""
    for name in _STATES_FIRST:
        try:
            check_own_storage(raw[name], where=str(path), name=name)
        except SharedStorageError as exc:
            raise ImportDataError(str(exc)) from None
    for name in _STATES_FIRST:  # ids and mask are [T] or [1, T], the states [1, T, X] or [T, X]: rows before the last dim are tokens
        tensor = raw[name]
        rows = (
            tensor.numel() if name in ("input_ids", "loss_mask") else tensor.numel() // max(1, int(tensor.shape[-1]) if tensor.dim() else 1)
        )
        check_declared_tokens(int(rows), resolved, where=str(path), tensor=name, shape=tuple(tensor.shape))


def _sample_of(raw: dict[str, Any], path: Path, hidden_hint: list[int], resolved: ResolvedImport) -> tuple[torch.Tensor, ...]:
    """(input_ids, loss_mask, aux [T, K, H], final [T, H]) of one file; every file must have the first one's hidden size."""
    missing = [k for k in _NEEDED if not isinstance(raw.get(k), torch.Tensor)]
    if missing:
        raise ImportDataError(f"{path}: missing tensor(s) {missing} (SpecForge files hold {list(_NEEDED)})")
    _check_declared(raw, path, resolved)
    ids = raw["input_ids"]
    ids = ids.reshape(-1) if ids.dim() == 2 and ids.shape[0] == 1 else ids
    if ids.dim() != 1 or ids.numel() == 0:
        raise ImportDataError(f"{path}: input_ids has shape {tuple(raw['input_ids'].shape)}, expected [T]")
    t = int(ids.shape[0])
    aux, final = raw["aux_hidden_state"], raw["hidden_state"]
    aux = aux[0] if aux.dim() == 3 and aux.shape[0] == 1 else aux
    final = final[0] if final.dim() == 3 and final.shape[0] == 1 else final
    if final.dim() != 2 or int(final.shape[0]) != t:
        raise ImportDataError(f"{path}: hidden_state has shape {tuple(raw['hidden_state'].shape)}, expected [1, {t}, H]")
    hidden = int(final.shape[1])
    if aux.dim() != 2 or int(aux.shape[0]) != t or aux.shape[1] % hidden or aux.shape[1] == 0:
        raise ImportDataError(f"{path}: aux_hidden_state has shape {tuple(raw['aux_hidden_state'].shape)}, expected [1, {t}, K*{hidden}]")
    if aux.dtype != final.dtype:
        raise ImportDataError(f"{path}: aux_hidden_state is {aux.dtype} but hidden_state is {final.dtype}")
    if hidden_hint and hidden_hint[0] != hidden:
        raise ImportDataError(f"{path}: hidden size {hidden}, the first file's is {hidden_hint[0]}")
    hidden_hint[:] = [hidden]
    mask = check_mask(raw["loss_mask"], t, str(path))
    k = int(aux.shape[1]) // hidden
    return ids, mask, aux.reshape(t, k, hidden), final  # ids as stored: the import checks their dtype before int64
