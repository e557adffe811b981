"""A model's ``config.json`` against its own weights, from the safetensors headers alone.

The config decides how many layers are built and how large every tensor is; the weights
are what the model really is. A config with more layers than the weights builds the
extra layers from random numbers (and a dataset of them verifies, since its hashes are
its own); a config with a larger vocabulary, hidden size or head count than the weights
allocates tensors of that size before anything fails (16M vocabulary rows: 8.5 GB).
So the sizes are compared with the tensors' shapes, read from each file's header (the
one parser, :mod:`hs_dataset.codecs.safetensors_layout`), before anything is allocated or
any server started: every layer the config names must have weights and no weights may
name a layer beyond it, and the shapes of the embedding, the norms, the attention and
the MLP projections must be the ones the config's sizes make. Quantized tensors (integer
dtypes: packed 4-bit, int8) are counted but not shape-checked.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hs_dataset.codecs.safetensors_layout import read_header
from hs_dataset.errors import FormatError, HsDatasetError, ModelConfigError
from hs_dataset.model.model_config import text_config

__all__ = ["EMBED_SUFFIX", "MAX_INDEX_BYTES", "check_weights", "text_prefix", "weight_shapes"]

EMBED_SUFFIX = "model.embed_tokens.weight"
INDEX_NAME = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 * 1024 * 1024  # an index lists every tensor name once: a few MB for the largest models
_FLOAT_DTYPES = {"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"}
_LAYER = re.compile(r"layers\.(\d{1,6})\.(.+)\Z")
_EXPERT = re.compile(r"experts\.(\d{1,6})\.")
_FIX = "use the snapshot's own config.json (or download the weights again)"

Shapes = dict[str, tuple[tuple[int, ...], str]]  # tensor name -> (shape, safetensors dtype)


def _open_weights(path: Path) -> Any:
    """A weights file, followed through links (a Hub cache snapshot is links to blobs), only if it is a regular file."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ModelConfigError(f"{path}: not a regular file; {_FIX}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _index_files(directory: Path) -> dict[str, str] | None:
    """The index's tensor name -> file name (plain names in ``directory`` only), or None without an index."""
    index = directory / INDEX_NAME
    if not index.exists():
        return None
    try:
        with _open_weights(index) as f:
            raw = f.read(MAX_INDEX_BYTES + 1)
        if len(raw) > MAX_INDEX_BYTES:
            raise ModelConfigError(f"{index}: over {MAX_INDEX_BYTES} bytes, not a weights index; {_FIX}")
        weight_map = json.loads(raw).get("weight_map")
    except (OSError, ValueError, AttributeError, RecursionError) as exc:
        raise ModelConfigError(f"{index}: unreadable weights index ({str(exc)[:120]}); {_FIX}") from None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise ModelConfigError(f"{index}: weight_map must map tensor names to file names; {_FIX}")
    bad = next((v for v in weight_map.values() if v != os.path.basename(v) or v in ("", ".", "..") or not v.endswith(".safetensors")), None)
    if bad is not None:
        raise ModelConfigError(f"{index}: weight_map names the file {bad[:80]!r}, not a .safetensors file beside it; {_FIX}")
    return weight_map


def weight_shapes(directory: str | os.PathLike) -> Shapes:
    """Every tensor's shape and dtype in the snapshot's safetensors files (through the index where there is one).

    Only the headers are read. An empty result means the snapshot has no safetensors
    weights (a config-only directory, or ``.bin`` weights this check cannot read).
    """
    directory = Path(directory)
    weight_map = _index_files(directory)
    files = sorted(set(weight_map.values())) if weight_map is not None else sorted(p.name for p in directory.glob("*.safetensors"))
    shapes: Shapes = {}
    for name in files:
        path = directory / name
        try:
            with _open_weights(path) as f:
                specs, _meta, _start = read_header(f, str(path))
        except FileNotFoundError:
            raise ModelConfigError(f"{directory / INDEX_NAME}: names {name}, which is missing; {_FIX}") from None
        except (OSError, FormatError) as exc:
            raise ModelConfigError(f"{path}: unreadable weights ({str(exc)[:200]}); {_FIX}") from None
        for spec in specs.values():
            shapes[spec.name] = (spec.shape, spec.dtype)
    if weight_map is not None:
        absent = sorted(k for k in weight_map if k not in shapes)
        if absent:
            raise ModelConfigError(
                f"{directory / INDEX_NAME}: lists {len(absent)} tensor(s) its files lack, first {absent[0][:120]!r}; {_FIX}"
            )
    return shapes


def text_prefix(shapes: Mapping[str, Any], where: str) -> str:
    """The prefix of the text model's weights (``language_model.`` for Kimi-K2.5), from the embedding's name."""
    for name in shapes:
        if name.endswith(EMBED_SUFFIX) and "vision" not in name:
            return name[: -len(EMBED_SUFFIX)]
    raise ModelConfigError(
        f"{where}: no weight named '*{EMBED_SUFFIX}' (the text model's embedding); set model.text_module in the card, or {_FIX}"
    )


