"""In-process Hugging Face capture: batched forward, hooks on exactly the layers asked for.

Meaning of what is captured (the manifest records it):

* aux id ``i`` is transformers' ``output_hidden_states[i]``: ``i = 0`` is the
  embedding output, ``i >= 1`` the output of decoder layer ``i - 1``. We read it with
  a forward hook on that module instead of ``output_hidden_states=True``, which would
  keep every layer of the batch alive at once.
* the final state is the input of the model's final norm (``pre_norm``), taken with a
  forward pre-hook on ``model.norm``; the norm's weight and eps are reported so a
  post-norm state can be derived exactly.

Batches are right-padded. With causal attention and an attention mask, real tokens
never see padding, and padded rows are cut off before anything is returned.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from hs_dataset.capture.base import CaptureBackend, CaptureFailure, CaptureInfo, CaptureResult, CaptureTarget
from hs_dataset.config import Card, CardError, HFBackendSection, RegenerateSection
from hs_dataset.dtypes import state_dtype
from hs_dataset.formats.vocabulary import describe_outside, outside_vocabulary
from hs_dataset.model.model_config import load_text_config, text_config
from hs_dataset.model.remote_code import check_remote_code
from hs_dataset.model.snapshot import model_fingerprint, resolve_model_path
from hs_dataset.model.text_model import load_causal_lm, loaded_module_path
from hs_dataset.regenerate.generator import Generator, HFGenerator
from hs_dataset.sample import CapturedSample, TokenizedSample

__all__ = ["HFBackend", "find_decoder", "pick_device"]


def pick_device(device: str = "auto") -> torch.device:
    """``auto`` means CUDA when present, else CPU; GPU code paths degrade to CPU cleanly."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} asked for but CUDA is not available; use --device cpu or auto")
    return torch.device(device)


def find_decoder(model: torch.nn.Module, module_path: str | None = None) -> torch.nn.Module:
    """The decoder stack (has ``embed_tokens``, ``layers`` and ``norm``), e.g. ``language_model.model`` for Kimi-K2.5."""
    candidates = [module_path] if module_path else ["model", "language_model.model", "model.language_model", ""]
    for path in candidates:
        module = model
        try:
            for part in filter(None, (path or "").split(".")):
                module = getattr(module, part)
        except AttributeError:
            continue
        if all(hasattr(module, name) for name in ("embed_tokens", "layers", "norm")):
            return module
    raise ValueError(
        f"{type(model).__name__}: no decoder with embed_tokens/layers/norm found at {candidates}; set model.text_module in the card"
    )


