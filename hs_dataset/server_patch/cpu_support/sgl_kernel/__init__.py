"""CPU servers: a stand-in for the CPU build of ``sgl-kernel`` (which is not on PyPI).

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports a handful of names from
``sgl_kernel`` at module import time. On a machine without AMX every compute kernel
falls back to native torch, and of these names only
:func:`assign_req_to_token_pool_cpu` is ever called (when a prefill allocates KV
slots). It is implemented here in plain torch; the others exist so the imports
succeed and raise a clear error if a code path ever calls them (speculative
decoding, KV-cache transfer), which the hs_dataset capture servers never use.

Never install this next to a real ``sgl_kernel``: it is only on the path of the
``.sglang-venv`` CPU route (a ``.pth`` file) and of ``hs-dataset serve`` for
``device: cpu`` cards, after site-packages, so a real ``sgl_kernel`` wins.
"""

from __future__ import annotations

__version__ = "0.0.0+hs-dataset-cpu-stand-in"
HS_DATASET_STAND_IN = True


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """For request ``i``: ``req_to_token[req_pool_indices[i], start[i]:end[i]] = next slice of out_cache_loc``."""
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    pos = 0
    for row, start, end in zip(rows, starts, ends):
        n = end - start
        if n <= 0:
            continue
        if end > pool_len:
            raise ValueError(f"sgl_kernel stand-in: slot range {start}:{end} exceeds the pool length {pool_len}")
        req_to_token[row, start:end] = out_cache_loc[pos : pos + n].to(req_to_token.dtype)
        pos += n


def _not_available(name: str):
    def stub(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not provided by hs_dataset's CPU stand-in (only plain prefill/decode is supported on a CPU server)"
        )

    stub.__name__ = name
    return stub


for _name in (
    "copy_all_layer_kv_cache_cpu",
    "rotate_input_ids_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "build_draft_decode_metadata_cpu",
):
    globals()[_name] = _not_available(_name)
del _name

__all__ = ["HS_DATASET_STAND_IN", "assign_req_to_token_pool_cpu"]
