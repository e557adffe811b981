"""A tiny *trained* Llama verifier, built locally and deterministically in a few minutes on one CPU core.

A random verifier's hidden states predict nothing, so no data can teach a drafter to
speed it up. This model is trained on synthetic chat tasks with learnable answers
(copy, reverse, sort, add, upper-case, count, a templated greeting), rendered with the
Kimi-K2.5-shaped chat template of the tiny model, so that a drafter trained on its
states can measurably agree with it and a drafter trained on broken states cannot.

The tokenizer is character level (printable ASCII plus the chat control tokens), so the
vocabulary is 128 rows and training is cheap. Llama-shaped because speculators' EAGLE-3
drafter copies the verifier's layer config and knows Llama and Qwen3 only. Nothing is
downloaded; the build is cached under a recipe fingerprint like ``tiny_model.py`` and
writes ``training.json`` (final loss, next-token accuracy on held-out answers).

After training the final norm is reparameterised (:func:`reparameterise_final_norm`):
its weight is multiplied by a fixed, strongly non-uniform per-channel factor and the
lm_head's input columns are divided by the same factor, which leaves the function the
model computes unchanged (``lm_head(w * x) == (lm_head / s)((w * s) * x)``). Trained, the
weight is nearly uniform (about 1.16 +- 0.02), and RMSNorm with a uniform weight applied
to an already-normalised state returns the same direction: post-norm states in place of
pre-norm ones would then give the same targets and go undetected. With the factor they
do not.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import string
import time
from pathlib import Path

from hs_dataset.testing.cached_build import build_once
from typing import Callable

from hs_dataset.testing.tiny_model import default_cache_dir

__all__ = [
    "VERIFIER_CONFIG", "VERIFIER_AUX_LAYERS", "TrainRecipe", "DEFAULT_RECIPE", "CI_RECIPE",
    "build_tiny_verifier", "tiny_verifier_dir", "task_prompt", "task_prompts",
    "final_norm_factor", "reparameterise_final_norm",
]

_BUILD_REVISION = 2  # 2: final norm reparameterised (non-uniform weight), same function
VERIFIER_AUX_LAYERS = [1, 2, 3]  # HF hidden_states indexes: low, middle, high of the 4 layers
_SPECIALS = ("<unk>", "<s>", "</s>")
_CHAT_TOKENS = ("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>", "<think>", "</think>")
_CHARS = string.printable[:95] + "\n"  # printable ASCII incl. space, plus newline

VERIFIER_CONFIG: dict = {
    "vocab_size": 128,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}


class TrainRecipe(dict):
    """Training hyper-parameters; a dict so it enters the fingerprint as JSON."""


DEFAULT_RECIPE = TrainRecipe(seed=1234, steps=240, batch=16, lr=4e-3, warmup=10, corpus=6000)
# Fewer steps for CI: the same tasks, a less converged verifier.
CI_RECIPE = TrainRecipe(seed=1234, steps=100, batch=16, lr=4e-3, warmup=10, corpus=2000)


# ---------------------------------------------------------------------------- tasks
def _word(rng: random.Random, lo: int = 3, hi: int = 7) -> str:
    return "".join(rng.choice(string.ascii_lowercase[:12]) for _ in range(rng.randint(lo, hi)))


def _digits(rng: random.Random) -> str:
    return "".join(rng.choice("123456789") for _ in range(rng.randint(3, 7)))


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"add {a}+{b}", str(a + b)


def _count(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(3, 9)
    return f"count to {n}", " ".join(str(i) for i in range(1, n + 1))


_TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "copy": lambda r: (lambda w: (f"copy {w}", w))(_word(r)),
    "reverse": lambda r: (lambda w: (f"reverse {w}", w[::-1]))(_word(r)),
    "sort": lambda r: (lambda d: (f"sort {d}", "".join(sorted(d))))(_digits(r)),
    "upper": lambda r: (lambda w: (f"upper {w}", w.upper()))(_word(r)),
    "add": _add,
    "count": _count,
    "greet": lambda r: (lambda w: (f"hi, I am {w}", f"Hello {w}, nice to meet you. How can I help?"))(_word(r).capitalize()),
}


def task_prompt(rng: random.Random) -> tuple[str, str]:
    """One (prompt, answer) pair of a random task."""
    return _TASKS[rng.choice(sorted(_TASKS))](rng)


def task_prompts(n: int, seed: int) -> list[dict]:
    """``n`` bundled-style conversations (one user turn, the reference answer), ids ``task-SEED-I``."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt, answer = task_prompt(rng)
        rows.append({"id": f"task-{seed}-{i}", "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]})
    return rows


# ---------------------------------------------------------------------------- tokenizer
def _write_tokenizer(directory: Path) -> None:
    """A character-level fast tokenizer with the tiny model's Kimi-shaped chat template."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    from hs_dataset.testing.tiny_tokenizer import kimi_k25_chat_template

    vocab = {tok: i for i, tok in enumerate(_SPECIALS + tuple(_CHARS))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>")
    tokenizer.add_special_tokens({"additional_special_tokens": list(_CHAT_TOKENS)})
    assert len(tokenizer) <= VERIFIER_CONFIG["vocab_size"], len(tokenizer)
    tokenizer.chat_template = kimi_k25_chat_template()
    tokenizer.save_pretrained(directory)


# ---------------------------------------------------------------------------- training
def _encode_corpus(tokenizer, rows: list[dict]) -> tuple[list[list[int]], list[int]]:
    """Token ids of each rendered conversation and where its answer starts."""
    ids, starts = [], []
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["messages"][:1], add_generation_prompt=True, thinking=False, tokenize=False)
        full = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        assert full.startswith(prompt), (prompt, full)
        ids.append(tokenizer(full, add_special_tokens=False)["input_ids"])
        starts.append(len(tokenizer(prompt, add_special_tokens=False)["input_ids"]))
    return ids, starts


def _batch(seqs: list[list[int]], starts: list[int], pad: int):
    """Right-padded ids, attention mask, and the answer-token mask (targets only)."""
    import torch

    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids, dtype=torch.bool)
    answer = torch.zeros_like(attn)
    for row, (seq, start) in enumerate(zip(seqs, starts)):
        ids[row, : len(seq)] = torch.tensor(seq)
        attn[row, : len(seq)] = True
        answer[row, start : len(seq)] = True
    return ids, attn, answer


def _loss_and_accuracy(model, ids, attn, answer):
    """Next-token loss over all real tokens; accuracy over answer tokens (the part a drafter predicts)."""
    import torch.nn.functional as F

    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    target, real, scored = ids[:, 1:], attn[:, 1:], answer[:, 1:]
    loss = F.cross_entropy(logits[real], target[real])
    correct = (logits.argmax(-1) == target) & scored
    return loss, correct.sum().item() / max(1, scored.sum().item())


def _train(directory: Path, recipe: TrainRecipe) -> dict:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(directory)
    train_ids, train_starts = _encode_corpus(tokenizer, task_prompts(recipe["corpus"], recipe["seed"]))
    eval_ids, eval_starts = _encode_corpus(tokenizer, task_prompts(256, recipe["seed"] + 1))
    saved_rng, threads = torch.random.get_rng_state(), torch.get_num_threads()
    torch.manual_seed(recipe["seed"])
    torch.set_num_threads(1)  # one reduction order on every machine; and small ops do not gain from threads
    try:
        model = LlamaForCausalLM(LlamaConfig(**VERIFIER_CONFIG, attn_implementation="sdpa"))
        optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=0.0)
        order = random.Random(recipe["seed"])
        started, losses = time.perf_counter(), []
        for step in range(recipe["steps"]):
            scale = min(1.0, (step + 1) / recipe["warmup"]) * 0.5 * (1 + math.cos(math.pi * step / recipe["steps"]))
            for group in optimizer.param_groups:
                group["lr"] = recipe["lr"] * scale
            pick = order.sample(range(len(train_ids)), recipe["batch"])
            loss, _ = _loss_and_accuracy(model, *_batch([train_ids[i] for i in pick], [train_starts[i] for i in pick], VERIFIER_CONFIG["pad_token_id"]))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
        model.eval()
        batch = _batch(eval_ids, eval_starts, VERIFIER_CONFIG["pad_token_id"])
        with torch.no_grad():
            before = model(input_ids=batch[0], attention_mask=batch[1]).logits
            reparameterise_final_norm(model)
            after = model(input_ids=batch[0], attention_mask=batch[1]).logits
            eval_loss, accuracy = _loss_and_accuracy(model, *batch)
        real, weight = batch[1], model.model.norm.weight.detach()
        reparam = {
            "factor": f"sign * log-uniform [1/{NORM_FACTOR_RANGE:g}, {NORM_FACTOR_RANGE:g}], seed {NORM_FACTOR_SEED}",
            "max_abs_logit_change": float((after - before)[real].abs().max()),
            "argmax_unchanged": bool(torch.equal(after.argmax(-1)[real], before.argmax(-1)[real])),
            "norm_weight_abs_min": round(float(weight.abs().min()), 4),
            "norm_weight_abs_max": round(float(weight.abs().max()), 4),
            "norm_weight_negative": int((weight < 0).sum()),
        }
        if not reparam["argmax_unchanged"] or reparam["max_abs_logit_change"] > 1e-3:
            raise AssertionError(f"final-norm reparameterisation changed the model: {reparam}")
    finally:
        torch.random.set_rng_state(saved_rng)
        torch.set_num_threads(threads)
    model.save_pretrained(directory, safe_serialization=True)
    return {
        "recipe": dict(recipe), "train_seconds": round(time.perf_counter() - started, 1),
        "final_train_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4), "first_train_loss": round(losses[0], 4),
        "heldout_loss": round(eval_loss.item(), 4), "heldout_answer_next_token_accuracy": round(accuracy, 4),
        "final_norm_reparameterisation": reparam,
    }


# ---------------------------------------------------------------------------- reparameterisation
NORM_FACTOR_SEED = 20261130
NORM_FACTOR_RANGE = 4.0


def final_norm_factor(hidden_size: int = VERIFIER_CONFIG["hidden_size"]):
    """The fixed per-channel factor ``s``: a random sign times log-uniform magnitude in [1/4, 4], from a fixed seed.

    Magnitudes alone (positive ``s``) leave the argmax of post-norm targets equal to the
    true one on ~85% of answer tokens (simulated on the earlier build); with the sign,
    which RMSNorm's ``w * w`` in the doubled norm loses, on ~4%. Both keep the function.
    """
    import torch

    gen = torch.Generator().manual_seed(NORM_FACTOR_SEED)
    magnitude = torch.exp((2 * torch.rand(hidden_size, generator=gen, dtype=torch.float64) - 1) * math.log(NORM_FACTOR_RANGE))
    sign = torch.where(torch.rand(hidden_size, generator=gen) < 0.5, -1.0, 1.0).double()
    return (sign * magnitude).float()


def reparameterise_final_norm(model, factor=None) -> None:
    """In place: final norm weight ``* s``, lm_head input columns ``/ s`` (untied from the embeddings first)."""
    import torch

    s = final_norm_factor(model.config.hidden_size) if factor is None else factor
    head, norm = model.get_output_embeddings(), model.model.norm
    with torch.no_grad():
        if head.weight is model.get_input_embeddings().weight or getattr(model.config, "tie_word_embeddings", False):
            head.weight = torch.nn.Parameter(head.weight.detach().clone())
            model.config.tie_word_embeddings = False
        norm.weight.mul_(s.to(norm.weight.dtype))
        head.weight.div_(s.to(head.weight.dtype))


# ---------------------------------------------------------------------------- cache
def _fingerprint(recipe: TrainRecipe) -> str:
    """Changes whenever the built files could: config, recipe, revision, this module's and the template's source."""
    from hs_dataset.testing import tiny_tokenizer

    key = json.dumps({"config": VERIFIER_CONFIG, "recipe": recipe, "rev": _BUILD_REVISION}, sort_keys=True).encode()
    return hashlib.sha256(key + Path(__file__).read_bytes() + tiny_tokenizer.KIMI_TEMPLATE_SHA256.encode()).hexdigest()[:16]


def tiny_verifier_dir(cache_dir: Path | None = None, recipe: TrainRecipe = DEFAULT_RECIPE) -> Path:
    """The cache path of the verifier for ``recipe`` (built or not)."""
    return (cache_dir or default_cache_dir()) / "models" / f"tiny-verifier-{_fingerprint(recipe)}"


def build_tiny_verifier(cache_dir: Path | None = None, recipe: TrainRecipe = DEFAULT_RECIPE) -> Path:
    """Return the trained verifier's directory, training it on first use (atomic rename, as tiny_model does)."""
    def write(directory: Path) -> None:
        _write_tokenizer(directory)
        stats = _train(directory, recipe)
        (directory / "training.json").write_text(json.dumps({**stats, "fingerprint": _fingerprint(recipe)}, indent=2))

    return build_once(tiny_verifier_dir(cache_dir, recipe), "training.json", write)


def build_ci_verifier(cache_dir: Path | None = None) -> Path:
    """The smaller-recipe verifier the CI acceptance test uses."""
    return build_tiny_verifier(cache_dir, CI_RECIPE)


if __name__ == "__main__":
    built = build_tiny_verifier()
    print(built)
    print((built / "training.json").read_text())
