"""One request's dump on the client side: waiting for it, reading it, and checking it against the sample sent.

The server writes ``{key}.safetensors`` (or a ``{key}.refused.json`` marker) into its
staging directory (``server_patch/contract/dump.py`` is the contract). What comes out of here is a
:class:`~hs_dataset.sample.CapturedSample`, a :class:`~hs_dataset.capture.base.CaptureFailure`
naming what did not match, a :class:`Refusal`, or :class:`DumpLost` when nothing appeared.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hs_dataset.capture.base import CaptureFailure, CaptureResult
from hs_dataset.capture.sglang.diagnose import CaptureStopped
from hs_dataset.codecs.fp8 import SCALE_SUFFIX, STATE_ENCODING_KEY
from hs_dataset.codecs.registry import ENCODINGS, Encoding
from hs_dataset.codecs.safetensors_layout import DTYPE_SIZES, TensorSpec, read_header
from hs_dataset.errors import CaptureError
from hs_dataset.formats.encoding import SAFETENSORS_DTYPES, all_finite
from hs_dataset.host_buffers import HostBufferPool
from hs_dataset.model.model_config import FIELD_RANGES
from hs_dataset.sample import CapturedSample, TokenizedSample
from hs_dataset.server_patch.contract.dump import DUMP_FORMAT, DUMP_SUFFIX, DUMP_VERSION, REFUSED_SUFFIX
from hs_dataset.server_patch.contract.mapped_files import FileMaps, copy_out
from hs_dataset.server_patch.contract.spares import hand_back_dump
from hs_dataset.server_patch.contract.staged_file import StagedFileError, open_staged, read_staged

__all__ = [
    "MAX_HIDDEN",
    "DumpLost",
    "ExpectedDump",
    "HeaderRefused",
    "Refusal",
    "await_dump",
    "check_dump",
    "delete_staged",
    "encoding_problem",
    "metadata_problem",
    "prune_mappings",
    "read_dump",
    "scaled_encoding",
    "take_refusal",
]

_READ_BUFFERS = HostBufferPool()  # one per process: every backend's dump reads reuse it
_DUMP_MAPS = FileMaps(writable=False)  # one per process: the dump files going round the spare pool, each mapped once
MAX_DUMP_HEADER_BYTES = 1 << 20  # a dump's header names five tensors and a few metadata keys: a few KiB
MAX_REFUSAL_BYTES = 64 * 1024  # a refusal marker is one reason line
MAX_HIDDEN = FIELD_RANGES["hidden_size"][1]  # the widest state a dump may declare when the model's is not known yet


@dataclass(frozen=True)
class ExpectedDump:
    """What a dump must hold: these HF aux layers, states of this dtype (``None``: any) and hidden size (``None``: any)."""

    aux_layer_ids: tuple[int, ...]
    dtype: torch.dtype | None = None
    hidden_size: int | None = None


@dataclass(frozen=True)
class Refusal:
    """The server's marker instead of a dump: why it stored nothing for the request."""

    reason: str


class DumpLost(CaptureError):
    """The server answered the request, but its dump did not appear in time."""


async def await_dump(
    staging_dir: str,
    key: str,
    sample: TokenizedSample,
    expected: ExpectedDump,
    timeout_s: float,
    *,
    explain: Callable[[], str | None] | None = None,
    grace_s: float = 3.0,
) -> CaptureResult | Refusal:
    """Poll ``staging_dir`` for the dump (or refusal) of request ``key``; read and check it off the event loop.

    A dump read is handed back to the server's spare pool (it may write the next dump
    over it) whatever the check found; raises :class:`DumpLost` after ``timeout_s``.
    Once the dump is ``grace_s`` late, ``explain()`` is asked (twice a second) whether
    the server can no longer write it; a cause it names raises :class:`CaptureStopped`.
    """
    dump = os.path.join(staging_dir, key + DUMP_SUFFIX)
    refused = os.path.join(staging_dir, key + REFUSED_SUFFIX)
    started = time.monotonic()
    deadline = started + timeout_s
    next_look = started + min(grace_s, timeout_s)
    delay = 0.002
    while True:
        if os.path.lexists(dump):  # whatever is there, a link or a FIFO too, is read (and refused) at once
            loop = asyncio.get_running_loop()
            try:
                return await loop.run_in_executor(None, check_dump, dump, key, sample, expected)
            finally:
                hand_back_dump(dump)  # read into our memory: the server may write the next dump over it
                _unlink_if_present(refused)
        if os.path.lexists(refused):
            return take_refusal(refused)
        now = time.monotonic()
        if explain is not None and now >= next_look:
            next_look = now + 0.5
            cause = explain()
            if cause is not None:
                raise CaptureStopped(cause)
        if now > deadline:
            raise DumpLost(
                f"no dump for {key} in {staging_dir} within {timeout_s:.0f} s after the server answered "
                "(server-side capture failed or is too slow: see its log)"
            )
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.05)


