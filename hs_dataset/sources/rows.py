"""Read raw rows from JSONL/JSON/Parquet files, saved or in-memory ``datasets``, or plain lists.

Each row comes with its 0-based index in the source; that index (with the source
name) is what default sample ids and every report entry refer to, so it must not
depend on how the rows were loaded. For JSONL, blank lines are not rows, which
keeps the index equal to the row index of ``datasets.load_dataset("json", ...)``.
A line that is not a JSON object (or not UTF-8, or longer than the line cap) is
still a row: it is passed on as a :class:`BadRow` so the caller can report it, with
its file and line, instead of losing it or stopping. JSONL lines are read with a
byte cap (:mod:`hs_dataset.sources.lines`), so a huge line costs bounded memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

from hs_dataset.errors import SourceError
from hs_dataset.sources.hub import HF_PREFIX, load_hub_rows
from hs_dataset.sources.lines import read_lines

__all__ = ["DEFAULT_MAX_LINE_BYTES", "BadRow", "RowSource", "Source", "open_source"]

DEFAULT_MAX_LINE_BYTES = 16 << 20  # iter_samples passes its own (docs/SOURCES.md, "Size limits")

Source = str | PathLike | Iterable[Mapping[str, Any]]  # a datasets.Dataset is an Iterable of rows


@dataclass(frozen=True)
class BadRow:
    """A row that could not even be parsed into a mapping (``kind``: ``malformed`` or ``oversized``)."""

    reason: str
    kind: str = "malformed"


@dataclass
class RowSource:
    """A named, re-readable stream of ``(row_index, row)`` pairs.

    ``file`` is the path rows come from (``None`` for in-memory rows) and ``line`` the
    1-based line of the row last yielded (JSONL only), so issues can say where to look.
    """

    name: str
    open_rows: Callable[[], Iterator[tuple[int, Mapping[str, Any] | BadRow]]]
    file: str | None = None
    line: int | None = None
    total: int | None = None  # rows the source holds, when it knows (progress bars)

    def __iter__(self) -> Iterator[tuple[int, Mapping[str, Any] | BadRow]]:
        return self.open_rows()


def _parse_line(data: bytes, number: int) -> Mapping[str, Any] | BadRow:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadRow(f"line {number} is not valid UTF-8 (byte {exc.start}: {data[exc.start : exc.start + 1]!r})")
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        return BadRow(f"line {number} is not valid JSON ({exc.msg} at column {exc.colno})")
    except RecursionError:
        return BadRow(f"line {number} is nested too deeply to parse")
    return row if isinstance(row, dict) else BadRow(f"line {number} is a JSON {type(row).__name__}, not an object")


def _iter_jsonl(path: Path, source: RowSource, max_bytes: int) -> Iterator[tuple[int, Mapping[str, Any] | BadRow]]:
    index = 0
    with path.open("rb") as handle:
        for line in read_lines(handle, max_bytes):
            if line.data is not None and not line.data.strip():
                continue
            source.line = line.number
            if line.data is None:
                yield (
                    index,
                    BadRow(
                        f"line {line.number} is {line.size} bytes, over the {max_bytes}-byte line cap (raise max_length, or split the row)",
                        kind="oversized",
                    ),
                )
            else:
                yield index, _parse_line(line.data, line.number)
            index += 1


def _iter_json_list(path: Path) -> Iterator[tuple[int, Mapping[str, Any] | BadRow]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}: not valid JSON ({exc}); use one JSON object per line (.jsonl) or a JSON list") from exc
    if not isinstance(data, list):
        raise SourceError(f"{path}: a .json source must hold a list of rows; got a {type(data).__name__}")
    yield from _iter_items(data)


def _iter_items(rows: Iterable[Any]) -> Iterator[tuple[int, Mapping[str, Any] | BadRow]]:
    for index, row in enumerate(rows):
        yield index, row if isinstance(row, Mapping) else BadRow(f"row is a {type(row).__name__}, not a mapping")


def _one_split(data: Any, where: str, split: str | None = None) -> Any:
    if isinstance(data, Mapping):
        if not data or not all(hasattr(part, "column_names") for part in data.values()):
            raise SourceError(f"{where} is a single mapping, not a collection of rows; pass a list of row dicts")
        if split is not None:
            if split not in data:
                raise SourceError(f"{where} has no split {split!r}; it holds {sorted(data)} (pass --split NAME)")
            return data[split]
        if len(data) != 1:  # DatasetDict
            raise SourceError(f"{where} holds splits {sorted(data)}; pass one of them (--split NAME), e.g. load_from_disk(path)['train']")
        data = next(iter(data.values()))
    return data


def _known_length(data: Any) -> int | None:
    """Rows of a ``datasets`` object when it knows them without reading (a streamed split reads its info)."""
    try:
        return len(data)
    except TypeError:
        pass
    info = getattr(data, "info", None)
    splits = getattr(info, "splits", None) or {}
    split = str(getattr(data, "split", "") or "")
    entry = splits.get(split) if split else None
    return int(entry.num_examples) if entry is not None and entry.num_examples else None


def _dataset_source(data: Any, name: str, file: str | None = None) -> RowSource:
    return RowSource(name, lambda: _iter_items(data), file=file, total=_known_length(data))


def _path_source(path: Path, name: str | None, max_line_bytes: int, split: str | None = None) -> RowSource:
    if path.is_dir():  # a datasets.save_to_disk directory
        import datasets

        data = _one_split(datasets.load_from_disk(str(path)), str(path), split)
        return _dataset_source(data, name or path.name, str(path))
    if not path.is_file():
        raise SourceError(
            f"{path}: no such file; pass a .jsonl/.json/.parquet/.arrow file, a saved datasets directory, "
            "hf:ORG/NAME, a datasets.Dataset or a list of dicts"
        )
    if path.suffix in (".parquet", ".arrow"):
        import datasets

        load = datasets.Dataset.from_parquet if path.suffix == ".parquet" else datasets.Dataset.from_file
        return _dataset_source(load(str(path)), name or path.stem, str(path))
    source = RowSource(name or path.name.split(".")[0], lambda: iter(()), file=str(path))
    if path.suffix == ".json":
        source.open_rows = lambda: _iter_json_list(path)
    else:
        source.open_rows = lambda: _iter_jsonl(path, source, max_line_bytes)
    return source


def open_source(
    source: Source,
    name: str | None = None,
    *,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    hub: Mapping[str, Any] | None = None,
) -> RowSource:
    """Wrap ``source`` as a :class:`RowSource`.

    ``source``: a .jsonl/.json/.parquet file, a ``save_to_disk`` directory, a
    ``datasets.Dataset``/``IterableDataset`` (or a ``DatasetDict`` with one split),
    or a list of dicts. ``name`` defaults to the file's stem (directory name), the
    dataset's ``info.dataset_name``, or ``"rows"``. JSONL lines longer than
    ``max_line_bytes`` are skipped unread and yielded as ``oversized`` :class:`BadRow` s.
    ``hf:ORG/NAME`` loads a Hub dataset (:mod:`hs_dataset.sources.hub`); ``hub`` holds its
    ``subset``/``split``/``revision``/``streaming`` (``split`` also picks a saved ``DatasetDict``'s split).
    """
    hub = dict(hub or {})
    if isinstance(source, RowSource):
        return source
    if isinstance(source, str) and source.startswith(HF_PREFIX):
        data = load_hub_rows(source[len(HF_PREFIX) :], **hub)
        return _dataset_source(data, name or source[len(HF_PREFIX) :].replace("/", "__"))
    if isinstance(source, (str, PathLike)):
        return _path_source(Path(source), name, max_line_bytes, hub.get("split"))
    if isinstance(source, Mapping):
        source = _one_split(source, f"the {type(source).__name__}", hub.get("split"))
    if not isinstance(source, Iterable):
        raise SourceError(f"cannot read rows from a {type(source).__name__}; pass a path, a datasets.Dataset or a list of dicts")
    if name is None:
        info = getattr(source, "info", None)
        name = getattr(info, "dataset_name", None) or "rows"
    return RowSource(name, lambda: _iter_items(source), total=_known_length(source))
