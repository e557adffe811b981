"""Exception types. Every message should say what went wrong *and* how to fix it."""

from __future__ import annotations

__all__ = [
    "ALLOW_INCOMPLETE",
    "CaptureError",
    "DiskFullError",
    "DuplicateSampleError",
    "ForeignDatasetError",
    "FormatError",
    "HsDatasetError",
    "HubError",
    "IncompleteDatasetError",
    "IntegrityError",
    "ModelConfigError",
    "NonFiniteStateError",
    "ReadOnlyError",
    "RebuiltDatasetError",
    "RemoteError",
    "SampleError",
    "ServerValidationError",
    "SourceError",
    "UnsafePathError",
    "UnsupportedFormatError",
    "UsageError",
]


class HsDatasetError(Exception):
    """Base class of every error hs_dataset raises on purpose."""


class FormatError(HsDatasetError):
    """A file on disk does not follow docs/FORMAT.md."""


class UnsupportedFormatError(FormatError):
    """The data is newer than this reader (format version or tensor encoding)."""


class IntegrityError(FormatError):
    """Stored bytes disagree with the manifest (hash, size, shape, offsets)."""


class UnsafePathError(IntegrityError):
    """A name from a dataset or record leads outside its directory (``..``, absolute, symlink) or to a non-file."""


class SampleError(HsDatasetError, ValueError):
    """A single sample is unusable (shape, dtype, empty, ...)."""


class DuplicateSampleError(SampleError):
    """The same sample id was written twice in one dataset."""


class NonFiniteStateError(SampleError):
    """A hidden state holds NaN or inf."""


class ForeignDatasetError(HsDatasetError):
    """The output directory already holds a different dataset (or unrelated files)."""


class RebuiltDatasetError(ForeignDatasetError):
    """A followed prefix was deleted and rebuilt: following on would yield its samples again (restart instead)."""


class DiskFullError(HsDatasetError, OSError):
    """The disk filled up; the partial shard was discarded and the manifest is intact."""


class SourceError(HsDatasetError, ValueError):
    """An input row (conversation or pre-tokenized) cannot be turned into a sample."""


class CaptureError(HsDatasetError):
    """A capture backend could not produce states for a sample."""


class ModelConfigError(CaptureError, ValueError):
    """A model's ``config.json`` cannot be read, or holds a size that is missing, mistyped or out of range."""


class ServerValidationError(CaptureError):
    """An SGLang server is unreachable or not set up for capture."""


class UsageError(HsDatasetError, ValueError):
    """Arguments that cannot work (together); the message names the one to change."""


class HubError(HsDatasetError, ConnectionError):
    """The Hugging Face Hub (or the endpoint given) could not be reached."""


class ReadOnlyError(HsDatasetError, PermissionError):
    """A command that writes met a read-only file system or a directory it may not write to."""


class RemoteError(HsDatasetError, OSError):
    """Object storage (an fsspec URL) refused or failed a request: the bucket, the endpoint or the credentials."""


class IncompleteDatasetError(HsDatasetError):
    """A command that shares or combines a dataset met one whose build has not finished (``--allow-incomplete`` overrides)."""


# The flag that overrides IncompleteDatasetError (``allow_incomplete=True`` in Python). Here, not in cli/, because the
# refusal's message names it and is built in formats/build_state.py; here, not there, because the CLI's parser needs it
# without importing hs_dataset.formats (torch).
ALLOW_INCOMPLETE = "--allow-incomplete"
