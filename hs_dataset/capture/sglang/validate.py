"""Checking one SGLang server before any work, as small named checks in a fixed order.

Reachable, a supported SGLang version, serving the same model, hs_dataset's hooks
installed with the same aux layers, a private staging directory on this host, the
radix-cache policy, and (done by the client, :func:`check_probe` here) a probe request
whose dump must appear. Every check raises :class:`~hs_dataset.errors.ServerValidationError`
naming the fix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from hs_dataset.capture.base import CaptureFailure, CaptureResult
from hs_dataset.capture.sglang.diagnose import read_report
from hs_dataset.capture.sglang.endpoints import Endpoint
from hs_dataset.capture.sglang.http import BadResponseError, HTTPStatusError, connection_errors, get_json
from hs_dataset.codecs.fp4 import GROUP_SIZE
from hs_dataset.config import SGLangBackendSection
from hs_dataset.errors import ServerValidationError
from hs_dataset.sample import CapturedSample, TokenizedSample
from hs_dataset.server_patch.contract.decode_capture import DECODE_CAPTURE, one_pass_refusal
from hs_dataset.server_patch.contract.dump import HOOKS_MODULE
from hs_dataset.server_patch.contract.mechanism import DEFAULT_MECHANISM, Mechanism
from hs_dataset.server_patch.contract.private_dir import StagingError, check_private_dir
from hs_dataset.server_patch.contract.status import read_statuses

__all__ = ["OnePassSupport", "check_probe", "check_server", "one_pass_support", "probe_sample", "server_mechanism"]

_SERVE_FIX = "start it with `hs-dataset serve --config <card>`"


async def check_server(
    ep: Endpoint, session: Any, section: SGLangBackendSection, *, model_path: str, aux_layer_ids: list[int], run_id: str
) -> None:
    """Every check but the probe, in order; fills in ``ep``'s server info, version and staging dir.

    No ``/health``: SGLang's (0.5.14-0.5.23) sends a one-token generation and sleeps a whole second before it looks
    for the answer, so it cost every build a second before its first request (on the CPU server it took 1.0 s of
    the 1.1 s before the first request; on the lent H100 that wait was 1.1 s too, of a 34 s job). The probe
    request that follows these checks is a real generation through the capture hooks, which says more of the
    server's health than ``/health`` can.
    """
    info = await read_server_info(ep.url, session, section.max_response_bytes)
    ep.server_info = info
    ep.version = str(info.get("version") or "unknown")
    check_same_model(ep.url, str(info.get("model_path") or ""), model_path)
    config = capture_hook_config(ep.url, info, ep.staging_dir)
    ep.mechanism = str(config.get("mechanism", DEFAULT_MECHANISM))
    check_layer_ids(ep.url, config, aux_layer_ids)
    check_server_flag(ep.url, config, info)
    check_rid_prefix(ep.url, config, run_id)
    ep.staging_dir = check_staging_dir(ep.url, same_staging_dir(ep.url, ep.staging_dir, config.get("staging_dir")))
    ep.uses_rids = hooks_see_rids(ep.url, ep.staging_dir, config)
    check_radix_cache(ep.url, info, section)
    check_speculative(ep.url, info, section.max_new_tokens)


# /server_info fields the checks read, and the JSON types they must have when present
_INFO_TYPES: dict[str, tuple[type, ...]] = {
    "version": (str,),
    "model_path": (str,),
    "forward_hooks": (list, str),
    "disable_radix_cache": (bool,),
    "enable_return_aux_hidden_states": (bool,),
    "speculative_algorithm": (str,),
}


async def read_server_info(url: str, session: Any, max_bytes: int | None = None) -> dict:
    """``/server_info`` (``/get_server_info`` on older SGLang), at most ``max_bytes`` read, the fields we use typed."""
    info = None
    limit = {} if max_bytes is None else {"max_bytes": max_bytes}
    for path in ("/server_info", "/get_server_info"):
        try:
            info = await get_json(session, url + path, **limit)
            break
        except HTTPStatusError:
            continue
        except BadResponseError as exc:
            raise ServerValidationError(f"SGLang server {exc}") from None
        except connection_errors() as exc:
            raise ServerValidationError(
                f"SGLang server {url} is unreachable ({type(exc).__name__}: {exc} on {path}); {_SERVE_FIX}, or fix the server URL"
            ) from None
    if not isinstance(info, dict):
        raise ServerValidationError(f"SGLang server {url} answers no /server_info: is this an SGLang server?")
    for key, types in _INFO_TYPES.items():
        value = info.get(key)
        if value is not None and (not isinstance(value, types) or (bool not in types and isinstance(value, bool))):
            raise ServerValidationError(
                f"SGLang server {url}: /server_info field {key} is a {type(value).__name__}, expected {' or '.join(t.__name__ for t in types)}; "
                "is this an SGLang server started by `hs-dataset serve`?"
            )
    return info


def same_staging_dir(url: str, mine: str | None, servers: str | None) -> str | None:
    """The staging dir to read: the server's own, which a configured one must name too (the same directory)."""
    if not mine or not servers:
        return mine or servers
    try:
        same = os.path.samefile(mine, servers)
    except OSError:
        same = os.path.abspath(mine) == os.path.abspath(servers)
    if not same:
        raise ServerValidationError(
            f"SGLang server {url} writes its dumps to {servers}, but this client was told to read them from {mine} "
            "(backend.staging_dir or sglang.staging.dir): start the server with the same card, or drop the setting so "
            "the client reads where the server writes"
        )
    return mine