class HFBackend(CaptureBackend):
    """Capture with ``transformers`` in this process (CPU or CUDA).

    Args:
        section: the card's ``backend`` section (``name: hf``); its ``device`` is used
            unless ``device`` is given.
        target: the model, aux layers (HF ``hidden_states`` indexes) and dtype
            (``None``: float32).
        device: overrides ``section.device`` (``auto``, ``cpu``, ``cuda:N``).
    """

    fixed_batches = True

    def __init__(self, section: HFBackendSection, target: CaptureTarget, *, device: str | None = None) -> None:
        self.model_path = resolve_model_path(target.model_path)
        self.aux_layer_ids = list(target.aux_layer_ids)
        self._check_aux(int(load_text_config(self.model_path)["num_hidden_layers"]))  # before minutes of loading
        self.device = pick_device(device or section.device)
        self.dtype = state_dtype(target.dtype or "float32")
        model = load_causal_lm(self.model_path, dtype=self.dtype, trust_remote_code=target.trust_remote_code)
        self.model = model.to(self.device).eval()
        self.decoder = find_decoder(self.model, loaded_module_path(self.model_path, target.text_module))
        self.num_layers = len(self.decoder.layers)
        self._check_aux(self.num_layers)
        self.model_revision = target.model_revision
        self._fingerprint: str | None = None

    def _check_aux(self, num_layers: int) -> None:
        bad = [i for i in self.aux_layer_ids if not 0 <= i < num_layers]
        if bad:
            raise CardError(
                f"layers.aux: aux layer ids {bad} are outside 0..{num_layers - 1} for the {num_layers}-layer model in {self.model_path} "
                f"(HF hidden_states index; hidden_states[{num_layers}] is the final state, captured separately): pick ids below {num_layers}"
            )

    @classmethod
    def from_card(cls, card: Card, *, model_path: str | None = None, device: str | None = None) -> HFBackend:
        """Build from a card (see docs/CARDS.md); ``model_path`` and ``device`` override the card's."""
        section = card.backend
        if not isinstance(section, HFBackendSection):
            raise ValueError(f"config {card.name!r} uses backend {section.name!r}; HFBackend needs `backend: {{name: hf}}`")
        target = CaptureTarget.from_card(card, model_path=model_path)
        # the tokenizer is loaded after the model: refuse its remote code before minutes of loading
        check_remote_code(target.model_path, target.trust_remote_code, ("tokenizer_config.json",))
        return cls(section, target, device=device)

    # ------------------------------------------------------------------ info
    def info(self) -> CaptureInfo:
        text = text_config(self.model.config)
        norm = self.decoder.norm
        eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or getattr(text, "rms_norm_eps", None)
        if self._fingerprint is None:
            self._fingerprint = model_fingerprint(self.model_path)
        return CaptureInfo(
            model_path=str(self.model_path),
            model_fingerprint=self._fingerprint,
            model_revision=self.model_revision,
            aux_layer_ids=self.aux_layer_ids,
            hidden_size=int(text.hidden_size),
            num_hidden_layers=self.num_layers,
            vocab_size=int(text.vocab_size),
            dtype=self.dtype,
            final_state="pre_norm",
            final_norm_eps=float(eps) if eps is not None else None,
            final_norm_weight=norm.weight.detach().to("cpu", torch.float32).clone(),
            backend="hf",
            backend_details={"device": str(self.device), "transformers_model_class": type(self.model).__name__},
            verification={"verified": True, "by": "tests/capture/test_hf.py: transformers' own hidden_states through forward hooks"},
        )

    # ------------------------------------------------------------------ capture
    @contextlib.contextmanager
    def _hooks(self, store: dict[Any, torch.Tensor]):
        handles = []

        def keep_output(key):
            def hook(_module, _inputs, output):
                store[key] = output[0] if isinstance(output, tuple) else output

            return hook

        def keep_norm_input(_module, args, kwargs):
            store["final"] = args[0] if args else kwargs["hidden_states"]

        for layer_id in self.aux_layer_ids:
            module = self.decoder.embed_tokens if layer_id == 0 else self.decoder.layers[layer_id - 1]
            handles.append(module.register_forward_hook(keep_output(layer_id)))
        handles.append(self.decoder.norm.register_forward_pre_hook(keep_norm_input, with_kwargs=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    @torch.inference_mode()
    def capture_batch(self, samples: Sequence[TokenizedSample]) -> list[CaptureResult]:
        if not samples:
            return []
        lengths = [s.num_tokens for s in samples]
        width = max(lengths)
        vocab = text_config(self.model.config).vocab_size
        ids = torch.zeros(len(samples), width, dtype=torch.int64)
        mask = torch.zeros(len(samples), width, dtype=torch.int64)
        results: list[CaptureResult | None] = [None] * len(samples)
        for row, sample in enumerate(samples):
            if sample.num_tokens == 0:
                results[row] = CaptureFailure(sample.sample_id, "empty sample")
                continue
            outside = outside_vocabulary(sample.input_ids, vocab)  # the package's one vocabulary check
            if outside is not None:
                results[row] = CaptureFailure(sample.sample_id, f"{describe_outside(outside, vocab)} of the model")
                continue
            ids[row, : sample.num_tokens] = sample.input_ids
            mask[row, : sample.num_tokens] = 1
        store: dict[Any, torch.Tensor] = {}
        with self._hooks(store):
            self.decoder(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=False)
        final = store["final"].to("cpu")  # [B, W, H]
        if self.aux_layer_ids:
            aux = torch.stack([store[i] for i in self.aux_layer_ids], dim=2).to("cpu")  # [B, W, K, H]
        else:  # the final state only: K = 0
            aux = final.new_empty((*final.shape[:2], 0, final.shape[-1]))
        for row, sample in enumerate(samples):
            if results[row] is not None:
                continue
            t = sample.num_tokens
            results[row] = CapturedSample(
                sample_id=sample.sample_id,
                input_ids=sample.input_ids,
                loss_mask=sample.loss_mask,
                aux_hidden_states=aux[row, :t].clone(),
                final_hidden_state=final[row, :t].clone(),
            )
        return results  # type: ignore[return-value]

    def generator(self, regenerate: RegenerateSection, tokenizer: Any) -> Generator:
        """``model.generate`` on the model this backend captures from (left-padded with the tokenizer's pad, else eos, id)."""
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        return HFGenerator(self.model, pad_token_id=int(pad), model_fingerprint=self.info().model_fingerprint)

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
