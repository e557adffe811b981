"""Unit tests of the server-side capture core and the SGLang client, without SGLang.

Fake ForwardBatch objects drive :class:`hs_dataset.server_patch.core.CaptureCore`
directly; everything runs in the main environment in a few seconds.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from hs_dataset.capture.serve import layer_ids as L
from hs_dataset.errors import ServerValidationError
from hs_dataset.server_patch import compat
from hs_dataset.server_patch.batch import BatchView
from hs_dataset.server_patch.budget import StagingBudget
from hs_dataset.server_patch.config import CaptureConfig
from hs_dataset.server_patch.contract.dump import refused_name
from hs_dataset.server_patch.contract.private_dir import StagingError, check_private_dir, ensure_private_dir
from hs_dataset.server_patch.contract.rid import content_key, make_rid, validate_rid
from hs_dataset.server_patch.contract.sglang_version import parse_version
from hs_dataset.server_patch.contract.status import is_status_name
from hs_dataset.server_patch.core import CaptureCore
from hs_dataset.server_patch.mechanisms import check_server_args
from hs_dataset.server_patch.staging import StagingDir
from tests.fixtures.capture_core import IDS, H, K, fake_batch, make_core, states

# ---------------------------------------------------------------------------- helpers


def files(core):
    """The dumps and refusal markers (and strangers) in the staging dir; not the hooks' status file."""
    return sorted(n for n in os.listdir(core.config.staging_dir) if not is_status_name(n))


