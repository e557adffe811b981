"""End-to-end tests against a REAL SGLang server (the tiny DeepseekV3, float32, on CPU).

Needs ``.sglang-venv`` (``make sglang-env``); skipped with a message when it is
missing, except under CI (env ``CI`` set), where that is a failure.

Servers (each takes ~20-40 s to start on 2 cores, so as few as possible):

* ``capture_server`` (session): radix cache off, ``--chunked-prefill-size 64`` so long
  prompts are prefilled in chunks and assembled;
* ``radix_server``: radix cache ON, started for the partial-prompt test only;
* ``plain_server``: no hs_dataset hooks (only the CPU MLA support), for the
  "capture not enabled" error.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hs_dataset.capture.base import CaptureFailure
from hs_dataset.errors import ServerValidationError
from hs_dataset.sample import CapturedSample, TokenizedSample
from tests.fixtures.ports import free_port as _free_port
from tests.fixtures.sglang_client import backend, make_samples, post, staged
from tests.fixtures.sglang_server import (  # noqa: F401  (helpers shared with other real-server tests)
    AUX,
    CHUNK,
    SERVER_PYTHON,
    hf_reference,
    rel,
    remove_dumps,
    require_sglang_env as _require_env,
    staged_files,
    start_server as _start,
)

# ---------------------------------------------------------------------------- the main path


def test_warmup_and_health_checks_leave_no_dumps(capture_server):
    # what earlier tests' clients left in flight when they stopped early (the server's sweeper expires it) is not ours to judge
    before = set(staged(capture_server))
    for path in ("/health", "/health_generate", "/health_generate"):
        with urllib.request.urlopen(capture_server.url + path, timeout=60) as resp:
            assert resp.status == 200
    # a request of another client (rid without our prefix) is served but not dumped
    post(capture_server.url, {"rid": "someone-else-1", "input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1}})
    time.sleep(0.5)
    assert not set(staged(capture_server)) - before
    log = Path(capture_server.log_path).read_text()
    assert "hs_dataset capture: hooks loaded" in log and "this rank writes dumps" in log


def test_concurrent_capture_matches_hf_forward(card, capture_server, hf_model):
    lengths = [5, 37, 64, 65, 130, 300, 7, 200, 12, 90, 1, 64]  # > 64 tokens are prefilled in chunks
    samples = make_samples(24, lengths, seed=1)
    be = backend(card, capture_server, concurrency=8)
    try:
        t0 = time.monotonic()
        results = list(be.capture_stream(samples, batch_size=8))
        took = time.monotonic() - t0
        info = be.info()
    finally:
        be.close()
    by_id = {r.sample_id: r for r in results}
    assert len(results) == len(samples) and not [r for r in results if isinstance(r, CaptureFailure)], results
    worst = {"aux": 0.0, "final": 0.0}
    for s in samples:
        r = by_id[s.sample_id]
        assert isinstance(r, CapturedSample)
        assert torch.equal(r.input_ids, s.input_ids) and torch.equal(r.loss_mask, s.loss_mask)
        assert r.aux_hidden_states.shape == (s.num_tokens, 3, 64) and r.aux_hidden_states.dtype == torch.float32
        ref_aux, ref_final = hf_reference(hf_model, s.input_ids)
        for k in range(3):
            worst["aux"] = max(worst["aux"], rel(r.aux_hidden_states[:, k], ref_aux[:, k]))
        worst["final"] = max(worst["final"], rel(r.final_hidden_state, ref_final))
    print(f"captured {len(samples)} samples in {took:.2f} s; worst relative error vs HF: {worst}")
    assert worst["aux"] < 2e-6 and worst["final"] < 2e-6, worst
    assert info.final_state == "pre_norm" and info.aux_layer_ids == AUX and info.hidden_size == 64
    assert info.final_norm_weight is not None and info.final_norm_eps == pytest.approx(1e-6)
    assert info.backend_details["mechanism"] == "aux_return" and info.backend_details["sglang_version"].startswith("0.5.23")
    assert staged(capture_server) == []  # every dump was consumed and deleted
    # some prefill passes carried several requests
    batched = [int(m) for m in re.findall(r"Prefill batch, #new-seq: (\d+)", Path(capture_server.log_path).read_text())]
    assert max(batched) > 1, batched


def test_batched_prefill_dumps_carry_the_contract(capture_server, hf_model):
    ids = [[11, 12, 13], list(range(100, 140)), list(range(1000, 1080))]  # the last one is chunked (80 > 64)
    rids = [f"hs-contract-{i}-{len(x)}" for i, x in enumerate(ids)]
    post(capture_server.url, {"rid": rids, "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(staged(capture_server)) < 3:
        time.sleep(0.05)
    try:
        assert staged(capture_server) == sorted(r + ".safetensors" for r in rids)
        for rid, x in zip(rids, ids):
            path = os.path.join(capture_server.staging_dir, rid + ".safetensors")
            with safe_open(path, "pt") as f:
                meta = f.metadata()
                t = {k: f.get_tensor(k) for k in f.keys()}
            assert meta["format"] == "hs_dataset.dump" and meta["version"] == "1" and meta["rid"] == rid
            assert json.loads(meta["hf_aux_layer_ids"]) == AUX and meta["final_state"] == "pre_norm"
            assert meta["dtype"] == "float32" and meta["sglang_version"].startswith("0.5.23")
            assert t["input_ids"].tolist() == x
            assert t["aux_hidden_states"].shape == (len(x), 3, 64) and t["final_hidden_state"].shape == (len(x), 64)
            ref_aux, ref_final = hf_reference(hf_model, torch.tensor(x))
            assert rel(t["aux_hidden_states"], ref_aux) < 2e-6 and rel(t["final_hidden_state"], ref_final) < 2e-6
            st = os.stat(path)
            assert st.st_mode & 0o077 == 0
        metas = []
        for rid in rids:
            with safe_open(os.path.join(capture_server.staging_dir, rid + ".safetensors"), "pt") as f:
                metas.append(f.metadata())
        assert int(metas[0]["prefill_batch_requests"]) > 1  # the three were prefilled together
        assert metas[2]["num_chunks"] == "2"  # 80 tokens in chunks of 64, assembled
    finally:
        remove_dumps(capture_server.staging_dir, rids)


def test_path_traversal_rid_writes_nothing(capture_server, hs_tmp):
    before = set(os.listdir(hs_tmp))
    for rid in ("hs-../../../escape-1-3", "hs-x-1-3/../../../../tmp/evil", "hs-a-1-3\u2215x"):
        post(capture_server.url, {"rid": rid, "input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1}})
    time.sleep(0.5)
    assert staged(capture_server) == []
    assert set(os.listdir(hs_tmp)) == before
    assert not os.path.exists("/tmp/evil")
    assert "ignoring request with invalid rid" in Path(capture_server.log_path).read_text()
    with urllib.request.urlopen(capture_server.url + "/health", timeout=10) as resp:
        assert resp.status == 200


def test_one_failing_endpoint_does_not_stop_the_run(card, capture_server):
    be = backend(card, capture_server, servers=[capture_server.url, capture_server.url], retries=1, backoff_s=0.05)
    try:
        be.validate()
        be.endpoints[1].url = "http://127.0.0.1:9"  # the second server "dies" after validation
        samples = make_samples(6, [9, 20], seed=5)
        results = list(be.capture_stream(samples, batch_size=4))
    finally:
        be.close()
    assert all(isinstance(r, CapturedSample) for r in results), results
    assert be.stats["endpoint_errors"] >= 1 and be.endpoints[0].served >= len(samples)


# ---------------------------------------------------------------------------- bad set-ups


def test_wrong_model_is_refused(card, capture_server, tiny_model, tmp_path):
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["hidden_size"] = 128
    (other / "config.json").write_text(json.dumps(cfg))
    be = backend(card, capture_server, model_path=str(other))
    try:
        with pytest.raises(ServerValidationError, match="serves .* but this config captures"):
            be.validate()
    finally:
        be.close()


def test_wrong_layers_or_dtype_are_refused(card, capture_server):
    be = backend(card, capture_server, aux_layer_ids=[1, 2, 3])
    try:
        with pytest.raises(ServerValidationError, match=r"captures HF hidden_states \[2, 3, 4\]"):
            be.validate()
    finally:
        be.close()
    be = backend(card, capture_server, dtype="bfloat16")
    try:
        with pytest.raises(ServerValidationError, match="bfloat16"):
            be.validate()
    finally:
        be.close()


def test_unreachable_server_is_refused(card):
    from hs_dataset.capture.sglang.backend import SGLangBackend

    be = SGLangBackend.from_card(card, servers=[f"http://127.0.0.1:{_free_port()}"])
    try:
        with pytest.raises(ServerValidationError, match="unreachable"):
            be.validate()
    finally:
        be.close()


def test_staging_dir_not_private_is_refused(card, capture_server):
    os.chmod(capture_server.staging_dir, 0o755)
    try:
        be = backend(card, capture_server)
        try:
            with pytest.raises(ServerValidationError, match="private"):
                be.validate()
        finally:
            be.close()
    finally:
        os.chmod(capture_server.staging_dir, 0o700)


def test_serve_check_prints_the_plan(capture_server):
    env = dict(os.environ, HS_SGLANG_PYTHON=str(SERVER_PYTHON))
    out = subprocess.run(
        [sys.executable, "-m", "hs_dataset.cli.main", "serve", "--config", "tiny-deepseek-sglang", "--port", "30999", "--check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for flag in (
        "--enable-return-aux-hidden-states",
        "--return-aux-hidden-state-layer-ids 2 3 4",
        "--disable-radix-cache",
        "--forward-hooks",
        "hs_dataset.server_patch.hooks:norm_hook",
        "--dtype float32",
    ):
        assert flag in out.stdout, flag
    assert "mechanism: aux_return" in out.stdout


def test_plain_server_without_hooks_is_refused(card, hs_tmp):
    """A server started without hs_dataset's capture hooks: the client says capture is not enabled."""
    from hs_dataset.capture.serve import launch, plan_server

    _require_env()
    plan = plan_server(card, port=_free_port(), staging_dir=str(hs_tmp / "plain-stage"), python=str(SERVER_PYTHON))
    argv = list(plan.argv)
    i = argv.index("--forward-hooks")
    specs = [s for s in json.loads(argv[i + 1]) if s["name"] == "hs_cpu_mla"]  # CPU support only, no capture
    argv[i + 1] = json.dumps(specs)
    for flag, n in (("--enable-return-aux-hidden-states", 0), ("--speculative-algorithm", 1)):
        j = argv.index(flag)
        del argv[j : j + 1 + n]
    j = argv.index("--return-aux-hidden-state-layer-ids")
    del argv[j : j + 4]
    plan.argv = argv
    server = launch(plan, log_path=str(hs_tmp / "plain.log"), timeout=300)
    try:
        be = backend(card, server)
        try:
            with pytest.raises(ServerValidationError, match="capture is not enabled"):
                be.validate()
        finally:
            be.close()
    finally:
        server.stop(timeout=5)