def hooks_see_rids(url: str, staging_dir: str, config: dict) -> bool:
    """Whether the server's hooks key dumps by request id: what they read from the SGLang they run in.

    The hooks report it in their status file (``ForwardBatch.rids`` present or not, read from
    the loaded class, never from the version number); a server whose hooks have not
    reported yet is asked for request ids, and the probe request says the rest.
    """
    facts = read_report(staging_dir).facts
    if "forward_batch_rids" in facts:
        return bool(facts["forward_batch_rids"])
    return not config.get("content_keys", False)


class OnePassSupport(NamedTuple):
    """Whether a server captures one-pass requests (every decode step's states), and why not."""

    works: bool
    reason: str | None  # None where it works; else the hooks' reason, to print beside the fallback to prefill capture
    fact: str | None  # the hooks' ``decode_capture`` fact as reported (None: not reported)


def one_pass_support(staging_dir: str) -> OnePassSupport:
    """What the server's hooks report of their decode steps (``facts["decode_capture"]`` of the status file).

    ``graph``: its decode CUDA graphs carry the capture; ``eager``: no decode graph, the
    hooks see every step; ``off: <reason>``, or no report at all: one-pass requests would be
    refused, so the build captures by prefill instead. Read the status after the server is
    up (the hooks write it before the first request).
    """
    fact = read_report(staging_dir).facts.get(DECODE_CAPTURE)
    reason = one_pass_refusal(fact)
    return OnePassSupport(reason is None, reason, fact if isinstance(fact, str) else None)


def check_same_model(url: str, served: str, model_path: str) -> None:
    if not same_model(served, model_path):
        raise ServerValidationError(
            f"SGLang server {url} serves {served!r}, but this config captures {model_path!r}: "
            "start the server with the card's model (hs-dataset serve --config <card>) or point the builder at the right server"
        )


def same_model(served: str, mine: str) -> bool:
    """The same directory or the same config.json where both are local directories, else the same path or name."""
    if os.path.isdir(served) and os.path.isdir(mine):
        try:
            return os.path.samefile(served, mine) or _config_bytes(served) == _config_bytes(mine)
        except OSError:
            return False
    return served.rstrip("/") == mine.rstrip("/") or os.path.basename(served.rstrip("/")) == os.path.basename(mine.rstrip("/"))


def _config_bytes(directory: str) -> bytes | None:
    try:
        return (Path(directory) / "config.json").read_bytes()
    except OSError:
        return None