def read(core, rid):
    path = os.path.join(core.config.staging_dir, rid + ".safetensors")
    with safe_open(path, "pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


# ---------------------------------------------------------------------------- layer ids


def test_layer_ids_first_is_one_passes_ids_as_given_except_a_first_one():
    ds = ["DeepseekV3ForCausalLM"]
    assert L.sglang_eagle3_ids([2, 30, 58], ds, "first_is_one", 61) == [2, 30, 58]
    assert L.sglang_eagle3_ids([0, 1, 2], ds, "first_is_one", 6) == [0, 1, 2]
    assert L.captured_hf_ids([2, 30, 58], ds, "first_is_one") == [2, 30, 58]
    assert L.captured_hf_ids([1, 2], ds, "first_is_one") == [2, 3]
    with pytest.raises(L.LayerIdError, match="start with 1"):
        L.sglang_eagle3_ids([1, 3], ds, "first_is_one", 6)
    assert L.sglang_eagle3_ids([2, 30, 58], ["KimiK25ForConditionalGeneration"], "first_is_one", 61) == [2, 30, 58]


def test_layer_ids_under_the_always_plus_one_rule():
    assert L.sglang_eagle3_ids([2, 3], ["LlamaForCausalLM"], "always", 4) == [1, 2]
    assert L.sglang_eagle3_ids([2, 30, 58], ["DeepseekV3ForCausalLM"], "always", 61) == [1, 29, 57]
    with pytest.raises(L.LayerIdError, match="embedding"):
        L.sglang_eagle3_ids([0, 2], ["Qwen3ForCausalLM"], "always", 4)
    with pytest.raises(L.LayerIdError, match="out of range"):
        L.sglang_eagle3_ids([2, 6], ["DeepseekV3ForCausalLM"], "first_is_one", 6)
    with pytest.raises(L.LayerIdError, match="ascending"):
        L.validate_hf_ids([3, 2], 6)
    with pytest.raises(L.LayerIdError, match="no known"):
        L.sglang_eagle3_ids([2], ["GPT2LMHeadModel"], "always", 6)
    with pytest.raises(L.LayerIdError, match="cannot tell"):
        L.sglang_eagle3_ids([2], ["DeepseekV3ForCausalLM"], "unknown", 6)
    assert L.layer_hook_targets([0, 2], "model", 6) == {"model.embed_tokens": 0, "model.layers.1": 2}
    assert parse_version("0.5.23.post1") == (0, 5, 23)


# ---------------------------------------------------------------------------- rids and config


@pytest.mark.parametrize(
    "rid",
    [
        "hs-../../x-1-3",
        "hs-abc-1-3/../../y",
        "../hs-abc-1-3",
        "hs-ABC-1-3",
        "hs-abc-1-0",
        "hs-abc-1-3\n",
        "hs--1-3",
        "hs-abc-1",
        "",
        None,
        7,
    ],
)
def test_rid_validation_rejects_unsafe_ids(rid):
    with pytest.raises(ValueError):
        validate_rid(rid)


def test_make_rid_roundtrip():
    rid = make_rid("run1", 42, 17)
    assert rid == "hs-run1-42-17" and refused_name(rid) == "hs-run1-42-17.refused.json"
    with pytest.raises(ValueError):
        make_rid("Bad/Run", 1, 1)


def test_config_from_json_and_env(tmp_path):
    env = {"HS_CAPTURE_STAGING_DIR": str(tmp_path), "HS_CAPTURE_LAYER_IDS": "2,30,58", "HS_CAPTURE_MAX_FILES": "5"}
    cfg = CaptureConfig.from_sources({}, environ=env)
    assert cfg.hf_aux_layer_ids == (2, 30, 58) and cfg.max_staging_files == 5
    cfg = CaptureConfig.from_sources({"hf_aux_layer_ids": [1, 2]}, environ=env)  # the JSON config wins
    assert cfg.hf_aux_layer_ids == (1, 2)
    with pytest.raises(ValueError, match="unknown keys"):
        CaptureConfig.from_sources({"staging": "x"}, environ=env)
    with pytest.raises(ValueError, match="rid_prefix"):
        CaptureConfig.from_sources({"rid_prefix": "../"}, environ=env)
    with pytest.raises(ValueError, match="staging_dir"):
        CaptureConfig.from_sources({"hf_aux_layer_ids": [2]}, environ={})


# ---------------------------------------------------------------------------- staging


def test_staging_dir_is_created_private_and_unsafe_ones_are_refused(tmp_path):
    path = ensure_private_dir(str(tmp_path / "a" / "stage"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    with pytest.raises(StagingError, match="private"):
        ensure_private_dir(str(loose))
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(StagingError, match="symlink"):
        StagingDir(str(link))
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(StagingError, match="not a directory"):
        check_private_dir(str(afile))


def test_staging_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    path = ensure_private_dir(str(tmp_path / "stage"))
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(path).st_uid + 1)
    with pytest.raises(StagingError, match="owned by uid"):
        check_private_dir(path)


def test_atomic_write_never_clobbers_or_escapes(tmp_path):
    st = StagingDir(str(tmp_path / "stage"))
    assert st.write_atomic("a.safetensors", b"one")
    assert not st.write_atomic("a.safetensors", b"two")
    assert (tmp_path / "stage" / "a.safetensors").read_bytes() == b"one"
    for bad in ("../x", "sub/x", ".hidden", ""):
        with pytest.raises(StagingError):
            st.write_atomic(bad, b"x")
    # a symlink planted under the final name is not followed nor replaced
    (tmp_path / "target").write_text("keep")
    os.symlink(tmp_path / "target", tmp_path / "stage" / "b.safetensors")
    assert not st.write_atomic("b.safetensors", b"evil")
    assert (tmp_path / "target").read_text() == "keep"
    assert sorted(os.listdir(tmp_path / "stage")) == ["a.safetensors", "b.safetensors"]


def test_budget_waits_bounded_then_refuses_and_recovers():
    usage = [0, 0]
    budget = StagingBudget(100, 2, lambda: tuple(usage), rescan_interval_s=0.0)
    assert budget.reserve(60, 0.1)
    budget.committed(60)
    usage[:] = [60, 1]
    t0 = time.monotonic()
    assert not budget.reserve(60, 0.15)  # 60 + 60 > 100: waits, then gives up
    assert 0.1 <= time.monotonic() - t0 < 2.5  # bounded by its timeout; the slack absorbs a CI stall
    assert not budget.reserve(101, 10.0)  # larger than the whole budget: refused at once
    usage[:] = [0, 0]  # the client drained the directory
    assert budget.reserve(60, 0.1)


def test_a_metered_budget_never_scans_on_the_reserving_thread():
    """With the meter on, the forward thread only reads figures; the meter rescans, fast while a reservation waits."""
    import threading

    usage, scanners = [60, 1], set()

    def scan():
        scanners.add(threading.get_ident())
        return tuple(usage)

    budget = StagingBudget(100, 4, scan, rescan_interval_s=30.0, poll_s=0.01)
    before = set(threading.enumerate())  # meters another test left behind are not this budget's
    budget.start_meter()
    try:
        scanners.clear()
        assert budget.reserve(40, 0.1)  # fits with the meter's first figures
        budget.release(40)
        t0 = time.monotonic()
        assert not budget.reserve(60, 0.15)  # 60 waiting + 60 > 100: the meter rescans while it waits, in vain
        assert 0.1 <= time.monotonic() - t0 < 2.5  # bounded by its timeout; the slack absorbs a CI stall
        threading.Timer(0.1, lambda: usage.__setitem__(slice(None), [0, 0])).start()  # the client drains, later
        t0 = time.monotonic()
        assert budget.reserve(60, 5.0)  # seen by a rescan within a poll, not after the 30 s interval
        assert time.monotonic() - t0 < 2.5  # well short of the 5 s timeout
        assert scanners and threading.get_ident() not in scanners
    finally:
        budget.stop_meter()
    assert not [t for t in set(threading.enumerate()) - before if t.name == "hs-staging-meter"]


def test_the_meter_scans_less_often_while_the_directory_is_far_from_its_bounds():
    """Under half of either bound, what another process adds between scans cannot fill it: the meter waits longer."""
    from hs_dataset.server_patch.budget import FAR_SCANS

    usage = [0, 0]
    budget = StagingBudget(100, 10, lambda: tuple(usage), rescan_interval_s=0.25)
    budget.refresh()
    assert budget._meter_interval_locked() == 0.25 * FAR_SCANS
    usage[:] = [50, 1]  # half the bytes
    budget.refresh()
    assert budget._meter_interval_locked() == 0.25
    usage[:] = [0, 5]  # half the files
    budget.refresh()
    assert budget._meter_interval_locked() == 0.25
    usage[:] = [0, 0]
    budget.refresh()
    assert budget.reserve(60, 0.0)  # reserved, not yet on disk: counts too
    assert budget._meter_interval_locked() == 0.25


def test_a_dump_committed_during_a_meter_scan_is_still_counted():
    """The scan runs without the lock; a file committed meanwhile (and missed by it) is added to what it found."""
    import threading

    in_scan, go_on, calls = threading.Event(), threading.Event(), []

    def slow_scan():
        calls.append(1)
        if len(calls) > 1:  # the first scan is quick; the second waits for the commit below
            in_scan.set()
            assert go_on.wait(5)
        return (0, 0)  # the scan listed the directory before the new file landed

    budget = StagingBudget(100, 4, slow_scan, rescan_interval_s=30.0)
    budget.refresh()  # fresh figures: reservations need no scan of their own for 30 s
    scan = threading.Thread(target=budget.refresh)
    scan.start()
    assert in_scan.wait(5)
    assert budget.reserve(60, 0.0)  # neither blocked by the scan in progress...
    budget.committed(60)  # ...nor lost by it
    go_on.set()
    scan.join(5)
    assert budget.snapshot()["disk_bytes"] == 60 and budget.snapshot()["disk_files"] == 1


def test_the_core_meters_its_staging_off_the_forward_thread(tmp_path):
    import threading

    def meters() -> list[threading.Thread]:  # this core's: meters another test left behind are not counted
        return [t for t in set(threading.enumerate()) - before if t.name == "hs-staging-meter"]

    before = set(threading.enumerate())
    core = make_core(tmp_path)
    assert meters()
    core.close()
    assert not meters()


# ---------------------------------------------------------------------------- the core


def test_only_prefill_passes_are_captured(tmp_path):
    core = make_core(tmp_path)
    aux, final = states(5)
    for mode in ("DECODE", "TARGET_VERIFY", "IDLE", "SPLIT_PREFILL", "DLLM_EXTEND"):
        b = BatchView.from_forward_batch(fake_batch(mode, [5], rids=["hs-r1-1-5"]))
        core.process(b, aux=aux, final_prenorm=final)
    core.flush()
    assert files(core) == []
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [5], rids=["hs-r1-1-5"])), aux=aux, final_prenorm=final)
    core.flush()
    assert files(core) == ["hs-r1-1-5.safetensors"]
    core.close()


def test_batched_prefill_is_split_per_request(tmp_path):
    core = make_core(tmp_path)
    lens = [3, 6, 4]
    rids = ["hs-r1-1-3", "HEALTH_CHECK_abc", "hs-r1-2-4"]
    aux, final = states(sum(lens))
    ids = torch.arange(1000, 1000 + sum(lens))
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", lens, rids=rids, ids=ids)), aux=aux, final_prenorm=final)
    core.flush()
    assert files(core) == ["hs-r1-1-3.safetensors", "hs-r1-2-4.safetensors"]  # the health check is ignored
    meta, t = read(core, "hs-r1-2-4")
    assert torch.equal(t["input_ids"], ids[9:13])
    assert torch.equal(t["aux_hidden_states"], aux[9:13].view(4, K, H))
    assert torch.equal(t["final_hidden_state"], final[9:13])
    assert meta["format"] == "hs_dataset.dump" and meta["version"] == "1" and meta["rid"] == "hs-r1-2-4"
    assert json.loads(meta["hf_aux_layer_ids"]) == IDS and meta["final_state"] == "pre_norm" and meta["dtype"] == "float32"
    assert meta["prefill_batch_requests"] == "3" and meta["sglang_version"] == "test"
    assert core.stats["foreign_skipped"] == 1
    assert core.verified["aux_layers"] == K and core.verified["hidden_size"] == H
    core.close()


