"""One pass on real CPU SGLang servers: regenerated conversations captured while the server generates them.

Each release of the matrix (0.5.23 through ``aux_return``; 0.5.19 and 0.5.14 through ``layer_hooks``) serves
the tiny DeepseekV3 in float32 as a regeneration server does: prefix cache ON (``serve --regenerate``),
prefill in chunks of 64, and a KV pool so small that the cache evicts while the build runs. Conversations of
three turns share a long system prompt, so later turns and other conversations hit the prefix cache. Every
stored state must be within 1e-5 (max abs) of transformers' full forward of the stored sequence; beside it
the test prints how far transformers' own incremental decoding (``past_key_values``) is from that forward.
A build killed (SIGKILL) at three points resumes to the same dataset, with no half conversation stored.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import hs_dataset
from hs_dataset.pipeline.build import build_dataset
from tests.fixtures.reference import incremental_aux_and_prenorm
from tests.fixtures.sglang_client import backend, staged
from tests.fixtures.sglang_server import AUX, CHUNK, hf_reference, start_server

pytestmark = pytest.mark.sglang

RELEASES = ["0.5.23", "0.5.19", "0.5.14"]  # 0.5.23 is the base server env; the others its overlays
POOL_TOKENS = (
    640  # the server's whole KV pool (--max-total-tokens): the build's tokens overflow it three times, 4 requests in flight fill it
)
NEW_TOKENS = 16
SYSTEM = "You are a careful assistant. " * 12  # ~70 tokens every conversation starts with: a cross-conversation cache hit


def _chats(n: int) -> list[dict]:
    chats = []
    for i in range(n):
        turns = 3 if i % 3 else 1
        messages = [{"role": "system", "content": SYSTEM}]
        for t in range(turns):
            messages += [
                {"role": "user", "content": f"Question {t} of chat {i}: count to {i + t + 2}."},
                {"role": "assistant", "content": "ok"},
            ]
        chats.append({"id": f"c{i}", "messages": messages})
    return chats


@pytest.fixture(scope="module", params=RELEASES)
def regen_server(request, card, tiny_model, hs_tmp):
    version = request.param
    server = start_server(
        card.with_overrides(regenerate={"enabled": True}),
        hs_tmp,
        f"one-pass-{version}",
        version=None if version == "0.5.23" else version,
        chunked_prefill_size=CHUNK,
        extra_args=["--max-total-tokens", str(POOL_TOKENS)],
    )
    assert "--disable-radix-cache" not in server.plan.argv  # a regeneration server keeps its prefix cache
    yield version, server
    server.stop(timeout=5)


def _regen_card(card):
    return card.with_overrides(regenerate={"enabled": True, "max_new_tokens": NEW_TOKENS, "thinking": "off", "concurrency": 4})


def test_one_pass_states_equal_a_full_forward(card, regen_server, hf_model, tmp_path):
    version, server = regen_server
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in _chats(12)))
    be = backend(_regen_card(card), server)
    try:
        report = build_dataset(_regen_card(card), tmp_path / "ds", source=str(src), backend=be)
    finally:
        be.close()
    stats = {k: v for k, v in be.stats.items() if k.startswith("one_pass")}
    why = (report.summary(), report.capture_failures[:3], be.stats, be.one_pass_fallback_reasons)  # what a failure needs said
    assert report.samples_written == 12 and report.regeneration["failed"] == 0, why
    assert stats["one_pass_samples"] == 12 and stats["one_pass_fallbacks"] == 0, stats
    assert staged(server) == []
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert sum(s["captured_by"]["one_pass"] for s in manifest["shards"]) == 12
    data = hs_dataset.open_dataset(tmp_path / "ds")
    worst, stored, generated = 0.0, 0, report.regeneration["generated_tokens"]
    for i in range(len(data)):
        row = data[i]
        aux, final = hf_reference(hf_model, row["input_ids"])
        worst = max(worst, float((row["aux_hidden_states"] - aux).abs().max()), float((row["final_hidden_state"] - final).abs().max()))
        stored += len(row["input_ids"])
    row = data[0]
    start = int(len(row["input_ids"]) - row["loss_mask"].sum())  # the prompt in one forward, then the answer token by token
    inc_aux, inc_final = incremental_aux_and_prenorm(hf_model, row["input_ids"], AUX, start)
    full_aux, full_final = hf_reference(hf_model, row["input_ids"])
    hf_inc = max(float((inc_aux - full_aux).abs().max()), float((inc_final - full_final).abs().max()))
    print(
        f"SGLang {version} one pass: {stored} stored tokens (KV pool {POOL_TOKENS}), max abs vs the full forward {worst:.2e} "
        f"(transformers' own incremental decoding: {hf_inc:.2e}); repaired {stats['one_pass_repair_tokens']} tokens in "
        f"{stats['one_pass_repairs']} requests, {stats['one_pass_shared_tokens']} copied from a shared prefix, for {generated} generated"
    )
    assert worst <= 1e-5
    assert stored > 2 * POOL_TOKENS  # the pool had to evict while the build ran


CRASH_POINTS = ["regenerate.after_turn:7", "regenerate.after_chunk:1", "shard.before_publish:1"]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_kill_during_a_one_pass_build_then_resume(card, regen_server, hf_model, tmp_path, point, python_env):
    """SIGKILL at ``point``, resume with a new client: the dataset verifies, every conversation is there once, whole."""
    version, server = regen_server
    if version != "0.5.23":
        pytest.skip("one release is enough for the kill points (the client's resume does not depend on the release)")
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in _chats(6)))
    out = tmp_path / "ds"
    script = (
        "import sys\nfrom hs_dataset.config import load_card\nfrom hs_dataset.capture.sglang.backend import SGLangBackend\n"
        "from hs_dataset.pipeline.build import build_dataset\n"
        "card = load_card('tiny-deepseek-sglang').with_overrides(regenerate={'enabled': True, "
        f"'max_new_tokens': {NEW_TOKENS}, 'thinking': 'off', 'concurrency': 4}}, backend={{'batch_size': 2}}, "
        "model={'path': sys.argv[3]})\n"
        "be = SGLangBackend.from_card(card, servers=[sys.argv[4]])\n"
        "try:\n    build_dataset(card, sys.argv[1], source=sys.argv[2], backend=be)\nfinally:\n    be.close()\n"
        "print('one_pass', be.stats['one_pass_samples'], be.stats['one_pass_fallbacks'])\n"
    )
    argv = [sys.executable, "-c", script, str(out), str(src), str(server.plan.model_path), server.url]
    killed = subprocess.run(argv, env={**python_env, "HS_DATASET_CRASH_AT": point}, capture_output=True, timeout=600)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    done = subprocess.run(argv, env=python_env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "one_pass" in done.stdout.decode() and done.stdout.decode().split()[-1] == "0"  # no fallback to prefill
    verified = subprocess.run([sys.executable, "-m", "hs_dataset.cli.main", "verify", str(out)], env=python_env, capture_output=True)
    assert verified.returncode == 0, verified.stdout.decode()[-2000:] + verified.stderr.decode()[-2000:]
    data = hs_dataset.open_dataset(out)
    ids = [data[i]["sample_id"] for i in range(len(data))]
    assert len(ids) == len(set(ids)) == 6  # every conversation once
    for i in range(len(data)):
        row = data[i]
        aux, final = hf_reference(hf_model, row["input_ids"])
        assert float((row["aux_hidden_states"] - aux).abs().max()) <= 1e-5
        assert float((row["final_hidden_state"] - final).abs().max()) <= 1e-5
        # whole: the stored sample is its conversation's last prompt and answer, its answer supervised to the end
        assert bool(row["loss_mask"][-1]) and int(row["loss_mask"].sum()) > 0
