"""Proof by training, shared by ``benchmarks/bench_acceptance.py`` and ``tests/test_acceptance.py``.

The trained tiny verifier (``hs_dataset/testing/tiny_verifier.py``) regenerates task
prompts through our pipeline (HF backend), its states are captured, and speculators'
own trainer trains a 1-layer EAGLE-3 drafter on them (CPU shims: ``speculators_cpu``).
Broken copies of the same dataset (states shifted by a token, post-norm final state,
zeroed aux) are written with ``ShardWriter`` and trained the same way. A drafter is
judged on held-out prompts by per-depth top-1 agreement with the verifier's greedy
tokens and by the mean accepted length (tau) of a greedy draft-and-verify loop, whose
output must equal plain greedy decoding.

The drafter runs with speculators' own ``Eagle3DraftModel`` modules (fc, decoder layer,
norm, lm_head, rotary embedding, masks); the draft loop unrolls its steps the way its
training forward does, feeding its own predictions instead of the teacher's tokens.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

VARIANTS = ("ours", "shift_aux", "shift_final", "postnorm")
STOP = "<|im_end|>"


# ---------------------------------------------------------------------------- data
def write_prompts(path: Path, n: int, seed: int) -> Path:
    """Task conversations as JSONL (the answers are rewritten by the verifier anyway)."""
    from hs_dataset.testing.tiny_verifier import task_prompts

    path.write_text("".join(json.dumps(row) + "\n" for row in task_prompts(n, seed)))
    return path


def verifier_card(verifier: Path, source: Path, max_new_tokens: int = 48):
    """The tiny-deepseek-hf card pointed at the verifier, its aux layers, the task prompts and regeneration."""
    from hs_dataset.config import load_card
    from hs_dataset.testing.tiny_verifier import VERIFIER_AUX_LAYERS

    return load_card("tiny-deepseek-hf").with_overrides(
        name="tiny-verifier-tasks", model={"path": str(verifier)}, layers={"aux": VERIFIER_AUX_LAYERS},
        source={"path": str(source)}, backend={"name": "hf", "device": "cpu", "batch_size": 16},
        regenerate={"enabled": True, "max_new_tokens": max_new_tokens, "thinking": "off", "concurrency": 32},
    )


def build_ours(verifier: Path, out: Path, n: int, seed: int) -> Path:
    """prompts -> regenerate (the verifier's own greedy answers) -> captured states, through build_dataset."""
    from hs_dataset.pipeline import build_dataset

    source = write_prompts(out.parent / f"prompts-{seed}.jsonl", n, seed)
    build_dataset(verifier_card(verifier, source), out)
    return out


def _shift(x: torch.Tensor) -> torch.Tensor:
    """State of token t-1 at t (the classic off-by-one); token 0 keeps its own."""
    return torch.cat([x[:1], x[:-1]])


def _transforms(norm_weight: torch.Tensor, eps: float) -> dict[str, Callable[[dict], dict]]:
    from hs_dataset.interop.common import derive_post_norm

    return {
        "shift_aux": lambda s: {**s, "aux_hidden_states": _shift(s["aux_hidden_states"])},
        "shift_final": lambda s: {**s, "final_hidden_state": _shift(s["final_hidden_state"])},
        "postnorm": lambda s: {**s, "final_hidden_state": derive_post_norm(s["final_hidden_state"], norm_weight, eps)},
        "zero_aux": lambda s: {**s, "aux_hidden_states": torch.zeros_like(s["aux_hidden_states"])},
    }


def write_broken(src: Path, dest: Path, kind: str) -> Path:
    """A separate dataset: ``src``'s samples with one bug, the manifest still claiming correct states."""
    from hs_dataset.formats.reader import open_dataset
    from hs_dataset.formats.writer import ShardWriter
    from hs_dataset.sample import CapturedSample

    data = open_dataset(src)
    weight, eps = data.final_norm()
    metadata = {k: v for k, v in data.manifest.metadata.items() if k not in ("regeneration",)}
    metadata["final_norm"] = {"eps": eps}
    change = _transforms(weight, eps)[kind]
    with ShardWriter(dest, metadata, final_norm_weight=weight) as writer:
        for i in range(len(data)):
            s = change({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in data[i].items()})
            writer.add(CapturedSample(s["sample_id"], s["input_ids"], s["loss_mask"], s["aux_hidden_states"], s["final_hidden_state"]))
    return dest


# ---------------------------------------------------------------------------- training
def train_drafter(verifier: Path, data: Path, work: Path, *, seed: int, epochs: int, lr: float = 3e-3) -> Path:
    """speculators' own trainer (hs_dataset backend, CPU shims), 1 EAGLE-3 layer; returns the last checkpoint dir.

    Epochs, not ``--max-steps``: speculators 0.9.0 stops each epoch at ``max_steps`` but still
    runs (and checkpoints) every remaining epoch."""
    import speculators_cpu

    from hs_dataset.interop.speculators_backend import register, trainer_entry, write_rows
    from hs_dataset.testing.tiny_verifier import VERIFIER_AUX_LAYERS, VERIFIER_CONFIG

    register()
    rows, save = work / "rows", work / "ckpt"
    write_rows(data, rows)
    argv = [
        "--verifier-name-or-path", str(verifier), "--speculator-type", "eagle3", "--num-layers", "1",
        "--hidden-states-dtype", "float32", "--num-workers", "0", "--draft-vocab-size", str(VERIFIER_CONFIG["vocab_size"]),
        "--no-resume-from-checkpoint", "--save-path", str(save), "--on-missing", "raise", "--epochs", str(epochs),
        "--total-seq-len", "1024", "--seed", str(seed), "--lr", str(lr), "--log-freq", "50",
        "--data-path", str(rows), "--hidden-states-backend", "hs_dataset", "--hs-dataset-path", str(data),
        "--target-layer-ids", *map(str, VERIFIER_AUX_LAYERS), *speculators_cpu.CPU_FLAGS,
    ]
    with speculators_cpu.cpu_trainer():
        trainer_entry()(argv)
    return max((p for p in save.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def load_drafter(checkpoint: Path):
    """speculators' Eagle3DraftModel from a checkpoint, with SDPA attention and the verifier's embeddings/head."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(checkpoint)
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = Eagle3DraftModel.from_pretrained(checkpoint, config=config)
    model.load_verifier_weights()
    return model.float().eval()


# ---------------------------------------------------------------------------- drafting
@torch.no_grad()
def draft(model, aux: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """Draft ``k`` tokens after every position: row j-1 holds depth-j drafts, ``[k, T]``.

    ``aux`` is the verifier's ``[T, K*H]`` aux states of tokens 0..T-1 and ``tokens`` the
    ids 1..T (the token each position's state led to). Same unroll, masks and position
    ids as speculators' training forward, with the drafter's own argmax as next input.
    """
    from speculators.models.eagle3.attention import extend_dense_mask_for_draft_tokens
    from transformers import DynamicCache

    length = aux.shape[0]
    mask = model._build_attn_mask(torch.zeros(length, dtype=torch.long), length, aux.device)
    position_ids = torch.arange(1, length + 1).unsqueeze(0)
    hidden, ids, cache, out = model.fc(aux.unsqueeze(0)), tokens.unsqueeze(0), DynamicCache(), []
    for step in range(k):
        hidden = torch.cat([model.embed_tokens(ids), hidden], dim=-1)
        rope = model.rotary_emb(hidden, position_ids)
        positions = torch.arange(step * length, (step + 1) * length)
        for layer in model.layers:
            hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, past_key_values=cache, cache_position=positions, position_embeddings=rope)
        if model.config.norm_output:
            hidden = model.norm(hidden)
        logits = model.lm_head(hidden if model.config.norm_output else model.norm(hidden))
        best = logits.argmax(-1)
        ids = best + model.d2t[best] if model.use_draft_vocab else best
        out.append(ids[0])
        mask, position_ids = extend_dense_mask_for_draft_tokens(mask, length), position_ids + 1
    return torch.stack(out)


class Verifier:
    """The trained verifier: greedy logits and the aux states EAGLE-3 reads (HF hidden_states indexes)."""

    def __init__(self, path: Path, aux_ids: list[int]) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.aux_ids, self.stop = aux_ids, self.tokenizer.convert_tokens_to_ids(STOP)

    def prompt_ids(self, text: str) -> list[int]:
        msgs = [{"role": "user", "content": text}]
        return self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, thinking=False, tokenize=True, return_dict=False)

    @torch.no_grad()
    def forward(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy next token after every position ``[T]`` and concatenated aux states ``[T, K*H]``."""
        out = self.model(torch.tensor([ids]), output_hidden_states=True)
        aux = torch.cat([out.hidden_states[i][0] for i in self.aux_ids], dim=-1)
        return out.logits[0].argmax(-1), aux

    @torch.no_grad()
    def greedy(self, prompt: list[int], max_new: int) -> list[int]:
        """Plain greedy decoding (``model.generate``), stop token included."""
        out = self.model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=self.stop, pad_token_id=self.stop)
        return out[0, len(prompt):].tolist()


def speculative(verifier: Verifier, drafter, prompt: list[int], max_new: int, k: int) -> tuple[list[int], list[int]]:
    """Greedy draft-and-verify: k drafts, one verifier forward, the longest matching prefix + 1. Returns (tokens, accepted+1 per round)."""
    greedy, aux = verifier.forward(prompt)
    seq, new, rounds = list(prompt), [int(greedy[-1])], []
    while len(new) < max_new and new[-1] != verifier.stop:
        ctx = seq + new
        drafts = draft(drafter, aux[: len(ctx) - 1], torch.tensor(ctx[1:]), k)[:, -1].tolist()
        greedy, aux = verifier.forward(ctx + drafts)
        accepted = 0
        while accepted < k and drafts[accepted] == int(greedy[len(ctx) - 1 + accepted]):
            accepted += 1
        step = drafts[:accepted] + [int(greedy[len(ctx) - 1 + accepted])]
        rounds.append(len(step))
        new.extend(step)
        if verifier.stop in step:
            new = new[: new.index(verifier.stop) + 1]
    return new[:max_new], rounds


def agreement(verifier: Verifier, drafter, prompt: list[int], answer: list[int], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per depth: drafts equal to the verifier's greedy tokens, counted over answer positions where all shallower drafts matched; and the counts."""
    ids = prompt + answer
    _, aux = verifier.forward(ids)
    drafts = draft(drafter, aux[:-1], torch.tensor(ids[1:]), k)  # [k, T-1]: after token t+1, drafts of t+2..
    start, hits, tries = len(prompt) - 1, torch.zeros(k), torch.zeros(k)
    for pos in range(start, len(ids) - 2):
        for depth in range(k):
            target = pos + 2 + depth
            if target >= len(ids):
                break
            tries[depth] += 1
            if int(drafts[depth, pos]) != ids[target]:
                break
            hits[depth] += 1
    return hits, tries


@dataclass
class Score:
    """One drafter on the held-out prompts."""

    hits: torch.Tensor
    tries: torch.Tensor
    rounds: list[int] = field(default_factory=list)
    exact: bool = True

    @property
    def tau(self) -> float:
        return sum(self.rounds) / max(1, len(self.rounds))


def evaluate(verifier: Verifier, drafter, prompts: list[str], k: int, max_new: int) -> Score:
    """Agreement per depth and tau over ``prompts``; ``exact`` is False if any speculative output differs from plain greedy."""
    score, threads = Score(torch.zeros(k), torch.zeros(k)), torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: on a shared 2-core machine OpenMP threads mostly wait on each other
    try:
        for text in prompts:
            _score_prompt(score, verifier, drafter, text, k, max_new)
    finally:
        torch.set_num_threads(threads)
    return score


def _score_prompt(score: Score, verifier: Verifier, drafter, text: str, k: int, max_new: int) -> None:
    """Add one prompt's agreement counts and rounds to ``score``."""
    prompt = verifier.prompt_ids(text)
    reference = verifier.greedy(prompt, max_new)
    hits, tries = agreement(verifier, drafter, prompt, reference, k)
    score.hits += hits
    score.tries += tries
    tokens, rounds = speculative(verifier, drafter, prompt, max_new, k)
    score.rounds += rounds
    score.exact &= tokens == reference


def heldout_prompts(n: int, seed: int) -> list[str]:
    """User prompts from a seed no training source uses."""
    from hs_dataset.testing.tiny_verifier import task_prompts

    return [row["messages"][0]["content"] for row in task_prompts(n, seed)]


def scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