def test_warmup_and_invalid_rids_never_touch_the_filesystem(tmp_path):
    core = make_core(tmp_path)
    rids = ["hs-../../../escape-1-2", "warmup-xyz", "hs-r1-1-2/../../z"]
    aux, final = states(6)
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2, 2, 2], rids=rids)), aux=aux, final_prenorm=final)
    core.flush()
    assert files(core) == []
    assert sorted(os.listdir(tmp_path)) == ["stage"]
    assert core.stats["invalid_rids"] == 2 and core.stats["foreign_skipped"] == 1
    core.close()


def test_chunked_prefill_is_assembled_into_one_dump(tmp_path):
    core = make_core(tmp_path)
    aux, final = states(10, seed=3)
    ids = torch.arange(500, 510)
    rid = "hs-r1-7-10"
    # chunk 1 (4 tokens) batched with another request; chunk 2 (6 tokens) alone
    a1 = torch.cat([aux[:4], torch.zeros(2, K * H)])
    f1 = torch.cat([final[:4], torch.zeros(2, H)])
    b1 = fake_batch("EXTEND", [4, 2], prefix=[0, 0], rids=[rid, "hs-r1-8-2"], ids=torch.cat([ids[:4], torch.tensor([1, 2])]))
    core.process(BatchView.from_forward_batch(b1), aux=a1, final_prenorm=f1)
    core.flush()
    assert files(core) == ["hs-r1-8-2.safetensors"]  # the chunked one waits for its rest
    first_chunk_cpu = core._assemblies[rid].capture_cpu_ns
    b2 = fake_batch("EXTEND", [6], prefix=[4], rids=[rid], ids=ids[4:])
    core.process(BatchView.from_forward_batch(b2), aux=aux[4:], final_prenorm=final[4:])
    core.flush()
    meta, t = read(core, rid)
    assert torch.equal(t["input_ids"], ids)
    assert torch.equal(t["aux_hidden_states"], aux.view(10, K, H))
    assert torch.equal(t["final_hidden_state"], final)
    assert meta["num_chunks"] == "2"
    assert int(meta["capture_cpu_ns"]) > first_chunk_cpu > 0  # the hook's CPU of both chunks
    # the high-water marks the status file carries: the chunked request's 10 rows held at once, within the bounds
    row = (K + 1) * H * 4
    assert 10 * row <= core.stats["pinned_peak_bytes"] <= core.config.pinned_pool_bytes
    assert 10 * row <= core.stats["staging_peak_bytes"] <= core.config.max_staging_bytes
    core.close()


def test_a_mixed_pass_stores_its_prompt_and_skips_the_decode_tails(tmp_path):
    """--enable-mixed-chunk on SGLang 0.5.14-0.5.17: the pass reaches the hooks as MIXED, prompt rows then 1-row tails."""
    core = make_core(tmp_path)
    lens, prefix = [5, 1, 1], [0, 17, 9]
    aux, final = states(sum(lens), seed=4)
    ids = torch.arange(300, 307)
    b = fake_batch("MIXED", lens, prefix=prefix, rids=["hs-r1-1-5", "other-a", "other-b"], ids=ids)
    core.process(BatchView.from_forward_batch(b), aux=aux, final_prenorm=final)
    core.flush()
    assert files(core) == ["hs-r1-1-5.safetensors"]
    meta, t = read(core, "hs-r1-1-5")
    assert torch.equal(t["input_ids"], ids[:5])
    assert torch.equal(t["aux_hidden_states"], aux[:5].view(5, K, H))
    assert torch.equal(t["final_hidden_state"], final[:5])
    assert meta["prefill_batch_requests"] == "3"
    assert core.stats["foreign_skipped"] == 2 and core.stats["refused"] == 0 and core.stats["extend_passes"] == 1
    core.close()


@pytest.mark.parametrize("mode", ["MIXED", "EXTEND"])
@pytest.mark.parametrize("past", [0, 3])
def test_a_decode_tail_of_a_stored_prompt_is_skipped_not_refused(tmp_path, mode, past):
    """The overlap scheduler can put a prompt already dumped into a mixed pass once more, as a tail at prefix >= T."""
    core = make_core(tmp_path)
    rid = "hs-r1-1-4"
    aux, final = states(4, seed=5)
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [4], rids=[rid])), aux=aux, final_prenorm=final)
    core.flush()
    aux2, final2 = states(4, seed=6)
    b = fake_batch(mode, [3, 1], prefix=[0, 4 + past], rids=["hs-r1-2-3", rid])
    core.process(BatchView.from_forward_batch(b), aux=aux2, final_prenorm=final2)
    core.flush()
    assert files(core) == ["hs-r1-1-4.safetensors", "hs-r1-2-3.safetensors"]  # no refusal marker
    _, t = read(core, rid)
    assert torch.equal(t["final_hidden_state"], final)  # the dump stands as written
    assert core.stats["decode_tails"] == 1 and core.stats["refused"] == 0 and core.stats["dumps_written"] == 2
    # a pass of tails alone reaches no state at all (nothing to normalize, verify or refuse)
    core.process(BatchView.from_forward_batch(fake_batch(mode, [1], prefix=[4 + past], rids=[rid])), aux=None, final_prenorm=None)
    core.flush()
    assert core.stats["decode_tails"] == 2 and core.stats["refused"] == 0 and files(core)[0] == "hs-r1-1-4.safetensors"
    core.close()


def test_a_chunked_prompt_finished_in_a_mixed_pass_is_assembled(tmp_path):
    core = make_core(tmp_path)
    rid = "hs-r1-7-10"
    aux, final = states(10, seed=7)
    ids = torch.arange(600, 610)
    core.process(
        BatchView.from_forward_batch(fake_batch("EXTEND", [4], prefix=[0], rids=[rid], ids=ids[:4])), aux=aux[:4], final_prenorm=final[:4]
    )
    core.flush()
    assert files(core) == []
    # chunk 2 (6 rows), then two foreign decode tails
    a2 = torch.cat([aux[4:], torch.zeros(2, K * H)])
    f2 = torch.cat([final[4:], torch.zeros(2, H)])
    b2 = fake_batch(
        "MIXED", [6, 1, 1], prefix=[4, 30, 12], rids=[rid, "other-a", "other-b"], ids=torch.cat([ids[4:], torch.tensor([1, 2])])
    )
    core.process(BatchView.from_forward_batch(b2), aux=a2, final_prenorm=f2)
    core.flush()
    assert files(core) == [rid + ".safetensors"]
    meta, t = read(core, rid)
    assert torch.equal(t["input_ids"], ids)
    assert torch.equal(t["aux_hidden_states"], aux.view(10, K, H))
    assert torch.equal(t["final_hidden_state"], final)
    assert meta["num_chunks"] == "2" and core.stats["chunks_assembled"] == 1 and core.stats["refused"] == 0
    core.close()


