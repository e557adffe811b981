"""Exception types. Every message should say what went wrong *and* how to fix it."""

from __future__ import annotations

__all__ = [
    "HsDatasetError",
    "FormatError",
    "UnsupportedFormatError",
    "IntegrityError",
    "SampleError",
    "DuplicateSampleError",
    "NonFiniteStateError",
    "ForeignDatasetError",
    "DiskFullError",
    "SourceError",
    "CaptureError",
    "ServerValidationError",
]


class HsDatasetError(Exception):
    """Base class of every error hs_dataset raises on purpose."""


class FormatError(HsDatasetError):
    """A file on disk does not follow docs/FORMAT.md."""


class UnsupportedFormatError(FormatError):
    """The data is newer than this reader (format version or tensor encoding)."""


class IntegrityError(FormatError):
    """Stored bytes disagree with the manifest (hash, size, shape, offsets)."""


class SampleError(HsDatasetError, ValueError):
    """A single sample is unusable (shape, dtype, empty, ...)."""


class DuplicateSampleError(SampleError):
    """The same sample id was written twice in one dataset."""


class NonFiniteStateError(SampleError):
    """A hidden state holds NaN or inf."""


class ForeignDatasetError(HsDatasetError):
    """The output directory already holds a different dataset (or unrelated files)."""


class DiskFullError(HsDatasetError, OSError):
    """The disk filled up; the partial shard was discarded and the manifest is intact."""


class SourceError(HsDatasetError, ValueError):
    """An input row (conversation or pre-tokenized) cannot be turned into a sample."""


class CaptureError(HsDatasetError):
    """A capture backend could not produce states for a sample."""


class ServerValidationError(CaptureError):
    """An SGLang server is unreachable or not set up for capture."""
