"""The per-request dump contract between the server hook and the client (docs/SGLANG.md).

Stdlib only, so both sides (scheduler processes and the builder) share one definition.

* ``{staging}/{rid}.safetensors``: tensors ``input_ids`` int64 ``[T]``,
  ``aux_hidden_states`` ``[T, K, H]`` (model dtype, K in ascending HF index order),
  ``final_hidden_state`` ``[T, H]`` (pre-norm); ``__metadata__`` with the keys of
  :data:`REQUIRED_METADATA`.
* with fp8 staging (``state_encoding`` metadata ``fp8_e4m3_per_token``, see
  :func:`quantize_fp8_per_token`): both states are float8 e4m3 and two more tensors
  hold their float32 per-token scales, ``aux_hidden_states.scale`` ``[T, K]`` and
  ``final_hidden_state.scale`` ``[T]``; ``dtype`` still names the model dtype the
  states decode to. Without the key (or ``native``) the states are the model dtype.
* the file is a standard safetensors file; :func:`dump_header` builds the exact
  header ``safetensors.torch.save`` would, so the server can write the tensor bytes
  straight from host memory behind it.
* ``{staging}/{rid}.refused.json``: ``{"rid": ..., "reason": ...}`` -- the server saw the
  request but will not store it (partial prompt, staging full, wrong set-up...).
* Names starting with ``.`` are in-progress temporary files; readers ignore them.
* ``{staging}/.spares/<size hex>-<32 hex>``: a dump the client has read, handed back with
  :func:`hand_back_dump` instead of being deleted. The server claims one (rename),
  truncates it to the next dump's size and writes over its pages: a dump's round trip
  through pages tmpfs already holds costs a third to a half of one through fresh pages, allocated,
  zeroed and later freed (benchmarks/bench_staging_pool.py). The pool has its own
  directory, so neither side scans the dumps waiting beside it; it is capped by
  :data:`SPARE_MAX_FILES` / :data:`SPARE_MAX_BYTES`, and the server's sweeper deletes
  spares nobody claimed within a sweep interval. The name carries the size
  (:func:`spare_name`), so neither side stats the spares to weigh the pool; a name
  without it (an older client) is weighed by stat.

Request ids are ``hs-<run>-<seq>-<T>``: ``<run>`` 1-32 of ``[a-z0-9]``, ``<seq>`` a
request counter, ``<T>`` the prompt's token count (the server needs it to know when a
chunked prefill is complete). :func:`validate_rid` is the one gate before a rid is used
in a file name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import struct
import uuid
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:  # torch is imported lazily: this module stays importable with the stdlib alone
    import torch

from hs_dataset.errors import HsDatasetError
from hs_dataset.server_patch.layer_outputs import decoder_layer_for, layer_hooks_problem  # re-exported: the client's door
from hs_dataset.server_patch.mapped_files import FileMaps, copy_out  # re-exported: the client reads dumps through kept mappings too

__all__ = [
    "DUMP_FORMAT",
    "DUMP_VERSION",
    "DUMP_SUFFIX",
    "REFUSED_SUFFIX",
    "TMP_PREFIX",
    "SPARE_DIR",
    "SPARE_MAX_FILES",
    "SPARE_MAX_BYTES",
    "REFUSED_STAGING_FULL",
    "REFUSED_NO_HOST_BUFFER",
    "REFUSED_WRITE_FAILED",
    "RETRYABLE_REFUSALS",
    "hand_back_dump",
    "spare_name",
    "spare_size",
    "FileMaps",
    "copy_out",
    "RID_RE",
    "REQUIRED_METADATA",
    "validate_rid",
    "make_rid",
    "rid_num_tokens",
    "dump_name",
    "refused_name",
    "CONTENT_KEY_PREFIX",
    "content_key",
    "STATE_ENCODING_KEY",
    "FP8_ENCODING",
    "FP8_MAX",
    "SCALE_SUFFIX",
    "quantize_fp8_per_token",
    "dequantize_fp8_per_token",
    "dump_header",
    "parse_version",
    "SUPPORTED",
    "UnsupportedVersionError",
    "support_for",
    "StagingError",
    "check_private_dir",
    "ensure_private_dir",
    "LayerIdError",
    "model_family",
    "validate_hf_ids",
    "sglang_eagle3_ids",
    "captured_hf_ids",
    "layer_hook_targets",
    "decoder_layer_for",
    "layer_hooks_problem",
]

DUMP_FORMAT = "hs_dataset.dump"
DUMP_VERSION = "1"
DUMP_SUFFIX = ".safetensors"
REFUSED_SUFFIX = ".refused.json"
TMP_PREFIX = ".tmp-"
SPARE_DIR = ".spares"  # inside the staging dir; made by the first client that hands a dump back
SPARE_MAX_FILES = 32  # spare dumps a client leaves for the server to write over (per staging dir)
SPARE_MAX_BYTES = 1 << 30  # ... and their bytes: memory tmpfs keeps holding for the next dumps
# Refusals that may clear on their own, so the client retries them: each such reason starts with one of these.
REFUSED_STAGING_FULL = "staging full"
REFUSED_NO_HOST_BUFFER = "no host buffer of the capture pool freed up in time"
REFUSED_WRITE_FAILED = "server could not write the dump"
RETRYABLE_REFUSALS = (REFUSED_STAGING_FULL, REFUSED_NO_HOST_BUFFER, REFUSED_WRITE_FAILED)
REQUIRED_METADATA = ("format", "version", "rid", "hf_aux_layer_ids", "final_state", "sglang_version", "dtype")

RID_RE = re.compile(r"\Ahs-(?P<run>[a-z0-9]{1,32})-(?P<seq>[0-9]{1,12})-(?P<tokens>[1-9][0-9]{0,8})\Z")
_RUN_RE = re.compile(r"\A[a-z0-9]{1,32}\Z")


def validate_rid(rid: object) -> str:
    """Return ``rid`` if it is one of ours and safe as a file name; raise ``ValueError`` otherwise."""
    if not isinstance(rid, str) or RID_RE.match(rid) is None:
        raise ValueError(f"not a valid hs_dataset request id: {rid!r} (expected hs-<run>-<seq>-<tokens>)")
    return rid


def make_rid(run: str, seq: int, num_tokens: int) -> str:
    if not _RUN_RE.match(run):
        raise ValueError(f"run id must be 1-32 characters of [a-z0-9], got {run!r}")
    return validate_rid(f"hs-{run}-{int(seq)}-{int(num_tokens)}")


def rid_num_tokens(rid: str) -> int:
    """The prompt length encoded in a valid rid."""
    m = RID_RE.match(rid)
    if m is None:
        raise ValueError(f"not a valid hs_dataset request id: {rid!r}")
    return int(m.group("tokens"))


def dump_name(rid: str) -> str:
    return validate_rid(rid) + DUMP_SUFFIX


def refused_name(rid: str) -> str:
    return validate_rid(rid) + REFUSED_SUFFIX


def hand_back_dump(path: str) -> None:
    """The client is done with a dump: move it into the spare pool, or delete it if the pool is full.

    The caller has copied what it needs (the client reads each dump into its own
    memory), so the server may overwrite the file from now on. A missing file is fine
    (swept, or never written).
    """
    try:
        size = os.stat(path, follow_symlinks=False).st_size
    except FileNotFoundError:
        return
    pool = os.path.join(os.path.dirname(path) or ".", SPARE_DIR)
    if _pool_has_room(pool, size):
        try:
            os.rename(path, os.path.join(pool, spare_name(size)))
            return
        except OSError:
            pass
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def spare_name(size: int) -> str:
    """A spare's name in the pool: its size in hex, ``-``, 32 random hex digits.

    Why the size: both sides weigh the pool on every dump (the client against its caps,
    the server for the spare closest in size), and a stat per spare hands the GIL back
    once per file -- on the server, next to the forward thread. The name is a hint
    only: the server sizes what it claims by ``fstat`` and ``ftruncate``, and the
    pool is private to one user.
    """
    return f"{size:x}-{uuid.uuid4().hex}"


def spare_size(entry: os.DirEntry) -> int:
    """A spare's size from its name (:func:`spare_name`), or by stat where the name does not say it (older clients)."""
    head, sep, tail = entry.name.partition("-")
    if sep and len(tail) == 32 and 0 < len(head) <= 16:
        try:
            return int(head, 16)
        except ValueError:
            pass
    return entry.stat(follow_symlinks=False).st_size