def test_prefix_cache_hit_is_refused_not_stored(tmp_path):
    core = make_core(tmp_path)
    aux, final = states(3)
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [3], prefix=[5], rids=["hs-r1-1-8"])), aux=aux, final_prenorm=final)
    core.flush()
    assert files(core) == ["hs-r1-1-8.refused.json"]
    body = json.loads((tmp_path / "stage" / "hs-r1-1-8.refused.json").read_text())
    assert body["rid"] == "hs-r1-1-8" and "prefix-cache hit" in body["reason"]
    core.close()


def test_chunk_out_of_order_or_too_long_is_refused(tmp_path):
    core = make_core(tmp_path)
    aux, final = states(4)
    rid = "hs-r1-1-6"
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2], prefix=[0], rids=[rid])), aux=aux[:2], final_prenorm=final[:2])
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2], prefix=[3], rids=[rid])), aux=aux[:2], final_prenorm=final[:2])
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [4], rids=["hs-r1-2-3"])), aux=aux, final_prenorm=final)
    core.flush()
    assert files(core) == ["hs-r1-1-6.refused.json", "hs-r1-2-3.refused.json"]
    assert core.budget.snapshot()["inflight_bytes"] == 0  # the dropped assembly gave its reservation back
    core.close()


def test_stale_assembly_is_refused_by_the_sweeper(tmp_path):
    core = make_core(tmp_path, assembly_ttl_s=0.0)
    aux, final = states(2)
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2], rids=["hs-r1-1-9"])), aux=aux, final_prenorm=final)
    time.sleep(0.01)
    core.sweep()
    assert files(core) == ["hs-r1-1-9.refused.json"]
    assert "incomplete chunked prefill" in (tmp_path / "stage" / "hs-r1-1-9.refused.json").read_text()
    core.close()


def test_orphans_are_swept(tmp_path):
    core = make_core(tmp_path, orphan_ttl_s=0.0)
    aux, final = states(2)
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2], rids=["hs-r1-1-2"])), aux=aux, final_prenorm=final)
    core.flush()
    (tmp_path / "stage" / "unrelated.txt").write_text("not ours")
    time.sleep(0.01)
    core.sweep()
    assert files(core) == ["unrelated.txt"]
    core.close()


def test_staging_full_refuses_after_a_bounded_wait_then_recovers(tmp_path):
    core = make_core(tmp_path, max_staging_files=1, max_wait_s=0.3)
    aux, final = states(4)
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2], rids=["hs-r1-1-2"])), aux=aux[:2], final_prenorm=final[:2])
    core.flush()
    t0 = time.monotonic()
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2, 2], rids=["hs-r1-2-2", "hs-r1-3-2"])), aux=aux, final_prenorm=final)
    elapsed = time.monotonic() - t0
    core.flush()
    assert 0.25 <= elapsed < 2.0, elapsed  # one wait budget per forward pass, not per request
    assert files(core) == ["hs-r1-1-2.safetensors", "hs-r1-2-2.refused.json", "hs-r1-3-2.refused.json"]
    assert "staging full" in (tmp_path / "stage" / "hs-r1-2-2.refused.json").read_text()
    os.unlink(tmp_path / "stage" / "hs-r1-1-2.safetensors")  # the client drains
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2], rids=["hs-r1-4-2"])), aux=aux[:2], final_prenorm=final[:2])
    core.flush()
    assert "hs-r1-4-2.safetensors" in files(core)
    core.close()


def test_staging_full_while_the_client_drains_in_time(tmp_path):
    core = make_core(tmp_path, max_staging_files=1, max_wait_s=2.0)
    aux, final = states(2)
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2], rids=["hs-r1-1-2"])), aux=aux, final_prenorm=final)
    core.flush()

    def drain():
        time.sleep(0.2)
        os.unlink(tmp_path / "stage" / "hs-r1-1-2.safetensors")

    import threading

    threading.Thread(target=drain).start()
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2], rids=["hs-r1-2-2"])), aux=aux, final_prenorm=final)
    core.flush()
    assert files(core) == ["hs-r1-2-2.safetensors"]
    core.close()


def test_wrong_aux_width_or_missing_final_are_refused(tmp_path):
    core = make_core(tmp_path)
    aux, final = states(2)
    b = lambda rid: BatchView.from_forward_batch(fake_batch("EXTEND", [2], rids=[rid]))  # noqa: E731
    core.process(b("hs-r1-1-2"), aux=aux[:, : 2 * H], final_prenorm=final)
    core.process(b("hs-r1-2-2"), aux=aux, final_prenorm=None)
    core.process(b("hs-r1-3-2"), aux=None, final_prenorm=final)
    core.process(b("hs-r1-4-2"), aux=aux, final_prenorm=final, missing_reason="the final-norm hook did not fire")
    core.process(b("hs-r1-5-2"), aux=aux[:1], final_prenorm=final[:1])
    core.flush()
    reasons = {f: json.loads((tmp_path / "stage" / f).read_text())["reason"] for f in files(core)}
    assert len(reasons) == 5 and all(f.endswith(".refused.json") for f in reasons)
    assert "expected 3 layers" in reasons["hs-r1-1-2.refused.json"]
    assert "token-scattered" in reasons["hs-r1-5-2.refused.json"]
    core.close()


def test_list_of_aux_tensors_and_bf16(tmp_path):
    core = make_core(tmp_path)
    aux = [torch.randn(3, H).to(torch.bfloat16) for _ in range(K)]
    final = torch.randn(3, H).to(torch.bfloat16)
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [3], rids=["hs-r1-1-3"])), aux=aux, final_prenorm=final)
    core.flush()
    meta, t = read(core, "hs-r1-1-3")
    assert t["aux_hidden_states"].dtype == torch.bfloat16 and meta["dtype"] == "bfloat16"
    assert torch.equal(t["aux_hidden_states"][:, 1], aux[1])
    core.close()


def test_content_keys_when_the_server_has_no_rids(tmp_path):
    core = make_core(tmp_path)
    ids = torch.tensor([5, 6, 7, 8, 9])
    aux, final = states(5)
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2, 3], rids=None, ids=ids)), aux=aux, final_prenorm=final)
    core.flush()
    assert files(core) == sorted([content_key([5, 6]) + ".safetensors", content_key([7, 8, 9]) + ".safetensors"])
    assert content_key(torch.tensor([7, 8, 9])) == content_key([7, 8, 9])
    core.close()


