"""One sample's attempts: what each kind of failure means for the next one, decided in one place.

A failed attempt is classified once into a :class:`Verdict`:

* **elsewhere** -- the server failed (HTTP 5xx or 429, no connection, a timeout): it
  is taken out of rotation for a while and the sample goes to another server; these
  attempts are paid for by the one extra attempt per server.
* **retry** -- the server answered but stored nothing usable in time (a lost dump, a
  retryable refusal such as "staging full"): tried again, counting against
  ``backend.retries``.
* **give up** -- the request itself is wrong (another HTTP 4xx, a final refusal): the
  sample is reported as a failure at once.

:class:`Attempts` keeps the bookkeeping of one sample: how many attempts in all, the
retries used, the servers that failed it and the last reason, which is what the
sample's failure says when the attempts run out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from hs_dataset.capture.base import CaptureFailure
from hs_dataset.capture.sglang.dumps import DumpLost, Refusal
from hs_dataset.capture.sglang.http import HTTPStatusError
from hs_dataset.server_patch.contract.dump import RETRYABLE_REFUSALS

__all__ = [
    "Action",
    "Attempts",
    "Verdict",
    "connection_verdict",
    "http_status_verdict",
    "lost_dump_verdict",
    "refusal_verdict",
    "retry_pause",
]

MAX_PAUSE_S = 30.0


class Action(enum.Enum):
    ELSEWHERE = "retry on another server"
    RETRY = "retry"
    GIVE_UP = "give up"


@dataclass(frozen=True)
class Verdict:
    """A failed attempt, classified: what to do next, why, and what it leaves behind.

    ``abandon``: the request's dump may still arrive, so it is deleted when it does.
    ``counter``: the client's ``stats`` key the failure counts under, if any.
    """

    action: Action
    reason: str
    abandon: bool
    counter: str | None


def http_status_verdict(url: str, exc: HTTPStatusError) -> Verdict:
    """A server error or "too many requests" sends the sample elsewhere; any other status rejects the request for good."""
    if exc.status >= 500 or exc.status == 429:
        return Verdict(Action.ELSEWHERE, f"{url} answered HTTP {exc.status}: {exc.text[:200]}", abandon=True, counter="endpoint_errors")
    return Verdict(Action.GIVE_UP, f"{url} rejected the request (HTTP {exc.status}): {exc.text[:300]}", abandon=True, counter=None)


def connection_verdict(url: str, exc: BaseException) -> Verdict:
    """No connection, or no answer in time: the server is taken out of rotation."""
    return Verdict(Action.ELSEWHERE, f"{url}: {type(exc).__name__}: {exc}", abandon=True, counter="endpoint_errors")


def lost_dump_verdict(exc: DumpLost) -> Verdict:
    return Verdict(Action.RETRY, str(exc), abandon=True, counter="timeouts")


def refusal_verdict(key: str, refusal: Refusal) -> Verdict:
    """Refusals the server may not repeat (staging full ...) are retried; the others are final."""
    action = Action.RETRY if refusal.reason.startswith(RETRYABLE_REFUSALS) else Action.GIVE_UP
    return Verdict(action, f"server refused {key}: {refusal.reason}", abandon=False, counter="refused")


def retry_pause(backoff_s: float, attempt: int) -> float:
    """Seconds to wait before attempt ``attempt`` (>= 1): ``backoff_s`` doubling per attempt, at most 30 s."""
    return min(MAX_PAUSE_S, backoff_s * (2 ** (attempt - 1)))


@dataclass
class Attempts:
    """One sample's bookkeeping: ``retries`` plus one attempt per server in all."""

    retries: int
    servers: int
    used: int = 0  # retries spent on lost dumps and retryable refusals
    avoid: set[str] = field(default_factory=set)  # servers that failed this sample
    last_reason: str = "not attempted"

    @property
    def total(self) -> int:
        return self.retries + self.servers

    def record(self, verdict: Verdict, url: str) -> bool:
        """Note a failed attempt on ``url``; True when the sample is to be tried again."""
        self.last_reason = verdict.reason
        if verdict.action is Action.ELSEWHERE:
            self.avoid.add(url)
            return True
        if verdict.action is Action.RETRY:
            self.used += 1
            return self.used <= self.retries
        return False

    def failure(self, sample_id: str) -> CaptureFailure:
        return CaptureFailure(sample_id, self.last_reason)
