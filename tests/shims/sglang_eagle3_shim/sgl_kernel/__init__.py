"""TEST-ONLY: plain-torch versions of the sgl-kernel CPU ops SGLang 0.5.23's EAGLE path calls.

The CPU build of ``sgl-kernel`` is not on PyPI; hs_dataset's stand-in
(``hs_dataset/server_patch/cpu_support/sgl_kernel``) implements only
``assign_req_to_token_pool_cpu`` and raises for the speculative-decoding ops. This
package is put FIRST on the EAGLE-3 test server's ``PYTHONPATH`` by
``tests/capture/sglang/test_eagle3_server.py``: it re-exports the stand-in and adds the ops below,
each a line-by-line port of the Triton kernel SGLang runs on GPUs
(``sglang/kernels/ops/speculative/{eagle,cache_locs,spec_tree}.py``,
``sglang/kernels/ops/kvcache/cache_move.py``). Nothing in site-packages is edited.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

_STAND_IN = Path(__file__).resolve().parents[4] / "hs_dataset" / "server_patch" / "cpu_support" / "sgl_kernel" / "__init__.py"
_spec = importlib.util.spec_from_file_location("_hs_sgl_kernel_stand_in", _STAND_IN)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
for _name in dir(_base):
    if not _name.startswith("__"):
        globals()[_name] = getattr(_base, _name)
__version__ = _base.__version__
HS_DATASET_EAGLE3_TEST_SHIM = True


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """Every layer buffer: row ``tgt_loc[i]`` := row ``src_loc[i]`` (rows of ``strides[b]`` bytes)."""
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist()))
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        for tgt, src in pairs:
            if tgt != src:
                ctypes.memmove(ptr + tgt * stride, ptr + src * stride, stride)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    flat = accept_tokens.reshape(-1)
    for i, n in enumerate(accept_lens.tolist()):
        bonus_tokens[i] = flat[accept_stride * i + n - 1]


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    flat = accept_index.reshape(-1)
    keep = flat[flat != -1]
    accept_out_cache_loc[: keep.numel()] = out_cache_loc[keep].to(accept_out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_cols):
    n = topk * num_cols
    for pid, (row, start) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[pid * n : (pid + 1) * n] = req_to_token[row, start : start + n].to(out_cache_loc.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    pos = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = end - start
        if n > 0:
            out_cache_loc[pos : pos + n] = req_to_token[row, start:end].to(out_cache_loc.dtype)
            pos += n


def build_tree_kernel_efficient_cpu(
    parent_list,
    selected_index,
    verified_seq_len,
    tree_mask,
    positions,
    retrieve_index,
    retrieve_next_token,
    retrieve_next_sibling,
    topk,
    depth,
    draft_token_num,
    tree_mask_mode,
):
    """``sgl_build_tree_kernel_efficient_triton`` (spec_tree.py), one batch row at a time; modes FULL_MASK and QLEN_ONLY."""
    mode = int(tree_mask_mode)
    if mode not in (0, 1):
        raise NotImplementedError(f"tree mask mode {mode} (bit packing) is not ported")
    seq_lens = verified_seq_len.tolist()
    prefix = 0
    mask = tree_mask.view(-1)
    pl = parent_list.reshape(parent_list.shape[0], -1) if parent_list.dim() > 1 else parent_list.view(1, -1)
    sel = selected_index.reshape(selected_index.shape[0], -1)
    n = draft_token_num
    for b, seq_len in enumerate(seq_lens):
        seq_tree_idx = n * n * b + prefix * n
        prefix += seq_len
        positions[b * n] = seq_len
        base = b * n
        srow, prow = sel[b].tolist(), pl[b].tolist()

        def find(token_idx, srow=srow):
            for pp in range(n - 1):
                if srow[pp] == token_idx:
                    return pp
            return None

        for i in range(n - 1, 0, -1):
            retrieve_index[b, i] = base + i
            parent_tb = srow[i - 1] // topk
            if parent_tb == 0:
                parent_position = 0
            else:
                pp = find(prow[parent_tb])
                parent_position = None if pp is None else pp + 1
            if parent_position is not None:
                nxt = int(retrieve_next_token[b, parent_position])
                retrieve_next_token[b, parent_position] = i
                if nxt != -1:
                    retrieve_next_sibling[b, i] = nxt
        retrieve_index[b, 0] = base
        for x in range(n):
            t = seq_tree_idx + (seq_len + n) * x + seq_len + 1 if mode == 0 else n * n * b + n * x + 1
            mask[t - 1] = True
            mask[t : t + n - 1] = False
            if x > 0:
                cur, position = x - 1, 0
                for _ in range(depth):
                    position += 1
                    mask[t + cur] = True
                    parent_tb = srow[cur] // topk
                    if parent_tb == 0:
                        break
                    cp = find(prow[parent_tb])
                    if cp is None:
                        break
                    cur = cp
                positions[b * n + x] = position + seq_len


def verify_tree_greedy_cpu(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token, retrive_next_sibling, target_predict
):
    """``verify_tree_greedy_kernel_triton`` (spec_tree.py)."""
    batch, _n = candidates.shape
    spec = accept_index.shape[1]
    flat_target, flat_pred = target_predict.reshape(-1), predicts.view(-1)
    for b in range(batch):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _step in range(1, spec):
            cur = int(retrive_next_token[b, cur])
            target = int(flat_target[last])
            matched = False
            while cur != -1:
                if int(candidates[b, cur]) == target:
                    flat_pred[last] = target
                    accepted += 1
                    accept_index[b, accepted] = int(retrive_index[b, cur])
                    last = int(retrive_index[b, cur])
                    matched = True
                    break
                cur = int(retrive_next_sibling[b, cur])
            if not matched:
                break
        accept_token_num[b] = accepted
        flat_pred[last] = flat_target[last]