def capture_hook_config(url: str, info: dict, staging_dir: str | None = None) -> dict:
    """The config of hs_dataset's model hook, once both of its hooks are found installed; on a server without
    forward hooks, what the source patch's hook reported in ``staging_dir`` (:func:`legacy_hook_config`)."""
    specs = info.get("forward_hooks") or []
    if isinstance(specs, str):
        try:
            specs = json.loads(specs)
        except (json.JSONDecodeError, RecursionError):
            specs = None
    if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
        raise ServerValidationError(
            f"SGLang server {url}: /server_info forward_hooks is not a list of hook specs; restart it with `hs-dataset serve`"
        )
    ours = [s for s in specs if str(s.get("hook_factory", "")).startswith(HOOKS_MODULE + ":model_hook")]
    if not ours and not specs and staging_dir:
        legacy = legacy_hook_config(staging_dir)
        if legacy is not None:
            return legacy
    if not ours:
        patched = ""
        if not specs:  # maybe the source patch (SGLang <= 0.5.5), which reports only through its staging dir
            patched = (
                f", and no status of the source patch's hook in {staging_dir}"
                if staging_dir
                else "; for an SGLang patched with `hs-dataset patch`, set backend.staging_dir to its HS_CAPTURE_STAGING_DIR"
            )
        raise ServerValidationError(
            f"capture is not enabled on SGLang server {url}: it runs without hs_dataset's forward hooks "
            f"(--forward-hooks with {HOOKS_MODULE}:model_hook){patched}; restart it with `hs-dataset serve --config <card>`"
        )
    if not any(str(s.get("hook_factory", "")).startswith(HOOKS_MODULE + ":norm_hook") for s in specs):
        raise ServerValidationError(
            f"SGLang server {url} has no hs_dataset final-norm hook, so no pre-norm final state; restart it with `hs-dataset serve`"
        )
    config = ours[0].get("config") or {}
    if not isinstance(config, dict):
        raise ServerValidationError(
            f"SGLang server {url}: its hs_dataset hook's config is a {type(config).__name__}, not an object; restart it with `hs-dataset serve`"
        )
    return dict(config)


def legacy_hook_config(staging_dir: str) -> dict | None:
    """The config the source patch's hook (``HS_CAPTURE_*`` variables, SGLang <= 0.5.5) wrote into its status file."""
    for status in read_statuses(staging_dir):
        if _without_forward_hooks(status.get("mechanism")):
            keys = ("mechanism", "hf_aux_layer_ids", "rid_prefix", "content_keys")
            return {**{k: status[k] for k in keys if k in status}, "staging_dir": staging_dir}
    return None


def check_layer_ids(url: str, config: dict, aux_layer_ids: list[int]) -> None:
    server_ids = config.get("hf_aux_layer_ids") or []
    if not isinstance(server_ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in server_ids):
        raise ServerValidationError(
            f"SGLang server {url}: its hooks report aux layer ids {server_ids!r:.80}, not a list of integers; restart it with this card"
        )
    if server_ids != aux_layer_ids:
        raise ServerValidationError(
            f"SGLang server {url} captures HF hidden_states {server_ids}, this config wants {aux_layer_ids}: "
            "restart the server with this card"
        )


def _without_forward_hooks(mechanism: Any) -> bool:
    """Whether a status file's mechanism is one that runs without forward hooks (the source patch's)."""
    try:
        return not Mechanism(mechanism).uses_forward_hooks
    except ValueError:
        return False


def check_server_flag(url: str, config: dict, info: dict) -> None:
    """The server argument the hooks' mechanism needs switched on (``aux_return``: SGLang's own aux-hidden-state output),
    unless no aux layer is captured."""
    wants_aux = config.get("hf_aux_layer_ids") != []  # [] is a final-state-only capture: no aux output to switch on
    try:
        flag = Mechanism(config.get("mechanism", DEFAULT_MECHANISM)).server_flag
    except ValueError:
        flag = None  # a mechanism this client does not know: the probe request says whether it captures
    if wants_aux and flag and not info.get(flag, False):
        raise ServerValidationError(
            f"SGLang server {url} has hs_dataset's hooks but not --{flag.replace('_', '-')}; restart it with `hs-dataset serve`"
        )


def check_rid_prefix(url: str, config: dict, run_id: str) -> None:
    rid_prefix = str(config.get("rid_prefix", "hs-"))
    if not f"hs-{run_id}-".startswith(rid_prefix):
        raise ServerValidationError(f"SGLang server {url} only captures request ids starting with {rid_prefix!r}; use run_id accordingly")


