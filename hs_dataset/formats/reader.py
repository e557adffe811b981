"""The one shard reader. Every path that reads stored states goes through here.

``open_dataset(path)`` returns a :class:`HiddenStateDataset`: a sequence (``len``,
indexing, iteration) and a ``torch.utils.data.Dataset``. Items are dicts of
zero-copy views over memory-mapped shards (copy-on-write private mappings: the
file is never modified, and the tensors are writable without warnings). Nothing
is ever unpickled: headers are JSON, tensors are raw bytes.

Cheap checks run when a shard is first opened (size against the manifest, header
shapes and dtypes against the recorded encodings, offsets); ``verify_hashes=True``
also checks each shard's hash (BLAKE3, or sha256 for format-1 shards) on first use.
``hs-dataset verify`` checks everything.
"""

from __future__ import annotations

import bisect
import json
import mmap
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from hs_dataset.codecs.fp8 import SCALE_SUFFIX
from hs_dataset.codecs.registry import get_encoding
from hs_dataset.codecs.safetensors_layout import TensorSpec, parse_header, read_header
from hs_dataset.errors import FormatError, IntegrityError, UnsupportedFormatError
from hs_dataset.formats.encoding import SAFETENSORS_DTYPES, bad_scales, check_tensor_table, decode_state, scale_rule
from hs_dataset.formats.hashing import file_digests, sha256_bytes
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest, ShardRecord
from hs_dataset.formats.metadata import FinalNorm
from hs_dataset.formats.paths import open_member, open_regular, resolve_member
from hs_dataset.formats.repair_record import repair_command
from hs_dataset.formats.shard_layout import (
    AUX_KEY,
    CAPTURE_PATHS_KEY,
    FINAL_KEY,
    INPUT_IDS_KEY,
    LOSS_MASK_KEY,
    NORM_WEIGHT_KEY,
    OFFSETS_KEY,
    SHARD_FORMAT,
    state_keys,
)

__all__ = ["HiddenStateDataset", "ShardReader", "load_norm_weight", "open_dataset"]

_SUPPORTED_SHARD_VERSIONS = {"1"}


def _repair_fix(dataset_root: Path | None) -> str:
    """How a missing or damaged shard is repaired: its samples captured again by the build's own command."""
    command = repair_command(dataset_root) if dataset_root is not None else "hs-dataset repair DATASET_DIR"
    return f"run `{command}` to capture its samples again (same model, card and source), or restore the file from a copy"