class _Checker:
    """The comparisons of one config with one set of shapes; the first mismatch is the error."""

    def __init__(self, shapes: Shapes, text: Mapping[str, Any], where: str) -> None:
        self.shapes, self.text, self.where = shapes, text, where

    def get(self, name: str, default: Any = None) -> Any:
        value = self.text.get(name)
        return default if value is None else value

    def expect(self, name: str, want: tuple[int | None, ...], because: str) -> None:
        """``name`` (when present, a float tensor) has shape ``want`` (None: any size on that axis)."""
        found = self.shapes.get(name)
        if found is None or found[1] not in _FLOAT_DTYPES:
            return
        shape = found[0]
        if len(shape) != len(want) or any(w is not None and w != s for w, s in zip(want, shape)):
            shown = [("*" if w is None else w) for w in want]
            raise ModelConfigError(
                f"{self.where}: {because} does not match the weights: {name} is {list(shape)}, the config makes it {shown}; {_FIX}"
            )


def _layers(shapes: Shapes, decoder: str) -> tuple[dict[int, set[str]], dict[int, set[int]]]:
    """Layer index -> the names (after ``layers.N.``) of its tensors, expert numbers folded to ``experts.*.``;
    and layer index -> the numbers of its routed experts (``mlp.experts.J.``)."""
    found: dict[int, set[str]] = defaultdict(set)
    experts: dict[int, set[int]] = defaultdict(set)
    for name in shapes:
        if name.startswith(decoder):
            match = _LAYER.match(name, len(decoder))
            if match:
                layer, rest = int(match.group(1)), match.group(2)
                expert = _EXPERT.search(rest) if rest.startswith("mlp.experts.") else None
                if expert:
                    experts[layer].add(int(expert.group(1)))
                found[layer].add(_EXPERT.sub("experts.*.", rest))
    return found, experts


def _check_layer_set(layers: dict[int, set[str]], text: Mapping[str, Any], decoder: str, where: str) -> None:
    """Layers 0..L-1 all have weights (and every tensor their kind has); none beyond L (+ the MTP layers a config names)."""
    count = int(text["num_hidden_layers"])
    extra_allowed = int(text.get("num_nextn_predict_layers") or 0)
    missing = [i for i in range(count) if i not in layers]
    if missing:
        have = f"layers 0..{max(layers)}" if layers else "no layers"
        raise ModelConfigError(
            f"{where}: num_hidden_layers is {count} but the weights hold {have}: no weights for {decoder}layers.{missing[0]}.* "
            f"({len(missing)} layer(s) missing, which would run from random numbers); {_FIX}"
        )
    beyond = sorted(i for i in layers if i >= count + extra_allowed)
    if beyond:
        raise ModelConfigError(
            f"{where}: num_hidden_layers is {count} but the weights hold unexpected layers from {decoder}layers.{beyond[0]}.* on "
            f"({len(beyond)} layer(s) the config does not build); {_FIX}"
        )
    kinds: dict[bool, set[str]] = defaultdict(set)  # MoE layers and dense layers each have one set of tensors
    for i in range(count):
        kinds[any(n.startswith("mlp.experts.") for n in layers[i])] |= layers[i]
    for i in range(count):
        lacking = sorted(kinds[any(n.startswith("mlp.experts.") for n in layers[i])] - layers[i])
        if lacking:
            raise ModelConfigError(
                f"{where}: missing weights: {decoder}layers.{i}.{lacking[0]}"
                + (f" and {len(lacking) - 1} more" if len(lacking) > 1 else "")
                + f" (the other layers of its kind have them; they would run from random numbers); {_FIX}"
            )