def check_staging_dir(url: str, staging: str | None) -> str:
    """The staging directory, private to this user on this host (the dumps are read from it directly)."""
    if not staging:
        raise ServerValidationError(f"SGLang server {url}: its hook config names no staging_dir")
    try:
        check_private_dir(staging)
    except StagingError as exc:
        raise ServerValidationError(
            f"SGLang server {url}: unusable staging directory: {exc} (the builder must run on the server's host, as the same user)"
        ) from None
    return staging


def check_radix_cache(url: str, info: dict, section: SGLangBackendSection) -> None:
    """A prefix cache computes only part of a prompt: refused where the card turned the forced full prefill off
    (its default forces it on such servers) and does not accept the refusals either."""
    if not info.get("disable_radix_cache", False) and section.force_full_prefill is False and not section.allow_radix_cache:
        raise ServerValidationError(
            f"SGLang server {url} has its radix (prefix) cache on: prompts sharing a prefix would only be partly "
            "computed and are refused. Restart it with --disable-radix-cache (hs-dataset serve does), or set "
            "backend.force_full_prefill (recompute every prompt) or backend.allow_radix_cache (accept refusals)"
        )


def check_speculative(url: str, info: dict, max_new_tokens: int) -> None:
    if info.get("speculative_algorithm") and max_new_tokens == 0:
        raise ServerValidationError(f"SGLang server {url} runs speculative decoding: max_new_tokens 0 is not allowed there; use 1")


def server_mechanism(ep: Endpoint) -> str | None:
    """How the server's model hook captures (``aux_return`` ...), as its hook config says; ``None`` without one."""
    if ep.mechanism is not None:
        return ep.mechanism
    specs: Sequence[dict] = ep.server_info.get("forward_hooks") or []
    for s in specs:
        if str(s.get("hook_factory", "")).startswith(HOOKS_MODULE + ":model_hook"):
            return str((s.get("config") or {}).get("mechanism", DEFAULT_MECHANISM))
    return None


# ---------------------------------------------------------------------------- the probe


def probe_sample(vocab_size: int | None) -> TokenizedSample:
    """Seven fixed token ids inside the model's vocabulary (1000 when the local config does not say)."""
    vocab = int(vocab_size or 1000)
    ids = torch.tensor([(97 + 31 * i) % max(vocab - 1, 2) + 1 for i in range(7)], dtype=torch.int64)
    return TokenizedSample("__hs_probe__", ids, torch.ones_like(ids, dtype=torch.bool))


def state_hidden_size(result: CapturedSample) -> int:
    """The hidden size of a dump's states: the tensor's width, or for 4-bit codes (two values a byte) the group count times the group.

    Why not the width alone: a server that quantizes to 4 bits sends ``[T, H/2]`` bytes, and
    a probe that read the width as the hidden size refused the first real nf4 server as
    "wrong model" (docs/GPU.md, the GPU check with ``--storage nf4``).
    """
    scale = result.final_scale
    if scale is not None and scale.dim() == 2:  # per-group scales [T, H/32]; fp8's are per token, [T]
        return int(scale.shape[1]) * GROUP_SIZE
    return int(result.final_hidden_state.shape[1])


def check_probe(url: str, result: CaptureResult, hidden_size: int | None, dtype: torch.dtype | None) -> tuple[int, torch.dtype]:
    """The probe's dump has the local model's hidden size and the wanted dtype; returns (hidden size, dtype produced)."""
    if isinstance(result, CaptureFailure):
        raise ServerValidationError(
            f"SGLang server {url}: the probe request produced no usable dump ({result.reason}); "
            f"check the server log for 'hs_dataset capture' lines"
        )
    h = state_hidden_size(result)
    if hidden_size and int(hidden_size) != h:
        raise ServerValidationError(f"SGLang server {url}: dumps have hidden size {h}, the local model has {hidden_size}: wrong model")
    if result.aux_scale is not None:
        # an encoded dump (fp8, 4-bit) holds codes, not the model's dtype: the dump reader already held the dtype
        # its metadata names to this config's, so the model computes in ``dtype`` (bf16 when nothing was asked)
        return h, dtype or torch.bfloat16
    produced = result.aux_hidden_states.dtype
    if dtype is not None and produced != dtype:
        raise ServerValidationError(
            f"SGLang server {url} produces {produced} states, this config wants {dtype}: restart the server with the card's dtype (--dtype)"
        )
    return h, produced