class ShardReader:
    """Memory-mapped, validated view of one shard file."""

    def __init__(
        self,
        path: Path,
        *,
        manifest: Manifest,
        record: ShardRecord | None = None,
        verify_hash: bool = False,
        dataset_root: Path | None = None,
    ) -> None:
        """``dataset_root``: the dataset directory, so that a missing or damaged shard's error names the command that repairs it."""
        self.path = Path(path)
        self._fd: int | None = None  # opened on first read_into
        where = str(self.path)
        fix = _repair_fix(dataset_root)
        try:
            f = open_regular(self.path, what="shard")
        except FileNotFoundError:
            raise IntegrityError(f"{where}: shard listed in the manifest is missing; {fix}") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            if record is not None and size != record.bytes:
                raise IntegrityError(
                    f"{where}: {size} bytes on disk but the manifest says {record.bytes} (truncated or replaced shard); {fix}"
                )
            specs, meta, data_start = read_header(f, where)
            if verify_hash and record is not None:
                algorithm = record.hash_algorithm
                digest = file_digests(f, (algorithm,))[algorithm]
                if digest != record.digest:
                    raise IntegrityError(f"{where}: {algorithm} {digest} != manifest {record.digest} (corrupted shard); {fix}")
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
        self._check_metadata(meta, (record.dataset_id if record else None) or manifest.dataset_id, where)
        self.sample_ids: list[str] = self._parse_ids(meta, where)
        self.capture_paths: list[str] | None = self._parse_capture_paths(meta, len(self.sample_ids), where)
        self.specs = specs
        self._data_start = data_start
        self._tensors = {name: self._view(spec, manifest, where) for name, spec in specs.items()}
        self._state_encoding = get_encoding(manifest.state_encoding)
        self.state_keys = state_keys(len(manifest.aux_layer_ids))  # no aux tensor in a dataset of the final state only
        self._empty_aux = (0, manifest.hidden_size)
        self._check_structure(manifest, record, where)
        self.offsets = self._tensors[OFFSETS_KEY]
        if self._state_encoding.scaled:
            self._check_scales(manifest, where)

    # ---- validation --------------------------------------------------------
    @staticmethod
    def _check_metadata(meta: dict[str, str], dataset_id: str, where: str) -> None:
        if meta.get("format") != SHARD_FORMAT:
            raise FormatError(f"{where}: not an hs_dataset shard (format={meta.get('format')!r})")
        if meta.get("format_version") not in _SUPPORTED_SHARD_VERSIONS:
            raise UnsupportedFormatError(
                f"{where}: shard format version {meta.get('format_version')!r} is not supported; upgrade hs_dataset"
            )
        if meta.get("dataset_id") != dataset_id:
            raise IntegrityError(
                f"{where}: shard belongs to dataset {meta.get('dataset_id')!r}, not {dataset_id!r} "
                "(a shard from another dataset was copied here)"
            )

    @staticmethod
    def _parse_ids(meta: dict[str, str], where: str) -> list[str]:
        try:
            ids = json.loads(meta["sample_ids"])
        except (KeyError, ValueError):
            raise FormatError(f"{where}: header has no valid sample_ids list") from None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise FormatError(f"{where}: sample_ids must be a list of strings")
        return ids

    @staticmethod
    def _parse_capture_paths(meta: dict[str, str], n: int, where: str) -> list[str] | None:
        """How each sample was captured (``one_pass``/``prefill``), where the build recorded it; None otherwise."""
        if CAPTURE_PATHS_KEY not in meta:
            return None
        try:
            paths = json.loads(meta[CAPTURE_PATHS_KEY])
        except ValueError:
            paths = None
        if not isinstance(paths, list) or len(paths) != n or not all(isinstance(p, str) and len(p) <= 32 for p in paths):
            raise FormatError(f"{where}: {CAPTURE_PATHS_KEY} must list one short string per sample id")
        return paths

    def _view(self, spec: TensorSpec, manifest: Manifest, where: str) -> torch.Tensor:
        dtype = SAFETENSORS_DTYPES.get(spec.dtype)
        if dtype is None:
            raise UnsupportedFormatError(f"{where}: tensor {spec.name!r} has dtype {spec.dtype!r}, unknown to this reader")
        expected = _expected_storage_dtype(spec.name, manifest)
        if expected is not None and expected != spec.dtype:
            raise IntegrityError(f"{where}: tensor {spec.name!r} is {spec.dtype}, the manifest's encoding stores {expected}")
        itemsize = torch.empty((), dtype=dtype).element_size()
        count = 1
        for d in spec.shape:
            count *= d
        if count * itemsize != spec.nbytes:
            raise FormatError(f"{where}: tensor {spec.name!r} shape {spec.shape} does not match its {spec.nbytes} bytes")
        if count == 0 or self._mmap is None:
            return torch.empty(spec.shape, dtype=dtype)
        flat = torch.frombuffer(self._mmap, dtype=dtype, count=count, offset=self._data_start + spec.begin)
        return flat.view(spec.shape)

    def _check_structure(self, manifest: Manifest, record: ShardRecord | None, where: str) -> None:
        for key in (OFFSETS_KEY, INPUT_IDS_KEY, LOSS_MASK_KEY, *self.state_keys):
            if key not in self._tensors:
                raise FormatError(f"{where}: tensor {key!r} is missing")
        if AUX_KEY not in self.state_keys and AUX_KEY in self._tensors:
            raise IntegrityError(
                f"{where}: holds an aux tensor, but the manifest records no aux layers (the final state only): a shard of "
                "another dataset; restore it from a copy or rebuild the dataset"
            )
        n = len(self.sample_ids)
        offsets = self._tensors[OFFSETS_KEY]
        tokens = self._tensors[INPUT_IDS_KEY].shape[0]
        if offsets.shape != (n + 1,) or int(offsets[0]) != 0 or int(offsets[-1]) != tokens:
            raise IntegrityError(f"{where}: sample_offsets do not span the {tokens} tokens of {n} samples")
        if n and bool((offsets[1:] <= offsets[:-1]).any()):
            bad = int((offsets[1:] <= offsets[:-1]).nonzero()[0])
            raise IntegrityError(f"{where}: sample {self.sample_ids[bad]!r} has no tokens (offsets not increasing)")
        k, h = len(manifest.aux_layer_ids), manifest.hidden_size
        stored = self._state_encoding.stored_shape  # packed encodings store [..., H / pack]
        shapes = {
            LOSS_MASK_KEY: (tokens,),
            AUX_KEY: stored((tokens, k, h)),
            FINAL_KEY: stored((tokens, h)),
        }
        for key, shape in shapes.items():
            if key not in self._tensors:
                continue  # the aux tensor of a dataset of the final state only (checked above)
            if tuple(self._tensors[key].shape) != shape:
                raise IntegrityError(f"{where}: {key} has shape {tuple(self._tensors[key].shape)}, expected {shape}")
        if record is not None and (record.samples != n or record.tokens != tokens):
            raise IntegrityError(f"{where}: holds {n} samples / {tokens} tokens, the manifest says {record.samples} / {record.tokens}")

    def _check_scales(self, manifest: Manifest, where: str) -> None:
        """Every scale must decode to finite values (fp8: finite and > 0, small enough that 448 * scale is finite).

        A damaged scale decodes to inf/NaN/0 rows (or a whole group of them) that no
        NaN scan of the codes would catch, so every scale is checked on open (1/H or
        1/32 of the values: cheap).
        """
        encoding = self._state_encoding
        tokens, k, h = int(self._tensors[INPUT_IDS_KEY].shape[0]), len(manifest.aux_layer_ids), manifest.hidden_size
        shapes = {AUX_KEY: encoding.scale_shape((tokens, k, h)), FINAL_KEY: encoding.scale_shape((tokens, h))}
        for key in self.state_keys:
            shape, name = shapes[key], key + SCALE_SUFFIX
            scale = self._tensors.get(name)
            if scale is None or tuple(scale.shape) != shape:
                got = "missing" if scale is None else f"of shape {tuple(scale.shape)}"
                raise IntegrityError(
                    f"{where}: {name} is {got}, the {encoding.name} encoding needs {encoding.scale_dtype} scales of shape {shape}"
                )
            bad = bad_scales(scale, encoding)
            if bool(bad.any()):
                token = int(bad.reshape(tokens, -1).any(dim=1).nonzero()[0])
                sample = int(torch.searchsorted(self._tensors[OFFSETS_KEY], torch.tensor(token), right=True)) - 1
                value = scale.reshape(tokens, -1)[token][bad.reshape(tokens, -1)[token]][0].item()
                raise IntegrityError(
                    f"{where}: sample {self.sample_ids[sample]!r} has {name} {value} at token {token - int(self._tensors[OFFSETS_KEY][sample])}; "
                    f"{encoding.name} scales must be {scale_rule(encoding)} (damaged shard: restore it or rebuild it)"
                )

    # ---- access --------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.sample_ids)

    def tensor(self, name: str) -> torch.Tensor:
        """A whole stored tensor (all samples concatenated), as a zero-copy view."""
        return self._tensors[name]

    def read_into(self, i: int, name: str, out: memoryview, start: int = 0) -> int:
        """Copy bytes ``[start, start + len(out))`` of sample ``i``'s stored ``name`` into ``out``.

        The copy-out path for consumers that need the bytes in their own buffer (pinned
        memory for a GPU upload, a socket): one ``preadv``, which avoids touching the
        mapping's pages one by one. Returns the number of bytes copied.
        """
        spec = self.specs[name]
        begin, end = self.token_range(i)
        per_token = spec.nbytes // spec.shape[0] if spec.shape and spec.shape[0] else 0
        lo = self._data_start + spec.begin + begin * per_token + start
        hi = self._data_start + spec.begin + end * per_token
        want = max(0, min(len(out), hi - lo))
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        return os.preadv(self._fd, [out[:want]], lo) if want else 0

    def sample_nbytes(self, i: int, name: str) -> int:
        """Stored bytes of sample ``i``'s tensor ``name`` (for :meth:`read_into`)."""
        spec = self.specs[name]
        begin, end = self.token_range(i)
        return (end - begin) * (spec.nbytes // spec.shape[0]) if spec.shape and spec.shape[0] else 0

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def token_range(self, i: int) -> tuple[int, int]:
        if not 0 <= i < len(self.sample_ids):
            raise IndexError(f"{self.path}: sample index {i} out of range for {len(self.sample_ids)} samples")
        return int(self.offsets[i]), int(self.offsets[i + 1])

    def sample(self, i: int) -> dict[str, Any]:
        """Sample ``i``'s tensors; without aux layers ``aux_hidden_states`` is an empty ``[T, 0, H]`` (no bytes stored)."""
        begin, end = self.token_range(i)
        t = self._tensors
        final_scale = t.get(FINAL_KEY + SCALE_SUFFIX)
        return {
            "sample_id": self.sample_ids[i],
            "input_ids": t[INPUT_IDS_KEY][begin:end],
            "loss_mask": t[LOSS_MASK_KEY][begin:end],
            "aux_hidden_states": self._aux(begin, end),
            "final_hidden_state": decode_state(
                t[FINAL_KEY][begin:end], None if final_scale is None else final_scale[begin:end], self._state_encoding
            ),
        }

    def _aux(self, begin: int, end: int) -> torch.Tensor:
        """Tokens ``[begin, end)`` of the aux states, decoded; a zero-width view of nothing when none are stored."""
        if AUX_KEY not in self._tensors:
            return torch.empty((end - begin, *self._empty_aux), dtype=self._state_encoding.decoded_dtype)
        scale = self._tensors.get(AUX_KEY + SCALE_SUFFIX)
        return decode_state(self._tensors[AUX_KEY][begin:end], None if scale is None else scale[begin:end], self._state_encoding)


def _expected_storage_dtype(name: str, manifest: Manifest) -> str | None:
    if name.endswith(SCALE_SUFFIX):
        entry = manifest.tensors.get(name.removesuffix(SCALE_SUFFIX))
        return get_encoding(entry["encoding"]).scale_dtype if entry is not None else None
    entry = manifest.tensors.get(name)
    if entry is None:
        return None
    return get_encoding(entry["encoding"]).storage_dtype


class HiddenStateDataset(torch.utils.data.Dataset, Sequence):
    """All samples of a dataset directory, in manifest order.

    Picklable (only the path and options travel), so it works with
    ``DataLoader(num_workers>0)`` under both fork and spawn; each worker maps the
    shards it touches on first use.
    """

    def __init__(self, root: str | os.PathLike, *, verify_hashes: bool = False, manifest: Manifest | None = None) -> None:
        """``manifest``: one already loaded (a remote dataset's); ``root`` then holds only the files it names besides shards."""
        self.root = Path(root)
        self.verify_hashes = verify_hashes
        self.manifest = manifest if manifest is not None else Manifest.load(self.root)
        check_tensor_table(self.manifest.tensors, str(self.root / MANIFEST_NAME))  # before any read
        self._cumulative = [0]
        for record in self.manifest.shards:
            self._cumulative.append(self._cumulative[-1] + record.samples)
        self._readers: dict[int, ShardReader] = {}
        self._open_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "verify_hashes": self.verify_hashes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], verify_hashes=state["verify_hashes"])

    def __len__(self) -> int:
        return self._cumulative[-1]

    def shard(self, index: int) -> ShardReader:
        """The reader of shard ``index`` (opened and validated on first use)."""
        reader = self._readers.get(index)
        if reader is None:
            with self._open_lock:
                reader = self._readers.get(index)
                if reader is None:
                    reader = self._open_shard(index, self.manifest.shards[index])
                    self._readers[index] = reader
        return reader

    def _open_shard(self, index: int, record: ShardRecord) -> ShardReader:
        """Where a shard's bytes come from: the dataset directory here, a bounded cache for a remote dataset."""
        path = resolve_member(self.root, record.file, what=f"shards[{index}].file")
        return ShardReader(path, manifest=self.manifest, record=record, verify_hash=self.verify_hashes, dataset_root=Path(self.root))

    def shard_offsets(self, index: int) -> torch.Tensor:
        """Shard ``index``'s ``sample_offsets`` (lengths for a packing sampler; a remote dataset reads only these bytes)."""
        return self.shard(index).offsets

    def locate(self, index: int) -> tuple[int, int]:
        """Map a global sample index to (shard index, index within the shard)."""
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"sample index {index} out of range for {n} samples")
        shard = bisect.bisect_right(self._cumulative, index) - 1
        return shard, index - self._cumulative[shard]

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]  # type: ignore[return-value]
        shard, local = self.locate(int(index))
        return self.shard(shard).sample(local)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for shard_index in range(len(self.manifest.shards)):
            reader = self.shard(shard_index)
            for i in range(len(reader)):
                yield reader.sample(i)

    @property
    def sample_ids(self) -> list[str]:
        return [sid for i in range(len(self.manifest.shards)) for sid in self.shard(i).sample_ids]

    def final_norm(self) -> tuple[torch.Tensor, float]:
        """The final norm's (weight, eps) recorded with the data, to derive post-norm states."""
        info = self.manifest.metadata.final_norm
        where = str(self.root / MANIFEST_NAME)
        if info is None or info.weight_file is None:
            raise FormatError(f"{self.root}: the manifest records no final-norm weight")
        eps = info.eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < 1:
            raise FormatError(f"{where}: metadata.final_norm.eps must be a small non-negative number, got {str(eps)[:40]}")
        return load_norm_weight(self.root, info, where=where, hidden_size=self.manifest.hidden_size), float(eps)


