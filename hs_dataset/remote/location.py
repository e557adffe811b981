"""A dataset URL -> the fsspec filesystem and path that hold it, or one line saying why it cannot be used.

Every remote operation starts here, so a scheme fsspec does not know, or whose package
is not installed, is refused before anything is read or written. Failures of the
storage library itself (an unreachable endpoint, missing credentials) come out as one
:class:`~hs_dataset.errors.RemoteError` line naming the URL, not a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from hs_dataset import strict_json
from hs_dataset.config.remote import RemoteOptions
from hs_dataset.errors import FormatError, HsDatasetError, RemoteError, UsageError
from hs_dataset.formats.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest
from hs_dataset.formats.paths import check_member_name, url_scheme
from hs_dataset.remote.reads import Budget, Deadline, read_range

__all__ = ["SUPPORTED", "RemoteLocation", "is_url", "open_location", "storage_errors"]

SUPPORTED = "s3:// (s3fs), gs:// (gcsfs), hf:// (huggingface_hub), file:// and any other fsspec URL whose package is installed"
_EXTRA = "pip install 'hs_dataset[remote]'"


def is_url(path: object) -> bool:
    """True for ``scheme://...`` (and for such a URL folded by ``Path``, which :func:`open_location` then refuses)."""
    return url_scheme(path) is not None