def test_radix_cache_partial_prompts_are_refused_or_recomputed(card, hs_tmp, hf_model):
    """With the prefix cache ON a repeated prefix is only partly computed: refused, or forced whole."""
    _require_env()
    server = _start(card, hs_tmp, "radix", radix_cache=True)
    try:
        be = backend(card, server, force_full_prefill=False)
        try:
            with pytest.raises(ServerValidationError, match="radix"):
                be.validate()
        finally:
            be.close()
        base = make_samples(1, [40], seed=9)[0]
        longer = TokenizedSample("longer", torch.cat([base.input_ids, torch.tensor([77, 78, 79])]), torch.ones(43, dtype=torch.bool))
        be = backend(card, server, allow_radix_cache=True)
        try:
            first = be.capture_batch([base])[0]
            second = be.capture_batch([longer])[0]  # shares 40 cached tokens
        finally:
            be.close()
        assert isinstance(first, CapturedSample)
        assert isinstance(second, CaptureFailure) and "partial prompt" in second.reason, second
        be = backend(card, server, force_full_prefill=True)
        try:
            again = be.capture_batch([longer])[0]
        finally:
            be.close()
        assert isinstance(again, CapturedSample), again
        ref_aux, ref_final = hf_reference(hf_model, longer.input_ids)
        assert rel(again.aux_hidden_states, ref_aux) < 2e-6 and rel(again.final_hidden_state, ref_final) < 2e-6
        assert staged(server) == []
    finally:
        server.stop(timeout=5)