def take_refusal(path: str) -> Refusal:
    """Read a refusal marker (a small regular file, never waited on) and delete it."""
    try:
        marker = json.loads(read_staged(path, MAX_REFUSAL_BYTES))
        reason = (
            str(marker.get("reason", "no reason given"))[:1000] if isinstance(marker, dict) else "a refusal marker that is not an object"
        )
    except (OSError, ValueError, RecursionError) as exc:
        reason = f"unreadable refusal marker ({exc})"
    _unlink_if_present(path)
    return Refusal(reason)


def _unlink_if_present(path: str) -> None:
    try:
        os.unlink(path)
    except (FileNotFoundError, IsADirectoryError):  # a directory planted at the name is refused, and left alone
        pass


def delete_staged(staging_dir: str | None, key: str) -> None:
    """Remove a request's dump and refusal marker from a staging dir, if present."""
    if not staging_dir:
        return
    for suffix in (DUMP_SUFFIX, REFUSED_SUFFIX):
        _unlink_if_present(os.path.join(staging_dir, key + suffix))


def prune_mappings() -> None:
    """Unmap the dumps and spares deleted since they were mapped: their memory goes back now."""
    _DUMP_MAPS.prune()


# ---------------------------------------------------------------------------- reading


Admit = Callable[[dict[str, TensorSpec], dict[str, str]], "str | None"]


class HeaderRefused(CaptureError):
    """The dump's header does not describe the request's states: nothing of its data was read."""


def read_dump(path: str, admit: Admit | None = None) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """Read a dump as the untrusted file it is; returns (metadata, tensors).

    The file must be a regular one (:func:`open_staged`: no FIFO, no symlink); its header
    (at most :data:`MAX_DUMP_HEADER_BYTES`) goes through the one safetensors header parser
    (bounds, offsets, known dtypes, sizes, tensors tiling the data exactly) and then
    ``admit`` (the request's own shapes; :func:`check_dump` always passes one), so a file declaring more than the request can
    hold is refused before a byte of its data is read. The data is then copied once (no
    GIL held) into one buffer whose slices are the tensors: through the mapping kept of
    the file from its earlier rounds (``mapped_files``), or with ``readinto`` the first
    time a file is seen (it is mapped then, for its next round) and where no mapping can
    be made. Decoding a bytes object with safetensors instead would make two more copies
    under the GIL. The buffer is leased from a pool of memory already touched
    (``host_buffers``), and comes back when the sample's tensors are gone.
    """
    fd, st = open_staged(path)
    with os.fdopen(fd, "rb", buffering=0) as f:
        specs, metadata, start = read_header(f, path, MAX_DUMP_HEADER_BYTES)
        problem = admit(specs, metadata) if admit is not None else None
        if problem:
            raise HeaderRefused(problem)
        data = _READ_BUFFERS.lease(st.st_size - start)
        view = memoryview(data.numpy())
        with _DUMP_MAPS.mapped(fd, st.st_size, kept_only=True, file_stat=st) as address:
            if address is not None:
                copy_out(address, start, view)
            else:
                _read_into(f, view, path)
    tensors = {}
    for name, spec in specs.items():
        dtype = SAFETENSORS_DTYPES.get(spec.dtype)
        if dtype is None:
            raise ValueError(f"tensor {name!r} has dtype {spec.dtype}, which no dump holds")
        raw = data[spec.begin : spec.end]
        if spec.begin % DTYPE_SIZES[spec.dtype]:  # not from our server (it aligns every tensor): copy to align
            raw = raw.clone()
        tensors[name] = raw.view(dtype).view(spec.shape)
    return metadata, tensors


def _read_into(f, view: memoryview, path: str) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise OSError(f"{path}: file shrank while being read")
        got += n


# ---------------------------------------------------------------------------- checking


