"""Generation by the target model: the interface, and the in-process transformers implementation.

The regeneration stage (``regenerate/engine.py``) asks a :class:`Generator` to
continue prompts (token ids); each answer is the token ids the model wrote, including
the end-of-turn token when it stopped on one, and why it stopped. Two kinds: a batch
generator answers a list of prompts at once (:class:`HFGenerator` here,
``model.generate`` on left-padded batches); a :class:`StreamingGenerator` takes one
prompt at a time and answers it whenever it is done, so the engine can keep
:attr:`~StreamingGenerator.in_flight` requests going (``capture/sglang/generate.py``,
the capture server's own ``/generate``).
"""

from __future__ import annotations

import abc
import concurrent.futures
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hs_dataset.formats.regenerated_record import Finish

__all__ = [
    "ONE_PASS_META",
    "GenerationParams",
    "GenerationResult",
    "Generator",
    "HFGenerator",
    "OnePassTrace",
    "StreamingGenerator",
    "TracedGeneration",
]


@dataclass(frozen=True)
class GenerationParams:
    """Sampling settings shared by every request of a run (recorded in the manifest)."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop_token_ids": list(self.stop_token_ids),
        }


@dataclass(frozen=True)
class OnePassTrace:
    """Where a server kept the states of one generation while computing it (one-pass capture, issue 45).

    ``rid``: the one-pass request id its pieces are filed under; ``url``: the server (its staging dir holds
    them); ``cached_tokens``: prompt tokens the server took from its prefix cache, so computed by no pass of
    this request (None: the server did not say).
    """

    rid: str
    url: str
    cached_tokens: int | None = None


@dataclass(frozen=True)
class TracedGeneration:
    """One generation of a conversation whose states the server kept: where, and the ids it computed them for
    (the prompt, then the answer; the answer's last id is never fed back, so its state is not among them)."""

    trace: OnePassTrace
    ids: tuple[int, ...]


ONE_PASS_META = "one_pass"  # TokenizedSample.meta key: the conversation's TracedGenerations, in turn order


@dataclass(frozen=True)
class GenerationResult:
    """What the model wrote for one prompt: ids (the stop token included), and ``stop``/``length``/``failed``.

    ``trace``: set by a generator that captured the generation's states as it ran (one pass).
    """

    token_ids: list[int]
    finish: Finish
    error: str = ""
    trace: OnePassTrace | None = None


class Generator(abc.ABC):
    """Continues prompts with the target model; results come back in request order."""

    @abc.abstractmethod
    def generate(self, prompts: Sequence[list[int]], params: GenerationParams) -> list[GenerationResult]:
        """Generate for every prompt (concurrently or batched); one result per prompt, in order."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """Which engine and model generated (recorded in the manifest next to the parameters)."""


class StreamingGenerator(Generator):
    """A generator that answers each prompt on its own (servers): the engine keeps ``in_flight`` of them going."""

    in_flight: int  # requests to keep in flight, all servers together

    @abc.abstractmethod
    def submit(self, prompt: list[int], params: GenerationParams) -> concurrent.futures.Future[GenerationResult]:
        """Start generating for one prompt; the future's result is its answer (a failed one, never an exception)."""


def finish_of(ids: list[int], params: GenerationParams) -> Finish:
    """``stop`` when the last id is a stop token, else ``length``."""
    return "stop" if ids and ids[-1] in params.stop_token_ids else "length"


class HFGenerator(Generator):
    """``model.generate`` on left-padded batches of an already loaded transformers model."""

    def __init__(self, model: Any, *, pad_token_id: int = 0, model_fingerprint: str = "") -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.model_fingerprint = model_fingerprint

    def describe(self) -> dict[str, Any]:
        import transformers

        return {
            "engine": "transformers",
            "version": transformers.__version__,
            "model_class": type(self.model).__name__,
            "model_fingerprint": self.model_fingerprint,
            "batching": "left-padded batches of model.generate",
        }

    @torch.inference_mode()
    def generate(self, prompts: Sequence[list[int]], params: GenerationParams) -> list[GenerationResult]:
        if not prompts:
            return []
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.int64)
        mask = torch.zeros((len(prompts), width), dtype=torch.int64)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.int64)
            mask[row, width - len(prompt) :] = 1
        torch.manual_seed(params.seed)
        out = self.model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            **hf_generate_kwargs(params, self.pad_token_id),
        )
        return [self._result(row.tolist()[width:], params) for row in out.cpu()]

    def _result(self, new: list[int], params: GenerationParams) -> GenerationResult:
        for k, token in enumerate(new):  # generate pads rows that stopped early: cut after the first stop
            if token in params.stop_token_ids:
                return GenerationResult(new[: k + 1], "stop")
        return GenerationResult(new, finish_of(new, params))


def hf_generate_kwargs(params: GenerationParams, pad_token_id: int) -> dict[str, Any]:
    """``model.generate`` keyword arguments for ``params`` (also what a plain reference call uses)."""
    sampling = params.temperature > 0
    kwargs: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "do_sample": sampling,
        "eos_token_id": list(params.stop_token_ids) or None,
        "pad_token_id": pad_token_id,
    }
    if sampling:
        kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    return kwargs
