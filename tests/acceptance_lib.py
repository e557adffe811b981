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


@torch.no_grad()
def target_agreement(verifier: Path, ours: Path, other: Path) -> float:
    """Fraction of loss-masked positions where ``other``'s training target equals ours (argmax).

    The targets as speculators' trainer computes them (``eagle3/core.py``):
    ``verifier_lm_head(verifier_norm(final_hidden_state))``, with the verifier's own
    final-norm weight and lm_head, on the stored final states of the same samples.
    """
    from safetensors.torch import load_file

    from hs_dataset.formats.reader import open_dataset

    config = json.loads((verifier / "config.json").read_text())
    weights = load_file(str(verifier / "model.safetensors"))
    norm, head, eps = weights["model.norm.weight"].float(), weights["lm_head.weight"].float(), config["rms_norm_eps"]

    def targets(x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return (norm * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) @ head.T).argmax(-1)

    a, b = open_dataset(ours), open_dataset(other)
    same = total = 0
    for i in range(len(a)):
        sa, sb = a[i], b[i]
        mask = sa["loss_mask"].bool()
        same += int((targets(sa["final_hidden_state"]) == targets(sb["final_hidden_state"]))[mask].sum())
        total += int(mask.sum())
    return same / max(1, total)


# ---------------------------------------------------------------------------- training
def train_drafter(verifier: Path, data: Path, work: Path, *, seed: int, epochs: int, lr: float = 3e-3, extra: tuple[str, ...] = ()) -> Path:
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
        "--target-layer-ids", *map(str, VERIFIER_AUX_LAYERS), *speculators_cpu.CPU_FLAGS, *extra,
    ]
    with speculators_cpu.cpu_trainer():
        trainer_entry()(argv)
    return max((p for p in save.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def load_drafter(checkpoint: Path):
    """speculators' Eagle3DraftModel from a checkpoint, with SDPA attention and the verifier's embeddings/head."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    from safetensors.torch import load_file

    config = Eagle3SpeculatorConfig.from_pretrained(checkpoint)
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = Eagle3DraftModel.from_pretrained(checkpoint, config=config)
    model.load_verifier_weights()
    model = model.float().eval()
    # The frozen embeddings and lm_head are the verifier's: the checkpoint holds them rounded to
    # bfloat16 (speculators saves bf16), training used them in float32, and so does SGLang (it
    # shares the target's embeddings with the draft model).
    verifier = load_file(str(Path(config.speculators_config.verifier.name_or_path) / "model.safetensors"))
    with torch.no_grad():
        model.embed_tokens.weight.copy_(verifier["model.embed_tokens.weight"].float())
        if not model.use_draft_vocab:
            model.lm_head.weight.copy_(verifier["lm_head.weight"].float())
    return model


# ---------------------------------------------------------------------------- drafting
@torch.no_grad()
def draft(model, aux: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """Draft ``k`` tokens after every position: row j-1 holds depth-j drafts, ``[k, T]``.

    ``aux`` is the verifier's ``[T, K*H]`` aux states of tokens 0..T-1 and ``tokens`` the
    ids 1..T (the token each position's state led to). Same pre-fc norms, unroll, masks and
    position ids as speculators' training forward (``eagle3/core.py``), with the drafter's
    own argmax as next input.
    """
    from speculators.models.eagle3.attention import extend_dense_mask_for_draft_tokens
    from transformers import DynamicCache

    length = aux.shape[0]
    mask = model._build_attn_mask(torch.zeros(length, dtype=torch.long), length, aux.device)
    position_ids = torch.arange(1, length + 1).unsqueeze(0)
    features = aux.unsqueeze(0)
    if model.input_norm is not None:  # norm_before_fc (speculators' eagle3 default)
        features = model.input_norm(features)
    if model.fc_norm is not None:
        features = torch.cat([norm(chunk) for norm, chunk in zip(model.fc_norm, features.chunk(len(model.fc_norm), dim=-1))], dim=-1)
    hidden, ids, cache, out = model.fc(features), tokens.unsqueeze(0), DynamicCache(), []
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


# ---------------------------------------------------------------------------- SGLang's own EAGLE-3
REPO = Path(__file__).resolve().parents[1]
SGLANG_PYTHON = REPO / ".sglang-venv" / "bin" / "python"
EAGLE3_SHIM = Path(__file__).resolve().parent / "sglang_eagle3_shim"


def sglang_draft_dir(checkpoint: Path, verifier: Path, out: Path) -> Path:
    """speculators' checkpoint -> the directory SGLang 0.5.23's ``LlamaForCausalLMEagle3`` loads.

    SGLang does not read speculators' config (architecture ``Eagle3DraftModel``): it
    needs a Llama config with ``architectures: [LlamaForCausalLMEagle3]``, the aux
    layer ids in ``eagle_config`` (SGLang adds 1 to each on Llama, so HF
    ``hidden_states`` indexes minus one), ``norm_before_fc`` and ``norm_output``. The
    weight names are the same (``fc``, ``input_norm``, ``layers.0.*``, ``norm``,
    ``lm_head``); the frozen embeddings and lm_head are the verifier's float32 ones. SGLang has no
    ``norm_before_residual``: its draft layer always keeps the un-normed residual
    (``llama_eagle3.py``, ``LlamaDecoderLayer.forward``), so drafters for it are
    trained with ``--no-norm-before-residual``; the conversion refuses others.
    """
    from safetensors.torch import load_file, save_file

    from hs_dataset.testing.tiny_verifier import VERIFIER_AUX_LAYERS

    spec = json.loads((checkpoint / "config.json").read_text())
    if spec.get("norm_before_residual"):
        raise ValueError(f"{checkpoint}: norm_before_residual=true; SGLang 0.5.23's EAGLE-3 draft layer has no such option")
    layer = spec["transformer_layer_config"]
    weights = {k: v.float().contiguous() for k, v in load_file(str(checkpoint / "model.safetensors")).items() if not k.startswith(("verifier_", "t2d"))}
    target = load_file(str(verifier / "model.safetensors"))
    weights["embed_tokens.weight"] = target["model.embed_tokens.weight"].float().contiguous()  # SGLang uses the target's anyway
    if spec["draft_vocab_size"] == layer["vocab_size"]:
        weights["lm_head.weight"] = target["lm_head.weight"].float().contiguous()  # frozen copy of the verifier's (float32, as trained)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "torch_dtype": "float32",
        **{k: layer[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                  "rms_norm_eps", "max_position_embeddings", "vocab_size", "hidden_act")},
        "rope_theta": layer["rope_parameters"]["rope_theta"], "num_hidden_layers": spec["transformer_layer_config"]["num_hidden_layers"],
        "draft_vocab_size": spec["draft_vocab_size"], "tie_word_embeddings": False, "norm_output": bool(spec.get("norm_output")),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in VERIFIER_AUX_LAYERS], "norm_before_fc": bool(spec.get("norm_before_fc"))},
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


class SGLangEagle3Server:
    """A real SGLang 0.5.23 CPU server with ``--speculative-algorithm EAGLE3`` (chain: top-k 1), float32.

    The EAGLE path needs sgl-kernel CPU ops the CPU stand-in lacks and a ``torch_native``
    draft backend SGLang does not register: ``tests/sglang_eagle3_shim`` adds both
    (first on the server's ``PYTHONPATH``; nothing installed is edited).
    """

    def __init__(self, verifier: Path, draft: Path, steps: int, log: Path) -> None:
        self.verifier, self.draft, self.steps, self.log = verifier, draft, steps, log
        self.proc = None

    def __enter__(self) -> "SGLangEagle3Server":
        import os
        import socket
        import subprocess
        import time
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1", "OMP_WAIT_POLICY": "PASSIVE",
               "PYTHONPATH": os.pathsep.join([str(EAGLE3_SHIM), str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
        cmd = [str(SGLANG_PYTHON), "-m", "sglang.launch_server", "--model-path", str(self.verifier), "--device", "cpu",
               "--attention-backend", "torch_native", "--skip-tokenizer-init", "--disable-cuda-graph", "--host", "127.0.0.1",
               "--port", str(self.port), "--mem-fraction-static", "0.1", "--max-total-tokens", "4096", "--sampling-backend", "pytorch",
               "--grammar-backend", "none", "--dtype", "float32", "--disable-radix-cache", "--sleep-on-idle",
               "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(self.draft),
               "--speculative-num-steps", str(self.steps), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(self.steps + 1)]
        self._log = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang EAGLE-3 server exited ({self.proc.returncode}); log: {self.log}\n" + self.log.read_text()[-3000:])
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2)
                return self
            except OSError:
                time.sleep(1)
        self.__exit__(None, None, None)
        raise TimeoutError(f"SGLang EAGLE-3 server not healthy in 240 s; log: {self.log}")

    def __exit__(self, *exc) -> None:
        import os
        import signal

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except Exception:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    def generate(self, ids: list[int], max_new: int, stop: int) -> tuple[list[int], dict]:
        import urllib.request

        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "stop_token_ids": [stop]}}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=300).read())
        return out["output_ids"], out["meta_info"]


@dataclass
class SGLangScore:
    """SGLang's own EAGLE-3 on the held-out prompts: its reported accept lengths, and exactness vs plain greedy."""

    completion_tokens: int = 0
    verify_ct: int = 0
    correct_drafts: int = 0
    exact: bool = True
    per_request: list[float] = field(default_factory=list)

    @property
    def accept_length(self) -> float:
        """SGLang's ``spec_accept_length`` over all requests: completion tokens / verify passes (the prefill's token included)."""
        return self.completion_tokens / max(1, self.verify_ct)

    @property
    def tau(self) -> float:
        """Our tau's definition: tokens per verify pass, not counting the token of the prefill."""
        return (self.correct_drafts + self.verify_ct) / max(1, self.verify_ct)


def sglang_evaluate(server: SGLangEagle3Server, verifier: Verifier, prompts: list[str], max_new: int) -> SGLangScore:
    score = SGLangScore()
    for text in prompts:
        ids = verifier.prompt_ids(text)
        tokens, meta = server.generate(ids, max_new, verifier.stop)
        score.exact &= tokens == verifier.greedy(ids, max_new)
        score.completion_tokens += meta["completion_tokens"]
        score.verify_ct += meta["spec_verify_ct"]
        score.correct_drafts += meta["spec_num_correct_drafts"]
        score.per_request.append(meta["spec_accept_length"])
    return score
