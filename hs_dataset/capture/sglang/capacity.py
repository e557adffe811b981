"""How many generation requests a server can run at once, read from what it reports.

Regeneration keeps as many requests in flight as the servers can run together; more
would only wait in their queues. Each server's ``/server_info`` (``/get_server_info`` on
older SGLang) says it in fields that moved between releases, so the fields are looked
for, not the version:

* requests: per data-parallel rank, ``internal_states[i].effective_max_running_requests_per_dp``
  (0.5.14 and later, the scheduler's own limit after its KV sizing), else the
  ``max_running_requests`` setting there or at the top level (older releases; null
  when the operator set none);
* KV cache: per rank, ``internal_states[i].memory_usage.token_capacity``, else the
  top-level ``max_total_num_tokens`` (the scheduler's handshake, every release), divided
  by ``max_new_tokens`` clipped at :data:`CLIP_NEW_TOKENS`: the requests whose answers
  fit at once, estimated as SGLang's scheduler does when it admits a request (it
  reserves at most ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``, 4096 by default in 0.5.5,
  0.5.14 and 0.5.23, new tokens per request). Requests beyond what the server admits only
  wait in its queue; too few would leave it idle.

Capture beside generation: SGLang prefills in batches of up to ``chunked_prefill_size``
tokens (a top-level field of ``/server_info``, every release) and pauses every decoding
request while it does. Samples sent for capture one at a time as conversations finish
would each be a batch of their own; :func:`prefill_tokens` gives the group size that
fills one batch (the smallest over the servers; :data:`DEFAULT_PREFILL_TOKENS` when none
reports a positive one, e.g. chunking off).

A server's bound is the smaller of the two it reports; the run's is the sum over its
servers (:data:`DEFAULT_IN_FLIGHT` for one that reports neither), at most
:data:`MAX_IN_FLIGHT` (open sockets), and at most the card's ``regenerate.concurrency``
when set. When no server reports either, the card's value is used, else
:data:`DEFAULT_IN_FLIGHT`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CLIP_NEW_TOKENS",
    "DEFAULT_IN_FLIGHT",
    "DEFAULT_PREFILL_TOKENS",
    "MAX_IN_FLIGHT",
    "InFlight",
    "in_flight",
    "prefill_tokens",
    "server_slots",
]

DEFAULT_IN_FLIGHT = 16  # when no server reports its limits and the card sets none
MAX_IN_FLIGHT = 1024  # one socket each: stays under a common open-files limit with room for the rest
DEFAULT_PREFILL_TOKENS = 8192  # SGLang's own chunked_prefill_size on most GPUs, when no server reports one
CLIP_NEW_TOKENS = 4096  # SGLang's default SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: the most it reserves per request


@dataclass(frozen=True)
class InFlight:
    """Requests to keep in flight, and in words where the number came from (recorded in the manifest)."""

    requests: int
    source: str


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _ranks(info: dict[str, Any]) -> list[dict[str, Any]]:
    states = info.get("internal_states")
    return [s for s in states if isinstance(s, dict)] if isinstance(states, list) else []


def _running(info: dict[str, Any]) -> int | None:
    """Requests the server runs at once: its scheduler's limit per data-parallel rank, summed; else the setting."""
    ranks = _ranks(info)
    per_rank = [_int(s.get("effective_max_running_requests_per_dp")) for s in ranks]
    if per_rank and all(per_rank):
        return sum(per_rank)  # type: ignore[arg-type]
    setting = [_int(s.get("max_running_requests")) for s in ranks[:1]] + [_int(info.get("max_running_requests"))]
    return next((v for v in setting if v), None)


def _kv_tokens(info: dict[str, Any]) -> int | None:
    """Tokens the server's KV cache holds: per data-parallel rank, summed; else the handshake's figure."""
    ranks = _ranks(info)
    per_rank = [
        _int((s.get("memory_usage") or {}).get("token_capacity")) if isinstance(s.get("memory_usage"), dict) else None for s in ranks
    ]
    if per_rank and all(per_rank):
        return sum(per_rank)  # type: ignore[arg-type]
    return _int(info.get("max_total_num_tokens"))


def server_slots(info: dict[str, Any], max_new_tokens: int) -> tuple[int | None, str]:
    """One server's bound on generation requests at once (None: it reports none), and which fields gave it."""
    running, kv = _running(info), _kv_tokens(info)
    bounds = []
    if running is not None:
        bounds.append((running, f"max running requests {running}"))
    if kv is not None:
        per = max(1, min(max_new_tokens, CLIP_NEW_TOKENS))
        clipped = f" (max_new_tokens {max_new_tokens}, clipped as SGLang's scheduler does)" if per < max_new_tokens else ""
        bounds.append((max(1, kv // per), f"KV cache {kv} tokens / {per} new tokens a request{clipped}"))
    if not bounds:
        return None, "reports no limits"
    slots = min(b[0] for b in bounds)
    return slots, ", ".join(b[1] for b in bounds)


def in_flight(infos: Sequence[dict[str, Any]], max_new_tokens: int, cap: int | None) -> InFlight:
    """Requests to keep in flight over servers reporting ``infos``, at most ``cap`` (the card's ``regenerate.concurrency``)."""
    found = [server_slots(info, max_new_tokens) for info in infos]
    known = [slots for slots, _ in found if slots is not None]
    words = "; ".join(f"server {k + 1}: {why}" for k, (_, why) in enumerate(found))
    if not known:
        requests = cap or DEFAULT_IN_FLIGHT
        return InFlight(requests, f"regenerate.concurrency {cap}" if cap else f"the default {DEFAULT_IN_FLIGHT} ({words})")
    total = sum(slots if slots is not None else DEFAULT_IN_FLIGHT for slots, _ in found)
    requests = min(total, MAX_IN_FLIGHT, cap or MAX_IN_FLIGHT)
    limit = (
        " and regenerate.concurrency"
        if cap and cap < min(total, MAX_IN_FLIGHT)
        else (f" and the cap {MAX_IN_FLIGHT}" if total > MAX_IN_FLIGHT else "")
    )
    return InFlight(requests, f"the servers' {total} ({words}){limit}")


def prefill_tokens(infos: Sequence[dict[str, Any]]) -> int:
    """Tokens one prefill batch of these servers takes: the smallest ``chunked_prefill_size`` any reports."""
    sizes = [size for size in (_int(info.get("chunked_prefill_size")) for info in infos) if size]
    return min(sizes) if sizes else DEFAULT_PREFILL_TOKENS
