"""The clients the regeneration benchmark measures a build against, on a plain SGLang server (``_plain_server``).

Both send the reference build's stored turns (the same conversations, every answer asked for at its stored length
with ``ignore_eos``) and keep ``in_flight`` at the server, greedy:

* :func:`turn_order`: what a user runs to regenerate multi-turn data. ``in_flight`` conversations at a time; turn
  k+1 goes out the moment turn k's answer arrives, its prompt the stored one with this client's own prompt k and
  answer k in its place (:func:`follow_on`: so the server's prefix cache sees this client's history, as it would a
  user's), no turn waiting for another conversation;
* :func:`independent`: every turn's stored prompt in source order as its own request, ``in_flight`` requests at all
  times, no turn waiting for another (turns of one conversation may run at once).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Span", "StoredTurn", "follow_on", "independent", "stored_turns", "turn_order"]


class Span:
    """First request to last answer of one run, the tokens generated, and the requests in flight over time."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.end = 0.0
        self.tokens = 0
        self.pending = 0
        self._area = 0.0  # integral of requests in flight over time
        self._since = 0.0
        self._served = 0.0  # the server's own latency of every answer (its ``meta_info.e2e_latency``), summed
        self._served_count = 0

    def seconds(self) -> float:
        return self.end - (self.start or self.end)

    def change(self, by: int) -> None:
        now = time.perf_counter()
        if self.start is None:
            self.start = self._since = now
        self._area += self.pending * (now - self._since)
        self.pending, self._since = self.pending + by, now

    def answered(self, tokens: int) -> None:
        self.end, self.tokens = time.perf_counter(), self.tokens + tokens

    def served(self, meta_info: Any) -> None:
        """An answer's ``meta_info``: its ``e2e_latency`` (the server's time from taking the request to finishing it)."""
        latency = meta_info.get("e2e_latency") if isinstance(meta_info, dict) else None
        if isinstance(latency, (int, float)) and latency >= 0:
            self._served += latency
            self._served_count += 1

    def mean_in_flight(self) -> float:
        return self._area / max(self.seconds(), 1e-9)

    def at_server(self) -> str:
        """Of the requests in flight, how many the server held on average by its own latencies (where it gave them).

        Why: in flight counts from the client's send to its reading of the answer. With the server's share
        beside it, a client that reads its answers late (or sends late) shows as a gap between the two,
        and a slower server as the same gap-free count at a lower rate.
        """
        if not self._served_count:
            return "the server gave no latencies"
        return f"{self._served / max(self.seconds(), 1e-9):.1f} of them at the server by its own latencies ({self._served_count} answers)"

    def rate(self) -> float:
        return self.tokens / max(self.seconds(), 1e-9)


@dataclass(frozen=True)
class StoredTurn:
    """One turn as the reference build stored it: the prompt its server was sent, the answer it wrote."""

    prompt: list[int]
    answer: list[int]

    @property
    def length(self) -> int:
        return len(self.answer)


def stored_turns(record: dict) -> list[StoredTurn]:
    """A stored conversation's turns (prompt k: the sample's ids up to that turn's prompt length); [] without a sample."""
    ids = record.get("input_ids") or []
    return [StoredTurn(ids[: t["prompt_tokens"]], list(t["token_ids"])) for t in record["turns"] if ids and t["prompt_tokens"]]


def follow_on(turn: StoredTurn, before: StoredTurn, history: list[int]) -> list[int] | None:
    """Turn k+1's stored prompt with ``history`` (this client's prompt k + answer k) in place of the stored ones.

    None where the stored prompt does not begin with the stored prompt k and answer k (a template that renders
    earlier turns differently): the stored prompt is then sent as it is.
    """
    head = len(before.prompt) + len(before.answer)
    if turn.prompt[: len(before.prompt)] != before.prompt or turn.prompt[len(before.prompt) : head] != before.answer:
        return None
    return history + turn.prompt[head:]


@dataclass
class Outcome:
    """One client run: its wall time, the tokens generated, the turns sent with the client's own history."""

    seconds: float
    tokens: int
    own_history: int = 0
    stored_prompt: int = 0


async def _generate(session: Any, url: str, prompt: list[int], length: int, span: Span) -> list[int]:
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": length, "temperature": 0.0, "ignore_eos": True}}
    span.change(+1)
    async with session.post(url + "/generate", json=body) as resp:
        resp.raise_for_status()
        out = await resp.json()
        output = list(out["output_ids"])
    span.change(-1)
    span.served(out.get("meta_info"))
    span.answered(len(output))
    return output


def _session(in_flight: int, timeout_s: float) -> Any:
    import aiohttp

    from hs_dataset.capture.sglang.http import KEEPALIVE_S  # idle connections closed before SGLang's keep-alive closes them

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=in_flight * 2, keepalive_timeout=KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    )


async def _turn_order(url: str, convs: list[list[StoredTurn]], in_flight: int, timeout_s: float, span: Span) -> Outcome:
    gate = asyncio.Semaphore(in_flight)
    outcome = Outcome(0.0, 0)
    async with _session(in_flight, timeout_s) as session:

        async def conversation(turns: list[StoredTurn]) -> None:
            async with gate:
                history: list[int] = []
                for k, turn in enumerate(turns):
                    own = follow_on(turn, turns[k - 1], history) if k else None
                    outcome.own_history += own is not None
                    outcome.stored_prompt += k > 0 and own is None
                    prompt = turn.prompt if own is None else own
                    answer = await _generate(session, url, prompt, turn.length, span)
                    history = prompt + answer
                    outcome.tokens += len(answer)

        t0 = time.perf_counter()
        await asyncio.gather(*(conversation(c) for c in convs if c))
        outcome.seconds = time.perf_counter() - t0
    return outcome


async def _independent(url: str, turns: list[StoredTurn], in_flight: int, timeout_s: float, span: Span) -> Outcome:
    gate = asyncio.Semaphore(in_flight)
    outcome = Outcome(0.0, 0)
    async with _session(in_flight, timeout_s) as session:

        async def one(turn: StoredTurn) -> None:
            async with gate:
                answer = await _generate(session, url, turn.prompt, turn.length, span)
                outcome.tokens += len(answer)  # after the await: `+=` reads its left side first

        t0 = time.perf_counter()
        await asyncio.gather(*(one(t) for t in turns))
        outcome.seconds = time.perf_counter() - t0
    return outcome


def turn_order(url: str, convs: list[list[StoredTurn]], in_flight: int, span: Span, timeout_s: float = 3600) -> Outcome:
    """The turn-order client (the module's first): ``in_flight`` conversations, each turn sent when the one before answered."""
    return asyncio.run(_turn_order(url.rstrip("/"), convs, in_flight, timeout_s, span))


def independent(url: str, turns: list[StoredTurn], in_flight: int, span: Span, timeout_s: float = 3600) -> Outcome:
    """The independent-turn client (the module's second): every stored turn its own request, ``in_flight`` at all times."""
    return asyncio.run(_independent(url.rstrip("/"), turns, in_flight, timeout_s, span))