MAX_NORM_WEIGHT_BYTES = 64 * 1024 * 1024  # a [H] vector; far above any real model's


def load_norm_weight(
    root: str | os.PathLike, info: FinalNorm | Mapping[str, Any], *, where: str, hidden_size: int | None = None
) -> torch.Tensor:
    """Read the norm weight file named by ``info`` (``weight_file``/``weight_key``/``weight_sha256``) under ``root``.

    ``info`` is the manifest's :class:`FinalNorm` or an export record's ``final_norm`` object.

    The one place such a file is read (datasets and export records): one open (no
    symlinks, inside ``root``), bounded size, sha256 checked when recorded, header
    through the one parser, and a finite ``[hidden_size]`` weight.
    """
    from safetensors.torch import load

    if not isinstance(info, FinalNorm):
        info = FinalNorm.from_json(dict(info), where, "final_norm")
    with open_member(root, info.weight_file, what="final_norm.weight_file", where=where) as f:
        data = f.read(MAX_NORM_WEIGHT_BYTES + 1)
    shown = Path(root) / str(info.weight_file)
    if len(data) > MAX_NORM_WEIGHT_BYTES:
        raise FormatError(f"{shown}: larger than {MAX_NORM_WEIGHT_BYTES} bytes; not a norm weight (replaced file?)")
    expected = info.weight_sha256
    if expected and sha256_bytes(data) != expected:
        raise IntegrityError(f"{shown}: sha256 differs from the manifest (corrupted norm weight); restore it from the model")
    specs, _meta, _start = parse_header(data, len(data), str(shown))
    key = NORM_WEIGHT_KEY if info.weight_key is None else info.weight_key
    if key not in specs:
        raise FormatError(f"{shown}: holds no tensor {str(key)[:80]!r} (final_norm.weight_key in {where})")
    weight = load(data)[key]
    if hidden_size is not None and tuple(weight.shape) != (hidden_size,):
        raise IntegrityError(f"{shown}: norm weight has shape {tuple(weight.shape)}, the data's hidden size is {hidden_size}")
    if weight.is_floating_point() and not bool(torch.isfinite(weight.float()).all()):
        raise IntegrityError(f"{shown}: norm weight holds NaN/inf (corrupted file)")
    return weight


def open_dataset(path: str | os.PathLike, *, verify_hashes: bool = False) -> HiddenStateDataset:
    """Open a dataset directory written by :class:`~hs_dataset.formats.writer.ShardWriter`."""
    return HiddenStateDataset(path, verify_hashes=verify_hashes)