def _check_sizes(c: _Checker, decoder: str, prefix: str, layers: dict[int, set[str]], experts: dict[int, set[int]]) -> None:
    hidden, vocab = int(c.text["hidden_size"]), c.get("vocab_size")
    c.expect(decoder + "embed_tokens.weight", (vocab, hidden), f"vocab_size {vocab} / hidden_size {hidden}")
    c.expect(decoder + "norm.weight", (hidden,), f"hidden_size {hidden}")
    c.expect(prefix + "lm_head.weight", (vocab, hidden), f"vocab_size {vocab} / hidden_size {hidden}")
    if prefix + "lm_head.weight" not in c.shapes and c.text.get("tie_word_embeddings") is False:
        raise ModelConfigError(f"{c.where}: missing weights: {prefix}lm_head.weight (tie_word_embeddings is false); {_FIX}")
    heads = c.get("num_attention_heads")
    kv_heads = c.get("num_key_value_heads", heads)
    head_dim = c.get("head_dim", hidden // heads if heads else None)
    mla = (c.get("qk_nope_head_dim", 0) + c.get("qk_rope_head_dim", 0)) or None
    for i in sorted(layers):
        base = f"{decoder}layers.{i}."
        for norm in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            c.expect(base + norm, (hidden,), f"hidden_size {hidden}")
        if heads and base + "self_attn.kv_a_proj_with_mqa.weight" in c.shapes:
            _check_mla(c, base + "self_attn.", heads, mla, hidden)
        elif heads:
            c.expect(base + "self_attn.q_proj.weight", (heads * head_dim, hidden), f"num_attention_heads {heads} x head_dim {head_dim}")
            for proj in ("k_proj", "v_proj"):
                c.expect(
                    base + f"self_attn.{proj}.weight",
                    (kv_heads * head_dim, hidden),
                    f"num_key_value_heads {kv_heads} x head_dim {head_dim}",
                )
            c.expect(base + "self_attn.o_proj.weight", (hidden, heads * head_dim), f"num_attention_heads {heads} x head_dim {head_dim}")
        _check_mlp(c, base + "mlp.", hidden, experts.get(i, set()))


def _check_mla(c: _Checker, base: str, heads: int, qk_dim: int | None, hidden: int) -> None:
    """Multi-head latent attention (DeepseekV3, Kimi): the low-rank projections."""
    q_rank, kv_rank, rope = c.get("q_lora_rank"), c.get("kv_lora_rank"), c.get("qk_rope_head_dim")
    v_dim, nope = c.get("v_head_dim"), c.get("qk_nope_head_dim")
    why_q = f"num_attention_heads {heads} x (qk_nope_head_dim + qk_rope_head_dim)"
    c.expect(base + "q_a_proj.weight", (q_rank, hidden), f"q_lora_rank {q_rank}")
    c.expect(base + "q_b_proj.weight", (heads * qk_dim if qk_dim else None, q_rank), f"{why_q} / q_lora_rank {q_rank}")
    c.expect(base + "q_proj.weight", (heads * qk_dim if qk_dim else None, hidden), why_q)
    c.expect(
        base + "kv_a_proj_with_mqa.weight",
        (kv_rank + rope if kv_rank and rope is not None else None, hidden),
        f"kv_lora_rank {kv_rank} + qk_rope_head_dim {rope}",
    )
    kv_b = heads * (nope + v_dim) if nope is not None and v_dim else None
    c.expect(
        base + "kv_b_proj.weight",
        (kv_b, kv_rank),
        f"num_attention_heads {heads} x (qk_nope_head_dim + v_head_dim) / kv_lora_rank {kv_rank}",
    )
    c.expect(base + "o_proj.weight", (hidden, heads * v_dim if v_dim else None), f"num_attention_heads {heads} x v_head_dim {v_dim}")


def _check_mlp(c: _Checker, base: str, hidden: int, numbers: set[int]) -> None:
    """Dense MLP (intermediate_size), routed experts (their count and moe_intermediate_size), shared experts."""
    inter, moe = c.get("intermediate_size"), c.get("moe_intermediate_size")
    for proj in ("gate_proj", "up_proj"):
        c.expect(base + f"{proj}.weight", (inter, hidden), f"intermediate_size {inter}")
    c.expect(base + "down_proj.weight", (hidden, inter), f"intermediate_size {inter}")
    experts = c.get("n_routed_experts") or c.get("num_experts") or c.get("num_local_experts")
    if numbers and experts and numbers != set(range(experts)):
        raise ModelConfigError(
            f"{c.where}: the routed expert count ({experts}) does not match the weights: {base}experts holds {len(numbers)} "
            f"(numbers {min(numbers)}..{max(numbers)}); {_FIX}"
        )
    c.expect(base + "gate.weight", (experts, hidden), f"the routed expert count {experts}")
    for j in sorted(numbers)[:1]:
        c.expect(base + f"experts.{j}.gate_proj.weight", (moe, hidden), f"moe_intermediate_size {moe}")
        c.expect(base + f"experts.{j}.down_proj.weight", (hidden, moe), f"moe_intermediate_size {moe}")
    shared = c.get("n_shared_experts")
    if moe and shared:
        c.expect(
            base + "shared_experts.gate_proj.weight", (moe * shared, hidden), f"moe_intermediate_size {moe} x n_shared_experts {shared}"
        )


def check_weights(directory: str | os.PathLike, config: Mapping[str, Any]) -> int:
    """Refuse (:class:`ModelConfigError`, naming the field and the tensor) a config that does not match its weights.

    ``config``: the checked ``config.json`` (:func:`~hs_dataset.model.model_config.read_model_config`).
    Returns the number of tensors compared (0: no safetensors weights to compare with).
    """
    where = str(Path(directory) / "config.json")
    shapes = weight_shapes(directory)
    if not shapes:
        return 0
    text = text_config(config)
    prefix = text_prefix(shapes, where)
    decoder = prefix + "model."
    layers, experts = _layers(shapes, decoder)
    try:
        _check_layer_set(layers, text, decoder, where)
        _check_sizes(_Checker(shapes, text, where), decoder, prefix, layers, experts)
    except HsDatasetError:
        raise
    except (TypeError, ValueError, ZeroDivisionError) as exc:  # a size the range table let through but no model can have
        raise ModelConfigError(f"{where}: sizes that no model of these weights can have ({exc}); {_FIX}") from None
    return len(shapes)