def check_dump(path: str, key: str, sample: TokenizedSample, expected: ExpectedDump) -> CaptureResult:
    """Read the dump of request ``key`` and check it holds ``sample``'s states as ``expected``; never a partial sample."""
    sid = sample.sample_id
    try:
        meta, tensors = read_dump(
            path,
            lambda specs, meta: metadata_problem(meta, f"dump {key}", key, expected) or _header_problem(specs, meta, key, sample, expected),
        )
    except HeaderRefused as exc:
        return CaptureFailure(sid, str(exc))
    except StagedFileError as exc:
        return CaptureFailure(sid, f"unreadable dump {key}: {exc}")
    except Exception as exc:
        return CaptureFailure(sid, f"unreadable dump {key}: {type(exc).__name__}: {exc}")
    problem = _shape_problem(meta, tensors, key, sample, expected) or encoding_problem(meta, tensors, key, expected)
    if problem:
        return CaptureFailure(sid, problem)
    aux, final = tensors["aux_hidden_states"], tensors["final_hidden_state"]
    encoded = scaled_encoding(meta) is not None  # quantized on the server's GPU: handed to the writer as stored
    # Checked here, on this loader thread while the bytes are in cache; all_finite remembers the
    # answer, so the writer's one adding thread does not scan them again (a NaN is still its to report).
    all_finite(aux) and all_finite(final)
    return CapturedSample(
        sample_id=sid,
        input_ids=sample.input_ids,
        loss_mask=sample.loss_mask,
        aux_hidden_states=aux,
        final_hidden_state=final,
        aux_scale=tensors["aux_hidden_states" + SCALE_SUFFIX] if encoded else None,
        final_scale=tensors["final_hidden_state" + SCALE_SUFFIX] if encoded else None,
    )


def scaled_encoding(meta: dict[str, str]) -> Encoding | None:
    """The scaled encoding (fp8, 4-bit) the server stored the dump's states in; None for native states or an unknown name."""
    encoding = ENCODINGS.get(meta.get(STATE_ENCODING_KEY, "native"))
    return encoding if encoding is not None and encoding.scaled else None


def metadata_problem(meta: dict[str, str], what: str, rid: str, expected: ExpectedDump, capture_path: str | None = None) -> str | None:
    """What is wrong with a dump's or a one-pass piece's header metadata (None: nothing), before any tensor is read:
    its format, the request it names (and, for a piece, ``capture_path``), the final state's kind and the layers.

    The one check of both files' metadata; ``what`` names the file in the message (``dump KEY``,
    ``one-pass piece NAME``).
    """
    if meta.get("format") != DUMP_FORMAT or meta.get("version") != DUMP_VERSION:
        found = f"{meta.get('format')!r} v{meta.get('version')!r}"
        return f"{what} has format {found}, expected {DUMP_FORMAT} v{DUMP_VERSION}: update hs_dataset on the server"
    if meta.get("rid") != rid or (capture_path is not None and meta.get("capture_path") != capture_path):
        path = "" if capture_path is None else f" ({meta.get('capture_path')!r})"
        return f"{what} names request {meta.get('rid')!r}{path}, not {rid}"
    if meta.get("final_state") != "pre_norm":
        return f"{what} holds a {meta.get('final_state')!r} final state, expected pre_norm"
    try:
        layers = json.loads(meta.get("hf_aux_layer_ids", "null"))
    except ValueError:
        layers = None
    if layers != list(expected.aux_layer_ids):
        return f"{what} holds HF layers {layers}, expected {list(expected.aux_layer_ids)}"
    return None


def _header_problem(
    specs: dict[str, TensorSpec], meta: dict[str, str], key: str, sample: TokenizedSample, expected: ExpectedDump
) -> str | None:
    """The tensors a dump's header declares are those of this request, before any data is read.

    Names, ranks and the token and layer counts come from the request; the width from the
    model (the probe's, or at most the widest hidden size a config may have), so the bytes
    a header can make the client read are bounded by what the request needs.
    """
    states = ("input_ids", "aux_hidden_states", "final_hidden_state")
    scaled = scaled_encoding(meta) is not None
    allowed = {*states, *((name + SCALE_SUFFIX for name in states[1:]) if scaled else ())}
    extra = sorted(set(specs) - allowed)
    if extra:
        return f"dump {key} holds tensors this request has no use for: {', '.join(n[:40] for n in extra[:4])}"
    if any(name not in specs for name in states):
        return f"dump {key} lacks tensors (has {sorted(specs)})"
    t, k = sample.num_tokens, len(expected.aux_layer_ids)
    ids, aux, final = specs["input_ids"].shape, specs["aux_hidden_states"].shape, specs["final_hidden_state"].shape
    if ids != (t,) or specs["input_ids"].dtype != "I64":
        return f"dump {key}: token ids differ from the ones sent ({ids} vs {t} tokens)"
    if len(aux) != 3 or aux[:2] != (t, k):
        return f"dump {key}: aux_hidden_states shape {aux}, expected [{t}, {k}, H]"
    if final != (t, aux[2]):
        return f"dump {key}: final_hidden_state shape {final}, expected [{t}, {aux[2]}]"
    hidden = aux[2] * (scaled_encoding(meta).pack if scaled else 1)  # 4-bit codes: two values a byte
    if expected.hidden_size is not None and hidden != expected.hidden_size:
        return f"dump {key}: hidden size {hidden}, expected {expected.hidden_size}"
    if hidden > MAX_HIDDEN:
        return f"dump {key}: hidden size {hidden}, over the largest a model config may have ({MAX_HIDDEN})"
    for name in allowed - set(states):
        if name in specs and specs[name].nbytes > specs[name.removesuffix(SCALE_SUFFIX)].nbytes:
            return f"dump {key}: tensor {name} is larger than the states it scales"
    return None