def _pool_has_room(pool: str, size: int) -> bool:
    """Whether ``pool`` is (or now is) a private directory of ours with room for ``size`` more bytes."""
    try:
        os.mkdir(pool, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        check_private_dir(pool)
        files = held = 0
        with os.scandir(pool) as entries:
            for entry in entries:
                files += 1
                held += spare_size(entry)
    except (OSError, StagingError):
        return False
    return files < SPARE_MAX_FILES and held + size <= SPARE_MAX_BYTES


# ---------------------------------------------------------------- fp8 states: the one quantizer
STATE_ENCODING_KEY = "state_encoding"  # dump metadata key; absent or "native" = model dtype
FP8_ENCODING = "fp8_e4m3_per_token"
FP8_MAX = 448.0  # largest finite float8_e4m3fn
SCALE_SUFFIX = ".scale"


def quantize_fp8_per_token(x: "torch.Tensor") -> "tuple[torch.Tensor, torch.Tensor]":
    """``x [..., H]`` -> (float8_e4m3fn data ``[..., H]``, float32 scale ``[...]``), on x's device.

    The one implementation of the ``fp8_e4m3_per_token`` encoding: the server runs it
    on the GPU before the device-to-host copy (half the PCIe and staging bytes of
    bf16) and ``formats.encoding.encode_state`` runs it on the host, so a dataset's
    bytes do not depend on where the states were quantized (every step is IEEE
    exact or correctly rounded on both). It lives here because ``server_patch`` may
    import only itself, and the client side already imports this module.
    """
    import torch

    # max |x| per token, exactly, in one read of x (abs then amax of a float32 copy read
    # and wrote the states three more times: on the GPU the quantizer is memory-bound)
    low, high = torch.aminmax(x, dim=-1)
    amax = torch.maximum(-low, high).float()
    # amax / a tensor, not / a Python number: CUDA turns division by a scalar into a
    # multiplication by its reciprocal, which differs in the last bit from the host's
    # division; tensor / tensor is IEEE division on both.
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    # x / scale promotes to float32 inside the one kernel (x's values are exact there)
    data = torch.div(x, scale.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return data.contiguous(), scale.contiguous()


def dequantize_fp8_per_token(data: "torch.Tensor", scale: "torch.Tensor", dtype: "torch.dtype") -> "torch.Tensor":
    """Inverse of :func:`quantize_fp8_per_token`, back to ``dtype``."""
    return (data.float() * scale.unsqueeze(-1)).to(dtype)


# safetensors dtype codes of the dump's tensors, ranked the way safetensors orders
# tensors in a file (its Dtype enum, descending; ties by name) -- so that
# :func:`dump_header` lays out the bytes exactly as ``safetensors.torch.save`` does.
_DUMP_DTYPE_RANK = {"BOOL": 0, "U8": 4, "I8": 5, "F8_E5M2": 6, "F8_E4M3": 7, "I16": 9, "U16": 10, "F16": 11, "BF16": 12, "I32": 13, "U32": 14, "F32": 15, "F64": 17, "I64": 18, "U64": 19}


def dump_header(tensors: Sequence[tuple[str, str, Sequence[int], int]], metadata: dict[str, str]) -> tuple[bytes, list[str]]:
    """The safetensors prefix (length + JSON header + padding) for ``(name, dtype code, shape, nbytes)``.

    Returns the prefix and the tensor names in the order their bytes must follow it
    (safetensors' order: dtype rank descending, then name). The JSON is what
    ``safetensors.torch.save`` writes for the same metadata (in the dict's order) and
    tensors, byte for byte, so a dump written as prefix + raw tensor bytes needs no
    serialization copy and is read by the same reader.
    """
    order = sorted(tensors, key=lambda t: (-_DUMP_DTYPE_RANK[t[1]], t[0]))
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, dtype, shape, nbytes in order:
        header[name] = {"dtype": dtype, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + int(nbytes)]}
        offset += int(nbytes)
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body, [t[0] for t in order]


# ---------------------------------------------------------------- keys without request ids
CONTENT_KEY_PREFIX = "ck-"


def content_key(input_ids: Sequence[int]) -> str:
    """File stem used when the server cannot tell request ids (SGLang < 0.5.15): ``ck-`` + sha256 of the ids.

    The ids are hashed as little-endian int64; the client computes the same key.
    """
    tolist = getattr(input_ids, "tolist", None)  # a tensor, without importing torch here
    values = [int(i) for i in (tolist() if tolist is not None else input_ids)]
    data = struct.pack("<%dq" % len(values), *values)
    return CONTENT_KEY_PREFIX + hashlib.sha256(data).hexdigest()[:40]


# ---------------------------------------------------------------- supported SGLang versions
def parse_version(version: str) -> tuple[int, int, int]:
    """``"0.5.23"`` / ``"0.5.23.post1"`` / ``"0.5.5rc2"`` -> ``(0, 5, 23)``."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if not m:
        raise ValueError(f"cannot parse a version from {version!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


# (lowest, highest-exclusive, mechanism, status)
SUPPORTED: list[tuple[tuple[int, int, int], tuple[int, int, int], str, str]] = [
    ((0, 5, 23), (0, 6, 0), "aux_return", "verified (0.5.23, CPU, tiny DeepseekV3, float32)"),
    ((0, 5, 15), (0, 5, 23), "layer_hooks", "read from source, not run (request ids available)"),
    ((0, 5, 9), (0, 5, 15), "layer_hooks", "read from source, not run (no request ids: dumps keyed by content)"),
]


class UnsupportedVersionError(HsDatasetError, ValueError):
    """This SGLang version cannot be captured from (the message names the fix)."""


def support_for(version: str) -> tuple[str, str]:
    """(mechanism, status) for an SGLang version; raises :class:`UnsupportedVersionError` if unsupported."""
    v = parse_version(version)
    for low, high, mechanism, status in SUPPORTED:
        if low <= v < high:
            return mechanism, status
    if v <= (0, 5, 5):
        raise UnsupportedVersionError(
            f"SGLang {version} has no forward hooks: patch it with `hs-dataset patch apply` and start it with "
            "HS_CAPTURE_STAGING_DIR / HS_CAPTURE_LAYER_IDS set (docs/SGLANG.md, 'SGLang <= 0.5.5')"
        )
    supported = ", ".join(f"{'.'.join(map(str, lo))} <= v < {'.'.join(map(str, hi))}" for lo, hi, _, _ in SUPPORTED)
    raise UnsupportedVersionError(f"SGLang {version} is not supported by this hs_dataset (supported: {supported})")


# ---------------------------------------------------------------- the staging directory
class StagingError(HsDatasetError, RuntimeError):
    """The staging directory is unsafe or unusable."""


def check_private_dir(path: str) -> os.stat_result:
    """Raise :class:`StagingError` unless ``path`` is a real directory, ours, mode ``0700`` (or stricter)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise StagingError(f"staging directory {path} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise StagingError(f"staging directory {path} is a symlink; refusing it (use a real, private directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise StagingError(f"staging path {path} exists and is not a directory")
    if st.st_uid != os.geteuid():
        raise StagingError(
            f"staging directory {path} is owned by uid {st.st_uid}, not by this user ({os.geteuid()}); "
            "use a directory of your own (or remove it so it is created afresh)"
        )
    if st.st_mode & 0o077:
        raise StagingError(
            f"staging directory {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be private (0700): "
            f"run `chmod 700 {path}` or choose another directory"
        )
    return st


# ---------------------------------------------------------------- layer ids: HF hidden_states <-> SGLang
# Translate our aux layer ids (HF ``hidden_states`` indexes) into what SGLang needs.
#
# Runs on both sides (client, ``hs-dataset serve``, scheduler processes): stdlib only.
#
# Our convention (the dataset's): aux id ``i`` is transformers'
# ``output_hidden_states[i]`` -- ``0`` is the embedding output and ``i >= 1`` the output
# of decoder layer ``i - 1`` (the pre-norm residual stream entering layer ``i``). The
# last entry of transformers' tuple, ``hidden_states[N]``, is *post*-norm and is not an
# aux id here: the final state is captured separately (pre-norm).
#
# SGLang captures "at layer ``c``" = the stream entering layer ``c`` = HF index ``c``.
# What it does with the ids it is given differs by version and model family:
#
# =====================  ====================================  ==========================
# SGLang                  DeepseekV2/V3 (Kimi-K2, K2.5)          Llama / Qwen2/3 (+MoE)
# =====================  ====================================  ==========================
# 0.5.15 - 0.5.23         ``+1`` only when the first id is 1     always ``+1``
# <= 0.5.9 (0.5.5 read)   always ``+1``                          always ``+1``
# =====================  ====================================  ==========================
#
# So some HF indexes cannot be asked for on some set-ups (e.g. a first id of 1 on
# DeepseekV3 0.5.15+, or id 0 wherever SGLang always adds 1); those raise
# :class:`LayerIdError` with the reason, instead of silently capturing a neighbour.


_DEEPSEEK_ARCHS = {
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "KimiK25ForConditionalGeneration",
}
_SHIFT_ALWAYS_ARCHS_PREFIXES = ("Llama", "Qwen2", "Qwen3", "Mistral")


class LayerIdError(HsDatasetError, ValueError):
    """An aux layer id cannot be captured on this model / SGLang version."""


def model_family(architectures: Sequence[str] | str | None) -> str:
    """``"deepseek"``, ``"llama"`` (the always-+1 family) or ``"unknown"``."""
    if isinstance(architectures, str):
        architectures = [architectures]
    for arch in architectures or ():
        if arch in _DEEPSEEK_ARCHS:
            return "deepseek"
        if arch.startswith(_SHIFT_ALWAYS_ARCHS_PREFIXES):
            return "llama"
    return "unknown"


def validate_hf_ids(hf_ids: Iterable[int], num_hidden_layers: int) -> list[int]:
    """Check ids are ints, strictly ascending, and within ``[0, num_hidden_layers - 1]``."""
    ids = list(hf_ids)
    if not ids:
        raise LayerIdError("aux layer ids must not be empty")
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise LayerIdError(f"aux layer ids must be integers, got {ids!r}")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise LayerIdError(f"aux layer ids must be strictly ascending, got {ids}")
    if ids[0] < 0:
        raise LayerIdError(f"aux layer ids must be >= 0, got {ids}")
    if ids[-1] > num_hidden_layers - 1:
        raise LayerIdError(
            f"aux layer id {ids[-1]} is out of range for a model with {num_hidden_layers} decoder layers: "
            f"HF hidden_states[{num_hidden_layers}] is the post-norm final state, and SGLang can only capture "
            f"the stream entering a layer (ids 0..{num_hidden_layers - 1})"
        )
    return ids


def _shifts_when_first_is_one(family: str, version: tuple[int, int, int]) -> bool:
    return family == "deepseek" and version >= (0, 5, 15)


def sglang_eagle3_ids(
    hf_ids: Sequence[int], architectures: Sequence[str] | str, sglang_version: str, num_hidden_layers: int
) -> list[int]:
    """The ``--return-aux-hidden-state-layer-ids`` (EAGLE3 convention) that capture ``hf_ids``.

    Raises :class:`LayerIdError` when no argument captures exactly those indexes.
    """
    ids = validate_hf_ids(hf_ids, num_hidden_layers)
    family = model_family(architectures)
    version = parse_version(sglang_version)
    if family == "unknown":
        raise LayerIdError(
            f"no known SGLang layer-id convention for architectures {architectures!r}; "
            "supported: DeepseekV2/V3, Kimi-K2/K2.5, Llama, Qwen2/3"
        )
    if _shifts_when_first_is_one(family, version):
        if ids[0] == 1:
            raise LayerIdError(
                f"HF aux ids {ids} start with 1: SGLang {sglang_version} DeepseekV2/V3 adds 1 to every id when the "
                "first is 1 (giving hidden_states[2]...) and uses ids as given otherwise, so hidden_states[1] "
                "cannot be the first aux layer; choose another first layer (e.g. 0 or 2)"
            )
        # Passed as given (a first id of 2 is kept; passing 1, ... would also give 2, ...).
        return list(ids)
    # Always +1 (Llama/Qwen on every version, DeepseekV2 before 0.5.15).
    if ids[0] == 0:
        raise LayerIdError(
            f"HF aux id 0 (the embedding output) cannot be captured on {family} with SGLang {sglang_version}: "
            "it adds 1 to every EAGLE3 layer id"
        )
    return [i - 1 for i in ids]


def captured_hf_ids(
    sglang_ids: Sequence[int], architectures: Sequence[str] | str, sglang_version: str
) -> list[int]:
    """Inverse of :func:`sglang_eagle3_ids`: which HF indexes SGLang captures for ``sglang_ids``."""
    family = model_family(architectures)
    version = parse_version(sglang_version)
    ids = list(sglang_ids)
    if family == "unknown":
        raise LayerIdError(f"no known SGLang layer-id convention for architectures {architectures!r}")
    if _shifts_when_first_is_one(family, version):
        return [i + 1 for i in ids] if ids and ids[0] == 1 else ids
    return [i + 1 for i in ids]


def layer_hook_targets(hf_ids: Sequence[int], module_path: str, num_hidden_layers: int) -> dict[str, int]:
    """Module names whose forward-hook output is HF ``hidden_states[i]``, for the layer-hook mechanism.

    ``hidden_states[0]`` is the output of ``{module_path}.embed_tokens``; ``hidden_states[i]``
    (``i >= 1``) the output of ``{module_path}.layers.{i-1}`` (with its residual added back
    when the layer returns ``(hidden, residual)``).
    """
    ids = validate_hf_ids(hf_ids, num_hidden_layers)
    targets: dict[str, int] = {}
    for i in ids:
        name = f"{module_path}.embed_tokens" if i == 0 else f"{module_path}.layers.{i - 1}"
        targets[name] = i
    return targets


def ensure_private_dir(path: str) -> str:
    """Create ``path`` with mode 0700 (parents as needed), or check an existing one. Returns the abspath."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    try:
        os.mkdir(path, 0o700)  # the umask can only remove bits: never wider than 0700
    except FileExistsError:
        pass
    check_private_dir(path)
    return path