# ---------------------------------------------------------------------------- regeneration through the same server

REGEN_CHATS = [
    {"id": "g1", "messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]},
    {
        "id": "g2",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Again?"},
            {"role": "assistant", "content": "Hello again."},
        ],
    },
    {"id": "g3", "conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]},
]


def test_regeneration_through_the_server_matches_plain_generate_and_hf(card, capture_server, hf_model, tmp_path):
    """--regenerate on SGLang: turns equal plain /generate requests, no dump is staged for them, states equal transformers."""
    import hs_dataset
    from hs_dataset.capture.sglang.generate import SGLangGenerator, parse_output
    from hs_dataset.formats.regenerated import RegeneratedStore
    from hs_dataset.pipeline.build import build_dataset
    from hs_dataset.regenerate.generator import GenerationParams

    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in REGEN_CHATS))
    regen_card = card.with_overrides(regenerate={"enabled": True, "max_new_tokens": 6, "thinking": "off", "concurrency": 4})
    be = backend(regen_card, capture_server)
    try:
        report = build_dataset(regen_card, tmp_path / "ds", source=str(src), backend=be)
        # finished conversations went to capture in groups of one prefill batch: the server's own chunk size
        assert be.capture_burst(regen_card.backend.batch_size) == (
            CHUNK,
            max(regen_card.backend.batch_size, regen_card.backend.concurrency),
        )
    finally:
        be.close()
    assert report.samples_written == 3 and report.regeneration["turns"] == 4 and report.regeneration["failed"] == 0
    assert staged(capture_server) == []
    # a CPU server decodes without CUDA graphs: every conversation was captured while generated (one pass)
    print("one-pass stats:", {k: v for k, v in be.stats.items() if k.startswith("one_pass")})
    assert be.stats["one_pass_samples"] == 3 and be.stats["one_pass_fallbacks"] == 0, be.stats
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert [s.get("captured_by") for s in manifest["shards"]] == [{"one_pass": 3}]
    meta = manifest["metadata"]["regeneration"]
    assert meta["generator"]["engine"] == "sglang" and meta["generator"]["version"] and meta["generator"]["model_fingerprint"]
    params = GenerationParams(6, stop_token_ids=tuple(meta["stop_token_ids"]))
    plain = SGLangGenerator([capture_server.url])
    data = hs_dataset.open_dataset(tmp_path / "ds")
    rows = {data[i]["sample_id"]: data[i] for i in range(len(data))}
    worst = 0.0
    try:
        for sid, rec in RegeneratedStore(tmp_path / "ds").records.items():
            for turn in rec["turns"]:  # one request at a time, nothing else in flight
                out = post(capture_server.url, plain.body(rec["input_ids"][: turn["prompt_tokens"]], params))
                assert parse_output(out, params).token_ids == turn["token_ids"], sid
            row = rows[sid]
            assert row["input_ids"].tolist() == rec["input_ids"]
            assert [t for t, m in zip(rec["input_ids"], row["loss_mask"].tolist()) if m] == [
                t for tr in rec["turns"] for t in tr["token_ids"]
            ]
            aux, final = hf_reference(hf_model, row["input_ids"])
            worst = max(worst, rel(row["aux_hidden_states"], aux), rel(row["final_hidden_state"], final))
    finally:
        plain.close()
    print(f"SGLang regeneration: states vs transformers, worst relative error {worst:.2e}")
    assert worst < 1e-6