@contextlib.contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Errors of the storage library (botocore, aiohttp, gcsfs, ...) as one RemoteError line naming ``url``."""
    try:
        yield
    except (HsDatasetError, FileNotFoundError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 -- the storage libraries' own error types are many and unrelated
        kind = type(exc).__name__
        text = " ".join(str(exc).split())[:300] or kind
        raise RemoteError(f"{url}: object storage request failed ({kind}: {text}); check the endpoint, bucket and credentials") from exc


@dataclass(frozen=True)
class RemoteLocation:
    """A directory-like prefix in a filesystem: ``fs`` and ``root`` (fsspec's path, no scheme), and the ``url`` given.

    ``budget`` bounds every request's time (RemoteOptions' request_timeout_s and min_bytes_per_s).
    """

    fs: Any
    root: str
    url: str
    budget: Budget = Budget()

    def key(self, name: str) -> str:
        """The path of member ``name`` (a plain relative name, checked as every dataset member is)."""
        check_member_name(name, what="member", where=self.url)
        return f"{self.root}/{name}"

    @property
    def is_local(self) -> bool:
        """A plain directory (``file://``): objects are files there, written through a temp name."""
        from fsspec.implementations.local import LocalFileSystem

        return isinstance(self.fs, LocalFileSystem)

    def child(self, sub: str) -> RemoteLocation:
        return replace(self, root=self.key(sub), url=f"{self.url}/{sub}")

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``fs.<method>(...)`` (a metadata call: info, ls, rm, copy, pipe_file) within ``timeout_s``.

        fsspec's async filesystems (s3fs, gcsfs, http) cancel the request at the deadline;
        the local ones answer at once.
        """
        if getattr(self.fs, "async_impl", False):
            kwargs["timeout"] = self.budget.timeout_s
        try:
            return getattr(self.fs, method)(*args, **kwargs)
        except TimeoutError:  # fsspec's FSTimeoutError
            raise Deadline(self.budget.timeout_s).expired(f"{self.url} ({method})") from None

    def size(self, name: str) -> int | None:
        """The stored size of ``name``, None when absent."""
        with storage_errors(self.url):
            self.fs.invalidate_cache(self.key(name))  # a listing cached earlier must not hide a newer upload
            try:
                size = self.call("info", self.key(name)).get("size")
            except FileNotFoundError:
                return None
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise RemoteError(
                f"{self.url}/{name}: the store states no size for it ({str(size)[:40]}); hs_dataset reads only stores that do"
            )
        return size

    def read_bytes(self, name: str, limit: int) -> bytes | bytearray | None:
        """The whole of a small member (a manifest, a norm weight), at most ``limit`` bytes; None when absent.

        One GET of at most ``limit + 1`` bytes: an object being replaced is read whole, old
        or new, and a store that sends more (a Range ignored, a body that never ends) is cut there.
        """
        where = f"{self.url}/{name}"
        with storage_errors(where):
            self.fs.invalidate_cache(self.root)
            try:
                data = read_range(self.fs, self.key(name), 0, limit + 1, budget=self.budget, where=where)
            except FileNotFoundError:
                return None
        if len(data) > limit:
            raise FormatError(f"{where}: larger than {limit} bytes; not a file hs_dataset writes (replaced or damaged)")
        return data

    def manifest(self) -> Manifest | None:
        """The dataset's manifest, parsed and checked as a local one is; None when there is none."""
        got = self.manifest_and_bytes()
        return None if got is None else got[0]

    def manifest_and_bytes(self) -> tuple[Manifest, bytes] | None:
        """The manifest and the bytes it was parsed from (one read: a copy of it is the same manifest); None when there is none."""
        data = self.read_bytes(MANIFEST_NAME, MAX_MANIFEST_BYTES)
        if data is None:
            return None
        where = f"{self.url}/{MANIFEST_NAME}"
        try:
            raw = strict_json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise FormatError(f"{where}: not valid JSON ({type(exc).__name__}); the object was edited or damaged") from None
        return Manifest.from_json(raw, where), bytes(data)

    def require_manifest(self) -> Manifest:
        manifest = self.manifest()
        if manifest is None:
            raise FormatError(f"{self.url}: no {MANIFEST_NAME}; this is not an hs_dataset dataset (or nothing was uploaded yet)")
        return manifest


def open_location(url: str | os.PathLike, options: RemoteOptions | None = None) -> RemoteLocation:
    """The filesystem behind ``url``; a scheme that cannot be served here, or a bucket's root, is refused in one line naming it."""
    options = options or RemoteOptions()
    text = os.fspath(url)
    scheme = url_scheme(text)
    if scheme is None:
        raise UsageError(f"{text}: not a URL (scheme://...); local directories are opened as they are")
    if "\x00" in text:
        raise UsageError(f"{text!r:.200}: the URL holds a NUL byte, which no object or file name may hold; give it without")
    text = scheme + text[len(scheme) :]  # schemes are case-insensitive (RFC 3986), fsspec knows them in lower case
    if "://" not in text:
        raise UsageError(f"{text}: a {scheme}:// URL that lost a '/' (a pathlib.Path folds '//'); pass the URL as a string")
    if "::" in text:
        raise UsageError(f"{text}: chained fsspec URLs (with '::') are not supported; give one {SUPPORTED} URL")
    fsspec = _fsspec(text, scheme)
    if scheme not in fsspec.available_protocols():
        raise UsageError(f"{text}: {scheme}:// is not a storage scheme fsspec knows; supported: local paths and {SUPPORTED}")
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as exc:
        raise UsageError(f"{text}: {scheme}:// needs a package that is not installed ({' '.join(str(exc).split())[:200]})") from None
    with storage_errors(text):
        fs, root = fsspec.core.url_to_fs(text, **options.storage_options)
    root = root.rstrip("/")
    if _is_root(fs, root):
        raise UsageError(f"{text}: give a prefix inside the bucket or directory (e.g. {scheme}://bucket/datasets/name), not its root")
    return RemoteLocation(fs, root, text.rstrip("/"), Budget(options.request_timeout_s, options.min_bytes_per_s))


def _is_root(fs: Any, root: str) -> bool:
    """A filesystem's or a bucket's root (``s3://bucket``, ``http://host/``): a dataset lives under a prefix inside it."""
    from fsspec.implementations.local import LocalFileSystem

    stripped = root.strip("/")
    if not stripped or root == fs.root_marker:
        return True
    if isinstance(fs, LocalFileSystem):
        return False
    if root.startswith(("http://", "https://")):
        return not urlsplit(root).path.strip("/")
    return "/" not in stripped  # the first component of an object store's path is its bucket


def _fsspec(url: str, scheme: str):
    try:
        import fsspec
        import fsspec.core
    except ImportError:
        raise UsageError(f"{url}: {scheme}:// URLs need fsspec: {_EXTRA}") from None
    return fsspec
