"""On-disk format: shard writer and reader, manifest, verification and exports (docs/FORMAT.md)."""

from hs_dataset.formats.manifest import FORMAT_NAME, FORMAT_VERSION, Manifest, ShardRecord
from hs_dataset.formats.metadata import DatasetMetadata
from hs_dataset.formats.reader import HiddenStateDataset, ShardReader, open_dataset
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.formats.writer_session import WriterReport

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "DatasetMetadata",
    "HiddenStateDataset",
    "Manifest",
    "ShardReader",
    "ShardRecord",
    "ShardWriter",
    "WriterReport",
    "open_dataset",
]
