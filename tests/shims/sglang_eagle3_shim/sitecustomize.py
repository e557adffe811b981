"""TEST-ONLY: lets SGLang 0.5.23's EAGLE-3 worker use the ``torch_native`` attention backend on CPU.

``sglang/srt/speculative/draft_utils.py`` (``DraftBackendFactory``) maps attention
backend names to draft backends; on CPU it knows only ``intel_amx`` (AMX CPUs and the
real CPU sgl-kernel build), so ``--attention-backend torch_native`` raises
``ValueError: EAGLE is not supported in attention backend torch_native``. This module
adds ``torch_native`` for the draft-extend backend (``TorchNativeAttnBackend`` of the
draft runner), when SGLang imports that module. With ``--speculative-num-steps 1`` no
multi-step draft-decode backend is built. It then runs the next ``sitecustomize`` on
the path (hs_dataset's CPU support one). Nothing in site-packages is edited.
"""

from __future__ import annotations

import os
import sys

_TARGETS = ("sglang.srt.speculative.draft_utils", "sglang.srt.layers.attention.torch_native_backend")
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "sglang_shim_lib"))

from hs_test_shim_hooks import patch_on_import, run_next_sitecustomize  # noqa: E402


def _patch(module) -> None:
    if module.__name__.endswith("torch_native_backend"):
        _patch_torch_native(module.TorchNativeAttnBackend)
        return
    cls = module.DraftBackendFactory
    original = cls._create_backend

    def _create_backend(self, backend_name, backend_map, error_template, stamps_children=False):
        if "torch_native" not in backend_map:
            from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

            if stamps_children:  # the multi-step draft-decode container

                def make():
                    return (
                        "torch_native",
                        _TorchNativeMultiStepDraftBackend(self.draft_model_runner, self.topk, self.speculative_num_steps),
                    )
            else:

                def make():
                    return ("torch_native", TorchNativeAttnBackend(self.draft_model_runner))

            backend_map = {**backend_map, "torch_native": make}
        return original(self, backend_name, backend_map, error_template, stamps_children)

    cls._create_backend = _create_backend


def _slot_starts(table, req_pool_indices, seq_lens, locs):
    """Per request, where its ``locs`` row sits in ``req_to_token`` (searched near ``seq_len``: conventions differ by mode).

    Searched upwards: entries below the current end are the request's own (unique) slots;
    entries past the draft window may be stale ids of freed slots that were reused.
    """
    import torch

    per, starts = locs.shape[1], []
    for i, (row, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        for start in range(max(0, seq_len - per - 8), seq_len + 9):
            if torch.equal(table[row, start : start + per].to(locs.dtype), locs[i]):
                starts.append(start)
                break
        else:
            raise RuntimeError(f"eagle3 test shim: KV slots of request {i} not found near {seq_len}")
    return starts


class _TorchNativeMultiStepDraftBackend:
    """One ``TorchNativeAttnBackend`` per inner draft step (``topk == 1``: a chain).

    Step ``i`` decodes one token per request whose KV slot is ``req_to_token[row, p]``;
    it attends to ``req_to_token[row, :p + 1]``: the prefix plus the drafts so far.
    """

    def __init__(self, model_runner, topk: int, speculative_num_steps: int) -> None:
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        if topk != 1:
            raise ValueError("eagle3 test shim: torch_native draft decode supports --speculative-eagle-topk 1 only")
        self.topk, self.speculative_num_steps = topk, speculative_num_steps
        self.attn_backends = [TorchNativeAttnBackend(model_runner) for _ in range(speculative_num_steps - 1)]
        for backend in self.attn_backends:
            backend._hs_draft_step = True

    def init_forward_metadata(self, forward_batch) -> None:
        for backend in self.attn_backends:
            backend.init_forward_metadata(forward_batch)


def _patch_torch_native(cls) -> None:
    """TARGET_VERIFY and DRAFT_EXTEND_V2 batches carry no ``extend_prefix_lens``: derive them.

    Every request extends by the same number of tokens (the draft window). Where those
    tokens' KV slots start is found in ``req_to_token`` (the slots ``out_cache_loc``
    names), so both length conventions (``seq_lens`` before or after the window) work.
    The mask stays causal, which is the tree mask of a chain (``--speculative-eagle-topk 1``).
    """
    import torch

    original = cls.forward_extend

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        fb = forward_batch
        if fb.extend_prefix_lens is not None:
            return original(self, q, k, v, layer, fb, save_kv_cache)
        bs = fb.req_pool_indices.shape[0]
        per = q.shape[0] // bs
        prefix = _slot_starts(self.req_to_token_pool.req_to_token, fb.req_pool_indices, fb.seq_lens, fb.out_cache_loc.view(bs, per))
        total = [start + per for start in prefix]
        saved = fb.extend_prefix_lens, fb.extend_seq_lens, fb.seq_lens
        fb.extend_prefix_lens = torch.tensor(prefix, dtype=fb.seq_lens.dtype)
        fb.extend_seq_lens = torch.full((bs,), per, dtype=fb.seq_lens.dtype)
        fb.seq_lens = torch.tensor(total, dtype=fb.seq_lens.dtype)
        try:
            return original(self, q, k, v, layer, fb, save_kv_cache)
        finally:
            fb.extend_prefix_lens, fb.extend_seq_lens, fb.seq_lens = saved

    cls.forward_extend = forward_extend
    original_decode = cls.forward_decode

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        fb = forward_batch
        if not getattr(self, "_hs_draft_step", False):
            return original_decode(self, q, k, v, layer, fb, save_kv_cache)
        locs = fb.out_cache_loc.view(-1, 1)
        starts = _slot_starts(self.req_to_token_pool.req_to_token, fb.req_pool_indices, fb.seq_lens, locs)
        saved = fb.seq_lens
        fb.seq_lens = torch.tensor(starts, dtype=saved.dtype) + 1
        try:
            return original_decode(self, q, k, v, layer, fb, save_kv_cache)
        finally:
            fb.seq_lens = saved

    cls.forward_decode = forward_decode


patch_on_import(_TARGETS, _patch)
run_next_sitecustomize(_HERE)
