"""The index a push publishes: one parquet row per sample, as ``datasets.push_to_hub`` lays it out.

Rows are those of :func:`hs_dataset.formats.index.index_rows` (``INDEX_FEATURES``), so
``datasets.load_dataset(repo, config)`` loads them without hs_dataset. Files stay under
``max_file_bytes`` (an estimate from the row sizes) and row groups are bounded, so a
large dataset's index is written in constant memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["DEFAULT_INDEX_FILE_BYTES", "IndexFiles", "write_index"]

DEFAULT_INDEX_FILE_BYTES = 500 * 1024**2  # datasets.push_to_hub's max_shard_size
_ROW_GROUP_ROWS = 4096
_ROW_GROUP_BYTES = 64 * 1024**2


class IndexFiles(NamedTuple):
    """The written index: its files, their size in Arrow (the card's ``num_bytes``) and the supervised tokens."""

    files: list[Path]
    arrow_bytes: int
    supervised_tokens: int

    @property
    def download_bytes(self) -> int:
        """Bytes of the parquet files themselves (the card's ``download_size``)."""
        return sum(p.stat().st_size for p in self.files)


def _row_bytes(row: dict[str, Any]) -> int:
    """An estimate of a row's parquet size, to cut files before ``max_file_bytes``."""
    return 8 * row["seq_len"] + 64 + len(row["sample_id"]) + len(row["shard_file"])


class _IndexParts:
    """Writes rows into ``.part-NNNNN.parquet`` files, then names them ``train-NNNNN-of-NNNNN.parquet``."""

    def __init__(self, out_dir: Path, max_file_bytes: int) -> None:
        from hs_dataset.formats.index import INDEX_FEATURES

        self.out_dir = out_dir
        self.max_file_bytes = max_file_bytes
        self.schema = INDEX_FEATURES.arrow_schema
        self.parts: list[Path] = []
        self.writer: Any = None
        self.written = 0  # estimated bytes in the current file
        self.buffered = 0  # estimated bytes not yet written (one row group)
        self.arrow_bytes = 0
        self.supervised = 0
        self.columns: dict[str, list] = {name: [] for name in self.schema.names}

    def add(self, row: dict[str, Any]) -> None:
        size = _row_bytes(row)
        if self.writer is None or (self.written > 0 and self.written + size > self.max_file_bytes):
            self._next_file()
        self.supervised += row["num_supervised"]
        for name, value in row.items():
            self.columns[name].append(value)
        self.written += size
        self.buffered += size
        if len(self.columns["sample_id"]) >= _ROW_GROUP_ROWS or self.buffered >= _ROW_GROUP_BYTES:  # bounded row groups
            self._flush()

    def finish(self) -> IndexFiles:
        if self.writer is None:  # an empty dataset still gets one (empty) index file
            self._next_file()
        self._flush()
        self.writer.close()
        final = []
        for k, part in enumerate(self.parts):
            target = self.out_dir / f"train-{k:05d}-of-{len(self.parts):05d}.parquet"
            part.rename(target)
            final.append(target)
        return IndexFiles(final, self.arrow_bytes, self.supervised)

    def _next_file(self) -> None:
        import pyarrow.parquet as pq

        if self.writer is not None:
            self._flush()
            self.writer.close()
        path = self.out_dir / f".part-{len(self.parts):05d}.parquet"
        self.writer = pq.ParquetWriter(path, self.schema)
        self.parts.append(path)
        self.written = 0

    def _flush(self) -> None:
        import pyarrow as pa

        if not self.columns["sample_id"]:
            return
        table = pa.Table.from_pydict(self.columns, schema=self.schema)
        self.arrow_bytes += table.nbytes
        self.writer.write_table(table)
        for values in self.columns.values():
            values.clear()
        self.buffered = 0


def write_index(dataset: Any, out_dir: Path, *, max_file_bytes: int = DEFAULT_INDEX_FILE_BYTES) -> IndexFiles:
    """Write the index rows of ``dataset`` as ``train-NNNNN-of-NNNNN.parquet`` files.

    Rows are in manifest order; ``shard_file`` is the shard's path relative to the dataset
    directory (= to the uploaded ``hs_shards`` folder). Returns (files, arrow bytes,
    supervised tokens) as :class:`IndexFiles`. The bytes are deterministic for the same
    data and pyarrow version.
    """
    from hs_dataset.formats.index import index_rows

    out_dir.mkdir(parents=True, exist_ok=True)
    parts = _IndexParts(out_dir, max_file_bytes)
    for row in index_rows(dataset):
        parts.add(row)
    return parts.finish()