def _shape_problem(
    meta: dict[str, str], tensors: dict[str, torch.Tensor], key: str, sample: TokenizedSample, expected: ExpectedDump
) -> str | None:
    """The tensors are there, the token ids are the ones sent, the states are [T, K, H] and [T, H] (4-bit: H/2 bytes)."""
    ids = tensors.get("input_ids")
    aux = tensors.get("aux_hidden_states")
    final = tensors.get("final_hidden_state")
    if ids is None or aux is None or final is None:
        return f"dump {key} lacks tensors (has {sorted(tensors)})"
    t = sample.num_tokens
    if ids.dtype != torch.int64 or ids.shape != (t,) or not torch.equal(ids, sample.input_ids):
        return f"dump {key}: token ids differ from the ones sent ({tuple(ids.shape)} vs {t} tokens)"
    k = len(expected.aux_layer_ids)
    if aux.dim() != 3 or aux.shape[0] != t or aux.shape[1] != k:
        return f"dump {key}: aux_hidden_states shape {tuple(aux.shape)}, expected [{t}, {k}, H]"
    h = aux.shape[2]
    if final.shape != (t, h):
        return f"dump {key}: final_hidden_state shape {tuple(final.shape)}, expected [{t}, {h}]"
    encoding = scaled_encoding(meta)
    hidden = h * (encoding.pack if encoding is not None else 1)  # 4-bit codes: two values a byte
    if expected.hidden_size is not None and hidden != expected.hidden_size:
        return f"dump {key}: hidden size {hidden}, expected {expected.hidden_size}"
    return None


def encoding_problem(meta: dict[str, str], tensors: dict[str, torch.Tensor], key: str, expected: ExpectedDump) -> str | None:
    """Native states of the expected dtype, or encoded states (fp8, 4-bit) with both scale tensors (of a model of that dtype)."""
    aux, final = tensors["aux_hidden_states"], tensors["final_hidden_state"]
    encoding = meta.get(STATE_ENCODING_KEY, "native")
    if scaled_encoding(meta) is not None:
        return _scaled_problem(ENCODINGS[encoding], meta, tensors, key, expected)
    if encoding != "native":
        return f"dump {key}: unknown state encoding {encoding!r}: update hs_dataset on the client"
    if expected.dtype is not None and (aux.dtype != expected.dtype or final.dtype != expected.dtype):
        return f"dump {key}: dtype {aux.dtype}/{final.dtype}, expected {expected.dtype}"
    return None


def _scaled_problem(
    encoding: Encoding, meta: dict[str, str], tensors: dict[str, torch.Tensor], key: str, expected: ExpectedDump
) -> str | None:
    aux, final = tensors["aux_hidden_states"], tensors["final_hidden_state"]
    aux_scale, final_scale = tensors.get("aux_hidden_states" + SCALE_SUFFIX), tensors.get("final_hidden_state" + SCALE_SUFFIX)
    data = encoding.storage_torch_dtype
    if aux.dtype != data or final.dtype != data or aux_scale is None or final_scale is None:
        return f"dump {key}: {encoding.name} needs {data} states and both scale tensors (has {sorted(tensors)})"
    t, k, h = aux.shape[0], aux.shape[1], aux.shape[2] * encoding.pack
    want_aux, want_final, dtype = encoding.scale_shape((t, k, h)), encoding.scale_shape((t, h)), encoding.scale_torch_dtype
    if aux_scale.dtype != dtype or aux_scale.shape != want_aux or final_scale.dtype != dtype or final_scale.shape != want_final:
        return (
            f"dump {key}: {encoding.name} scales {aux_scale.dtype} {tuple(aux_scale.shape)}/{tuple(final_scale.shape)}, "
            f"expected {dtype} {list(want_aux)} and {list(want_final)}"
        )
    if expected.dtype is not None and meta.get("dtype") != str(expected.dtype).replace("torch.", ""):
        return (
            f"dump {key}: states of a {meta.get('dtype')} model, this config wants {expected.dtype}: restart the server "
            "with the card's dtype (--dtype), or give the card the server's"
        )
    return None