def test_copier_snapshot_is_independent_of_the_forward_buffers(tmp_path):
    core = make_core(tmp_path)
    aux, final = states(2)
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2], rids=["hs-r1-1-2"])), aux=aux, final_prenorm=final)
    expected = aux.clone()
    aux.zero_()  # the next forward reuses the buffer before the writer ran
    core.flush()
    _, t = read(core, "hs-r1-1-2")
    assert torch.equal(t["aux_hidden_states"], expected.view(2, K, H))
    core.close()


def test_each_dump_reports_the_forward_threads_capture_cpu(tmp_path, monkeypatch):
    """capture_cpu_ns: the hook's CPU on the forward thread, each request its own part and a share of the pass's by tokens."""
    import hs_dataset.server_patch.core as capture_module

    clock = iter(range(0, 10**9, 1000))  # every reading 1 us after the one before
    monkeypatch.setattr(capture_module.time, "thread_time_ns", lambda: next(clock))
    core = make_core(tmp_path)
    aux, final = states(6)
    rids = ["hs-r1-1-2", "hs-r1-2-4"]
    core.process(BatchView.from_forward_batch(fake_batch("EXTEND", [2, 4], rids=rids)), aux=aux, final_prenorm=final)
    core.flush()
    # readings: pass start 0, pass part 1000 (shared 1:2 by tokens: 333 / 666), then per request start and end
    assert read(core, rids[0])[0]["capture_cpu_ns"] == str(1000 * 2 // 6 + 1000)
    assert read(core, rids[1])[0]["capture_cpu_ns"] == str(1000 * 4 // 6 + 1000)
    core.close()


def test_the_dump_writers_are_named_for_the_os(tmp_path):
    """top -H and /proc tell the capture threads from SGLang's (bench_transport reads their CPU by name)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("thread names are set on Linux only")

    def thread_names() -> list[str]:
        names = []
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    names.append(f.read().strip())
            except OSError:
                continue
        return names

    def started(names: list[str]) -> bool:  # counted against what ran before: another test's core may linger
        return names.count("hs-dump-writer") - writers_before == 2 and names.count("hs-dump-sweeper") > sweepers_before

    names = thread_names()
    writers_before, sweepers_before = names.count("hs-dump-writer"), names.count("hs-dump-sweeper")
    core = make_core(tmp_path, writer_threads=2)
    deadline = time.monotonic() + 10  # each thread names itself as its first step: give them a moment to start
    while not started(names := thread_names()) and time.monotonic() < deadline:
        time.sleep(0.01)
    core.close()
    assert started(names), names


def test_the_cpu_snapshot_is_a_contiguous_copy_of_any_layout():
    from hs_dataset.server_patch.copier import HostCopier

    g = torch.Generator().manual_seed(1)
    base = torch.randn(6, 3, 8, generator=g).to(torch.bfloat16)
    strided = base.transpose(0, 1)  # not contiguous: copied by torch
    piece = HostCopier().snapshot({"rows": base[2:5], "strided": strided, "empty": base[:0]}, timeout=0)
    out = piece.wait()
    expected = {k: v.clone() for k, v in (("rows", base[2:5]), ("strided", strided))}
    base.zero_()  # the forward reuses its buffers
    assert all(t.is_contiguous() for t in out.values())
    assert torch.equal(out["rows"], expected["rows"]) and torch.equal(out["strided"], expected["strided"])
    assert out["empty"].shape == (0, 3, 8)


# ---------------------------------------------------------------------------- hook glue without sglang


def _fresh_runtime(monkeypatch, tmp_path, **cfg):
    from hs_dataset.server_patch import hooks as sglang_hooks

    monkeypatch.setattr(sglang_hooks, "_RUNTIME", None)
    monkeypatch.setattr(compat, "attention_ranks", lambda: (0, 0, "test"))
    monkeypatch.setattr(compat, "server_args", lambda: None)
    config = {"staging_dir": str(tmp_path / "stage"), "hf_aux_layer_ids": IDS, **cfg}
    return sglang_hooks, config


def test_hooks_pair_the_prenorm_final_with_the_model_output(monkeypatch, tmp_path):
    hooks, config = _fresh_runtime(monkeypatch, tmp_path)
    norm = hooks.norm_hook(config)
    model = hooks.model_hook(config)
    aux, final = states(4)
    post = torch.randn(4, H)
    fb = fake_batch("EXTEND", [4], rids=["hs-r1-1-4"])
    norm(None, (torch.randn(4, H), torch.randn(4, H)), (post, final))  # norm(hidden, residual) -> (normed, pre-norm sum)
    model(None, (fb.input_ids, None, fb, None), (post, aux))
    core = hooks._RUNTIME.core
    core.flush()
    _, t = read(core, "hs-r1-1-4")
    assert torch.equal(t["final_hidden_state"], final)
    # a pass where the norm hook did not fire (e.g. graph replay) is refused, not paired with stale data
    fb2 = fake_batch("EXTEND", [4], rids=["hs-r1-2-4"])
    model(None, (fb2.input_ids, None, fb2, None), (post, aux))
    core.flush()
    assert "final-norm hook did not fire" in (tmp_path / "stage" / "hs-r1-2-4.refused.json").read_text()
    # without aux capture enabled on the server the model returns a bare tensor
    fb3 = fake_batch("EXTEND", [4], rids=["hs-r1-3-4"])
    norm(None, (post,), post)
    model(None, (fb3.input_ids, None, fb3, None), post)
    core.flush()
    assert "--enable-return-aux-hidden-states" in (tmp_path / "stage" / "hs-r1-3-4.refused.json").read_text()
    core.close()


def test_the_model_hook_hands_mixed_passes_on_and_skips_decode(monkeypatch, tmp_path):
    hooks, config = _fresh_runtime(monkeypatch, tmp_path)
    norm, model = hooks.norm_hook(config), hooks.model_hook(config)
    aux, final = states(5)
    post = torch.randn(5, H)
    for mode, rid in (("DECODE", "hs-r1-1-4"), ("MIXED", "hs-r1-2-4")):
        fb = fake_batch(mode, [4, 1], prefix=[0, 8], rids=[rid, "other"])
        norm(None, (torch.randn(5, H), torch.randn(5, H)), (post, final))
        model(None, (fb.input_ids, None, fb, None), (post, aux))
    core = hooks._RUNTIME.core
    core.flush()
    assert files(core) == ["hs-r1-2-4.safetensors"]
    _, t = read(core, "hs-r1-2-4")
    assert torch.equal(t["final_hidden_state"], final[:4])
    core.close()


@pytest.mark.parametrize("mechanism", ["aux_return", "layer_hooks"])
def test_no_aux_layer_dumps_the_final_state_alone_and_the_client_takes_it(monkeypatch, tmp_path, mechanism):
    """``hf_aux_layer_ids: []``: no aux flag, no layer hook; the norm hook's state is dumped with an empty [T, 0, H] aux."""
    from hs_dataset.capture.sglang.dumps import ExpectedDump, check_dump
    from hs_dataset.sample import CapturedSample, TokenizedSample

    hooks, config = _fresh_runtime(monkeypatch, tmp_path, mechanism=mechanism, architectures=["DeepseekV3ForCausalLM"], hf_aux_layer_ids=[])
    norm, model = hooks.norm_hook(config), hooks.model_hook(config)
    final, post = torch.randn(4, H), torch.randn(4, H)
    fb = fake_batch("EXTEND", [4], rids=["hs-r1-1-4"])
    norm(None, (torch.randn(4, H), torch.randn(4, H)), (post, final))
    model(None, (fb.input_ids, None, fb, None), post)  # a server without --enable-return-aux-hidden-states returns one tensor
    core = hooks._RUNTIME.core
    core.flush()
    _meta, t = read(core, "hs-r1-1-4")
    assert t["aux_hidden_states"].shape == (4, 0, H) and torch.equal(t["final_hidden_state"], final)
    sample = TokenizedSample("s", fb.input_ids, torch.ones(4, dtype=torch.bool))
    path = os.path.join(core.config.staging_dir, "hs-r1-1-4.safetensors")
    got = check_dump(path, "hs-r1-1-4", sample, ExpectedDump(aux_layer_ids=(), dtype=torch.float32))
    assert isinstance(got, CapturedSample) and got.aux_hidden_states.shape == (4, 0, H), getattr(got, "reason", None)
    core.close()


def test_a_config_with_no_aux_layer_is_the_final_state_only_but_one_with_none_named_is_refused():
    assert CaptureConfig.from_sources({"staging_dir": "/x", "hf_aux_layer_ids": []}, environ={}).hf_aux_layer_ids == ()
    with pytest.raises(ValueError, match="hf_aux_layer_ids is required"):
        CaptureConfig.from_sources({"staging_dir": "/x"}, environ={})


OLD_LAYER_SOURCE = """
class DeepseekV2DecoderLayer:
    def forward(self, positions, hidden_states, forward_batch, residual):
        return hidden_states, residual
"""


def test_layer_hooks_mechanism(monkeypatch, tmp_path):
    hooks, config = _fresh_runtime(monkeypatch, tmp_path, mechanism="layer_hooks", architectures=["DeepseekV3ForCausalLM"])
    monkeypatch.setattr(compat, "loaded_source", lambda module, cls: OLD_LAYER_SOURCE)  # an SGLang <= 0.5.19 layer
    layer_fns = {i: hooks.layer_hook({**config, "hook_hf_id": i}) for i in IDS}
    norm, model = hooks.norm_hook(config), hooks.model_hook(config)
    fb = fake_batch("EXTEND", [3], rids=["hs-r1-1-3"])
    hidden = {i: torch.randn(3, H) for i in IDS}
    resid = {i: torch.randn(3, H) for i in IDS}
    for i in IDS:
        layer_fns[i](None, (), (hidden[i], resid[i]))
    final = torch.randn(3, H)
    norm(None, (final,), torch.randn(3, H))  # norm without residual: its input is the pre-norm state
    model(None, (fb.input_ids, None, fb, None), torch.randn(3, H))
    core = hooks._RUNTIME.core
    core.flush()
    _, t = read(core, "hs-r1-1-3")
    for k, i in enumerate(IDS):
        assert torch.allclose(t["aux_hidden_states"][:, k], hidden[i] + resid[i])
    assert torch.equal(t["final_hidden_state"], final)
    core.close()


class OwedOutput:
    """Stands for SGLang 0.5.23's handle to a rank's un-reduced partial sum (what a layer returns under TP)."""


def test_a_layer_output_that_is_no_tensor_is_refused_with_the_true_reason(monkeypatch, tmp_path):
    hooks, config = _fresh_runtime(monkeypatch, tmp_path, mechanism="layer_hooks", architectures=["DeepseekV3ForCausalLM"])
    monkeypatch.setattr(compat, "loaded_source", lambda module, cls: OLD_LAYER_SOURCE)
    layer_fns = {i: hooks.layer_hook({**config, "hook_hf_id": i}) for i in IDS}
    norm, model = hooks.norm_hook(config), hooks.model_hook(config)
    fb = fake_batch("EXTEND", [3], rids=["hs-r1-1-3"])
    for i in IDS:
        layer_fns[i](None, (), (OwedOutput(), None))
    norm(None, (torch.randn(3, H),), torch.randn(3, H))
    model(None, (fb.input_ids, None, fb, None), torch.randn(3, H))
    core = hooks._RUNTIME.core
    core.flush()
    reason = (tmp_path / "stage" / "hs-r1-1-3.refused.json").read_text()
    assert "is of type OwedOutput, not a complete tensor" in reason and "'aux_return'" in reason and "CUDA graph" not in reason
    assert hooks._RUNTIME._errors == 0  # refused by name, not by a failing hook
    core.close()


def test_dp_attention_as_resolved_by_sglang_0523_is_refused_for_layer_hooks():
    args = SimpleNamespace(enable_dp_attention=False, attn_dp_size=2)  # --dp 2 --enable-dp-attention after 0.5.23 resolves it
    assert any("DP attention" in p for p in check_server_args(args, "layer_hooks"))
    assert check_server_args(args, "aux_return") == []


def test_hook_configs_must_agree_and_unsafe_setups_are_refused(monkeypatch, tmp_path):
    hooks, config = _fresh_runtime(monkeypatch, tmp_path)
    hooks.model_hook(config)
    with pytest.raises(hooks.SetupError, match="different configs"):
        hooks.norm_hook({**config, "hf_aux_layer_ids": [2]})
    args = SimpleNamespace(
        pp_size=2, attn_cp_size=1, enable_flashinfer_allreduce_fusion=True, moe_a2a_backend="deepep", enable_dp_attention=True
    )
    problems = check_server_args(args, "layer_hooks")
    assert len(problems) == 4
    assert len(check_server_args(args, "aux_return")) == 2
    monkeypatch.setattr(hooks, "_RUNTIME", None)
    monkeypatch.setattr(compat, "server_args", lambda: args)
    with pytest.raises(hooks.SetupError, match="partial sums"):
        hooks.model_hook(config)


def test_legacy_adapter(monkeypatch, tmp_path):
    from hs_dataset.server_patch.legacy import hook as legacy_hook

    monkeypatch.setattr(compat, "attention_ranks", lambda: (0, 0, "test"))
    monkeypatch.setattr(compat, "server_args", lambda: None)
    monkeypatch.setattr(legacy_hook, "_STATE", {})
    monkeypatch.setenv("HS_CAPTURE_STAGING_DIR", str(tmp_path / "stage"))
    monkeypatch.setenv("HS_CAPTURE_LAYER_IDS", "2,3,4")
    fb = fake_batch("EXTEND", [3], rids=None, ids=torch.tensor([11, 12, 13]))
    assert legacy_hook.wants(fb) and not legacy_hook.wants(fake_batch("DECODE", [1]))
    legacy_hook.on_forward(fb, [torch.randn(3, H) for _ in IDS], torch.randn(3, H), [2, 3, 4])
    core = legacy_hook._STATE["core"]
    core.flush()
    assert files(core) == [content_key([11, 12, 13]) + ".safetensors"]
    with pytest.raises(RuntimeError, match="captured layers"):
        legacy_hook.on_forward(fb, [torch.randn(3, H)], torch.randn(3, H), [2])
    core.close()


def test_server_side_modules_import_nothing_heavy():
    code = (
        "import sys\n"
        "import hs_dataset.server_patch.hooks, hs_dataset.server_patch.legacy.hook, hs_dataset.server_patch.contract.dump\n"
        "import hs_dataset.server_patch.cpu_support.mla_torch_native\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'transformers', 'datasets', 'pyarrow', 'aiohttp', 'yaml', 'huggingface_hub'})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"server-side modules pulled in {out.stdout.strip()} (hs_dataset/__init__ must stay light)"


# ---------------------------------------------------------------------------- client pieces without a server


def test_client_reports_an_unreachable_server_clearly(tmp_path):
    from hs_dataset.capture.base import CaptureTarget
    from hs_dataset.capture.sglang.backend import SGLangBackend
    from hs_dataset.config import SGLangBackendSection

    section = SGLangBackendSection(name="sglang", request_timeout_s=5.0)
    be = SGLangBackend(section, CaptureTarget(model_path=str(tmp_path), aux_layer_ids=IDS), servers=["http://127.0.0.1:9"])
    try:
        with pytest.raises(ServerValidationError, match="unreachable.*hs-dataset serve"):
            be.validate()
    finally:
        be.close()


def test_the_client_checks_the_weights_unless_every_server_loaded_none(tmp_path):
    """A snapshot holding only its final norm fails the check, except against servers started with --load-format dummy."""
    import json

    from safetensors.torch import save_file

    from hs_dataset.capture.base import CaptureTarget
    from hs_dataset.capture.sglang.backend import SGLangBackend
    from hs_dataset.config import SGLangBackendSection
    from hs_dataset.demo.tiny_model import TINY_DEEPSEEK_CONFIG
    from hs_dataset.errors import ModelConfigError

    (tmp_path / "config.json").write_text(json.dumps(TINY_DEEPSEEK_CONFIG))
    save_file({"model.norm.weight": torch.ones(TINY_DEEPSEEK_CONFIG["hidden_size"])}, str(tmp_path / "model.safetensors"))
    section = SGLangBackendSection(name="sglang", request_timeout_s=5.0)
    be = SGLangBackend(section, CaptureTarget(model_path=str(tmp_path), aux_layer_ids=IDS), servers=["http://127.0.0.1:9"])
    try:
        with pytest.raises(ModelConfigError):
            be._local_model_config()
        be.endpoints[0].server_info = {"load_format": "dummy"}
        assert be._local_model_config()["hidden_size"] == TINY_DEEPSEEK_CONFIG["hidden_size"]
    finally:
        be.close()


def test_client_turns_bad_dumps_into_failures(tmp_path):
    from safetensors.torch import save_file

    from hs_dataset.capture.base import CaptureFailure
    from hs_dataset.capture.sglang.dumps import ExpectedDump, check_dump
    from hs_dataset.sample import CapturedSample, TokenizedSample

    expected = ExpectedDump(aux_layer_ids=tuple(IDS), dtype=torch.float32)
    ids = torch.tensor([3, 4, 5])
    sample = TokenizedSample("s", ids, torch.ones(3, dtype=torch.bool))
    meta = {
        "format": "hs_dataset.dump",
        "version": "1",
        "rid": "hs-a-1-3",
        "hf_aux_layer_ids": "[2, 3, 4]",
        "final_state": "pre_norm",
        "sglang_version": "x",
        "dtype": "float32",
    }
    good = {"input_ids": ids, "aux_hidden_states": torch.randn(3, K, H), "final_hidden_state": torch.randn(3, H)}

    def check(tensors, metadata=meta):
        path = str(tmp_path / "d.safetensors")
        save_file(tensors, path, metadata=metadata)
        return check_dump(path, "hs-a-1-3", sample, expected)

    assert isinstance(check(good), CapturedSample)
    assert "token ids differ" in check({**good, "input_ids": torch.tensor([3, 4, 6])}).reason
    assert "shape" in check({**good, "aux_hidden_states": torch.randn(3, 2, H)}).reason
    assert "dtype" in check({**good, "final_hidden_state": torch.randn(3, H).double()}).reason
    assert "HF layers" in check(good, {**meta, "hf_aux_layer_ids": "[1, 2, 3]"}).reason
    assert "names request" in check(good, {**meta, "rid": "hs-a-2-3"}).reason
    assert isinstance(check(good, {**meta, "final_state": "post_norm"}), CaptureFailure)


# ---------------------------------------------------------------------------- CUDA path (runs where a GPU is present)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the CPU path is tested above)")


@needs_cuda
def test_cuda_snapshot_is_asynchronous_and_survives_buffer_reuse(tmp_path):
    core = make_core(tmp_path, hf_aux_layer_ids=[2, 30, 58, 59], max_staging_bytes=8 << 30, pinned_pool_bytes=4 << 30, max_wait_s=5.0)
    dev = torch.device("cuda")
    t, k, h = 2048, 4, 7168  # a Kimi-K2.5-sized sample: 4 x 7168 bf16 per token
    try:
        aux = torch.randn(t, k * h, device=dev, dtype=torch.bfloat16)
        final = torch.randn(t, h, device=dev, dtype=torch.bfloat16)
        ids = torch.arange(t, device=dev)
        expected_aux, expected_final = aux.cpu(), final.cpu()
        b = BatchView.from_forward_batch(fake_batch("EXTEND", [t], rids=[f"hs-cuda-1-{t}"], ids=ids))
        assert core.copier.prepare_pinned() < 30
        core.process(b, aux=aux, final_prenorm=final)  # warm-up: side stream creation
        assert core.copier.pinned_slab_is_pinned(), "the device-copy pool is not page-locked: its copies would be synchronous"
        core.flush()
        os.unlink(tmp_path / "stage" / f"hs-cuda-1-{t}.safetensors")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b = BatchView.from_forward_batch(fake_batch("EXTEND", [t], rids=[f"hs-cuda-2-{t}"], ids=ids))
        core.process(b, aux=aux, final_prenorm=final)
        on_forward_thread = time.perf_counter() - t0
        aux.zero_()  # the next forward overwrites the (graph-static) buffers at once
        final.zero_()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        sync_copy = (aux.cpu(), final.cpu())
        torch.cuda.synchronize()
        synchronous = time.perf_counter() - t1
        core.flush()
        with safe_open(str(tmp_path / "stage" / f"hs-cuda-2-{t}.safetensors"), "pt") as f:
            got_aux, got_final = f.get_tensor("aux_hidden_states"), f.get_tensor("final_hidden_state")
        assert torch.equal(got_aux, expected_aux.view(t, k, h)) and torch.equal(got_final, expected_final)
        print(
            f"CUDA: forward thread {on_forward_thread * 1e3:.2f} ms vs synchronous .cpu() {synchronous * 1e3:.2f} ms for {(t * k * h + t * h) * 2 / 1e6:.0f} MB"
        )
        del sync_copy
    finally:
        core.close()


@needs_cuda
def test_cuda_capture_copies_do_not_hold_up_the_servers_own_small_copy():
    """SGLang waits for a small device-to-host copy at the end of every pass; ours (~1 GB a pass) must not queue ahead of it."""
    from hs_dataset.server_patch.copier import HostCopier

    copier = HostCopier(pinned_pool_bytes=3 << 30)
    copier.prepare_pinned()
    states = torch.randn(16384, 4 * 7168, device="cuda", dtype=torch.bfloat16)  # one 16k-token Kimi-wide pass: 940 MB
    tokens = torch.arange(16, device="cuda")
    try:
        copier.snapshot({"aux": states}, timeout=5, owned=("aux",)).release()  # warm-up: the pump thread, the stream
        torch.cuda.synchronize()
        started = time.perf_counter()
        whole = states.cpu()
        bulk_s = time.perf_counter() - started
        torch.cuda.synchronize()
        piece = copier.snapshot({"aux": states}, timeout=5, owned=("aux",))
        time.sleep(0.002)  # the pump has queued its first slices
        started = time.perf_counter()
        tokens.cpu()  # the server's own copy, as at the end of a prefill pass
        small_s = time.perf_counter() - started
        assert torch.equal(piece.wait()["aux"], whole)
        piece.release()
        print(f"CUDA: the server's small copy took {small_s * 1e3:.2f} ms while ours ran ({bulk_s * 1e3:.1f} ms for 940 MB alone)")
        assert small_s < bulk_s / 4, f"the server's small copy waited {small_s * 1e3:.1f} ms behind the capture copies"
    finally:
        copier.close()


@needs_cuda
def test_cuda_pinned_pool_exhaustion_is_a_refusal(tmp_path):
    core = make_core(tmp_path, pinned_pool_bytes=1 << 20, max_wait_s=0.1)
    aux = torch.randn(4, K * H, device="cuda")
    final = torch.randn(4, H, device="cuda")
    core.process(
        BatchView.from_forward_batch(fake_batch("EXTEND", [4], rids=["hs-cuda-1-4"], ids=torch.arange(4, device="cuda"))),
        aux=aux,
        final_prenorm=final,
    )
    core.flush()
    assert files(core) == ["hs-cuda-1-4.refused.json"]
    assert "pinned" in (tmp_path / "stage" / "hs-cuda-1-4.refused.json").read_text()
    core.close()


def test_a_copier_handed_to_a_core_outlives_it_and_a_core_s_own_copier_is_closed_with_it(tmp_path, monkeypatch):
    """A benchmark's phases (or a server) share one copier: closing one core must not stop it for the next."""
    from hs_dataset.server_patch.copier import HostCopier

    closed = []
    monkeypatch.setattr(HostCopier, "close", lambda self: closed.append(self))
    shared = HostCopier(pinned_pool_bytes=8 << 20)
    cfg = CaptureConfig.from_sources({"staging_dir": str(tmp_path / "a"), "hf_aux_layer_ids": IDS, "sweep_interval_s": 3600}, environ={})
    first = CaptureCore(cfg, sglang_version="test", copier=shared)
    first.close()
    assert closed == []
    second = CaptureCore(cfg, sglang_version="test", copier=shared)
    second.process(
        BatchView.from_forward_batch(fake_batch("EXTEND", [3], rids=["hs-r1-1-3"])),
        aux=torch.randn(3, K * H),
        final_prenorm=torch.randn(3, H),
    )
    second.flush()
    assert "hs-r1-1-3.safetensors" in files(second)
    second.close()
    own = make_core(tmp_path / "b")
    own.close()
    assert closed == [own.copier]


@needs_cuda
def test_cuda_copier_works_again_after_close():
    from hs_dataset.server_patch.copier import HostCopier

    copier = HostCopier(pinned_pool_bytes=64 << 20)
    states = torch.randn(256, 1024, device="cuda")
    for _ in range(2):
        piece = copier.snapshot({"aux": states}, timeout=5)
        assert torch.equal(piece.wait()["aux"], states.cpu())
        piece.release()
        copier.close()


def test_cpu_snapshots_come_from_a_bounded_pool_and_go_back_after_the_write(tmp_path):
    """A CPU server's copies reuse touched memory; when the pool is spent the request is refused, not grown."""
    from hs_dataset.server_patch.copier import HostCopier

    copier = HostCopier(pinned_pool_bytes=4 << 20)
    rows = torch.zeros(1024, 1024, dtype=torch.bfloat16)  # 2 MiB
    first = copier.snapshot({"aux": rows}, timeout=0)
    second = copier.snapshot({"aux": rows}, timeout=0)
    assert first is not None and second is not None
    assert copier.snapshot({"aux": rows}, timeout=0) is None  # 4 MiB held: no room, no wait
    ptr = first.wait()["aux"].data_ptr()
    first.release()  # the dump was written
    again = copier.snapshot({"aux": rows}, timeout=0)
    assert again is not None and again.wait()["aux"].data_ptr() == ptr


@needs_cuda
def test_a_small_host_tensor_goes_to_the_device_without_the_thread_waiting_for_its_stream():
    """``to_device`` (positions, row indices) queues its copy behind the forward's kernels instead of waiting for them,
    as ``.to(cuda)`` from pageable memory does."""
    from hs_dataset.server_patch.copier import to_device

    device = torch.device("cuda")
    to_device(torch.arange(4), device)  # the first pinned block is allocated outside the timing
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda._sleep(500_000_000)  # a few hundred ms of the GPU busy ahead of the copy
        started = time.perf_counter()
        index = to_device(torch.arange(128), device)
        queued_in = time.perf_counter() - started
        started = time.perf_counter()
        torch.arange(128).to(device)  # the pageable copy, for contrast: it waits for the sleep
        waited = time.perf_counter() - started
        assert index.tolist() == list(range(128))
    assert queued_in < 0.02 < waited, (queued_in, waited)
