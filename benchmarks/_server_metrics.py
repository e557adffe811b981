"""How many prompt tokens an SGLang server prefilled (computed, not taken from its prefix cache) over one run.

The regeneration benchmark compares what the capture server prefilled for a build with what a plain server
prefilled for the same generation: the difference is what capture cost in prefill. Two sources, the first that
works:

* ``/metrics`` (the server started with ``--enable-metrics``): ``sglang:prompt_tokens_total`` minus
  ``sglang:cached_tokens_total``, summed over their label sets (0.5.14-0.5.23 have both; SGLang counts them when a
  request finishes, so they are complete once every answer of the run has arrived);
* the server's log: the ``#new-token: N`` of every ``Prefill batch`` line written during the run.

Where the log is given, its ``Decode batch`` lines of the run are summarized beside (:func:`decode_summary`): the
requests the server itself was decoding, its own generation rate, and how many of those steps ran in a CUDA graph.
They tell a slower server (fewer tokens a second at as many running requests, or graphs off) from a client that
keeps fewer requests at it.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Counters", "PrefillMeter", "decode_summary", "log_new_tokens", "parse_metrics"]

_PROMPT, _CACHED, _GENERATED = "sglang:prompt_tokens_total", "sglang:cached_tokens_total", "sglang:generation_tokens_total"
_SAMPLE = re.compile(r"^(sglang:[a-z_]+)(?:\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$")
_NEW_TOKEN = re.compile(r"Prefill batch.*?#new-token: (\d+)")
# SGLang 0.5.14-0.5.23: "Decode batch, #running-req: 72, ..., cuda graph: True, gen throughput (token/s): 4603.12, ..."
_DECODE = re.compile(r"Decode batch.*?#running-req: (\d+).*?graph: (True|False).*?gen throughput \(token/s\): ([0-9.]+)")


@dataclass(frozen=True)
class Counters:
    """A server's token counters at one moment (the prompt tokens of finished requests, of them taken from the cache)."""

    prompt: float
    cached: float
    generated: float

    def prefilled_since(self, before: Counters) -> int:
        return round((self.prompt - self.cached) - (before.prompt - before.cached))


def parse_metrics(text: str) -> Counters | None:
    """The counters from a Prometheus exposition, or None where the prompt-token counter is missing."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in (_PROMPT, _CACHED, _GENERATED):
            sums[match.group(1)] = sums.get(match.group(1), 0.0) + float(match.group(2))
    if _PROMPT not in sums:
        return None
    return Counters(sums[_PROMPT], sums.get(_CACHED, 0.0), sums.get(_GENERATED, 0.0))


def log_new_tokens(path: Path, offset: int) -> tuple[int, int]:
    """The ``#new-token`` counts of the ``Prefill batch`` lines after byte ``offset`` of the log, summed; and the log's end."""
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read()
    return sum(int(n) for n in _NEW_TOKEN.findall(text.decode(errors="replace"))), offset + len(text)


def decode_summary(text: str) -> str:
    """The ``Decode batch`` lines of ``text`` in one phrase: their count, mean running requests and rate, graph share."""
    lines = [(int(n), graph == "True", float(rate)) for n, graph, rate in _DECODE.findall(text)]
    if not lines:
        return "no 'Decode batch' lines"
    running = sum(n for n, _, _ in lines) / len(lines)
    rate = sum(r for _, _, r in lines) / len(lines)
    graphs = sum(g for _, g, _ in lines)
    return f"{len(lines)} 'Decode batch' lines: {running:.1f} running, {rate:.0f} tok/s (means), CUDA graph in {graphs} of them"


def _read_metrics(url: str) -> Counters | None:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
            return parse_metrics(resp.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError, ValueError):
        return None


class PrefillMeter:
    """The prompt tokens one server prefilled between :meth:`start` and :meth:`stop` (see the module's two sources)."""

    def __init__(self, url: str, log_path: Path | None = None) -> None:
        self.url = url.rstrip("/")
        self.log_path = log_path
        self._before: Counters | None = None
        self._offset = 0  # where the log stood at start: the run's lines follow
        self.decode = ""  # the run's decode lines summarized (stop), empty without a log

    @property
    def source(self) -> str:
        if _read_metrics(self.url) is not None:
            return "/metrics prompt_tokens_total - cached_tokens_total"
        if self.log_path is not None:
            return f"the log's '#new-token' lines ({self.log_path.name})"
        return "none (no /metrics counters: start the server with --enable-metrics, or pass its log)"

    def start(self) -> None:
        self._before = _read_metrics(self.url)
        if self.log_path is not None:
            self._offset = self.log_path.stat().st_size

    def _decode_lines(self) -> str:
        if self.log_path is None:
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(self._offset)
            return decode_summary(f.read().decode(errors="replace"))

    def stop(self) -> int | None:
        """Tokens prefilled since :meth:`start`; None where neither source answers. Sets :attr:`decode`."""
        self.decode = self._decode_lines()
        if self._before is not None:
            after = _read_metrics(self.url)
            return after.prefilled_since(self._before) if after is not None else None
        if self.log_path is not None:
            return log_new_tokens(self.log_path, self._offset)[0]
        return None
