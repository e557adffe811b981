"""The regeneration benchmark's helpers: the workload, the turn-order client's prompts, the prefill counters, the plain server."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

from tests.fixtures.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from _plain_server import plain_argv, plain_env, with_mem_fraction
from _regen_clients import StoredTurn, follow_on, stored_turns
from _server_metrics import Counters, log_new_tokens, parse_metrics
from bench_regenerate import _no_capture, common_head, conversations, cv

from hs_dataset.capture.serve.plan import CPU_MLA_FACTORY, ServerPlan
from hs_dataset.config import load_card
from hs_dataset.server_patch.contract.mechanism import Mechanism


def test_workload_has_the_multi_turn_share_and_the_spread() -> None:
    rows, lengths = conversations(60, 40.0, 1.2, 240, seed=3, multi_turn=0.4)
    turns = [len(r["messages"]) // 2 for r in rows]
    assert sum(t > 1 for t in turns) == 24 and set(turns) <= {1, 2, 3, 4} and max(turns) > 2
    assert len(lengths) == sum(turns) and max(lengths) <= 240 and cv(lengths) >= 1


def test_stored_turns_skip_refused_turns_and_records_without_a_sample() -> None:
    record = {"input_ids": list(range(10)), "turns": [{"prompt_tokens": 3, "token_ids": [3, 4]}, {"prompt_tokens": 0, "token_ids": []}]}
    assert stored_turns(record) == [StoredTurn([0, 1, 2], [3, 4])]
    assert stored_turns({"input_ids": None, "turns": record["turns"]}) == []


def test_follow_on_puts_the_clients_own_history_in_place_of_the_stored_one() -> None:
    before = StoredTurn([1, 2], [3, 4])
    turn = StoredTurn([1, 2, 3, 4, 9, 5], [6])
    assert follow_on(turn, before, [1, 2, 7, 8]) == [1, 2, 7, 8, 9, 5]
    # a template that renders the earlier answer differently: the stored prompt goes as it is
    assert follow_on(StoredTurn([1, 2, 3, 0, 9], [6]), before, [1, 2, 7, 8]) is None
    assert follow_on(StoredTurn([1, 0, 3, 4, 9], [6]), before, [1, 2, 7, 8]) is None


def test_metrics_sum_every_label_set_and_give_the_tokens_computed() -> None:
    text = "\n".join(
        [
            "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
            'sglang:prompt_tokens_total{model_name="m"} 120.0',
            'sglang:prompt_tokens_created{model_name="m"} 1.7e9',
            'sglang:cached_tokens_total{cache_source="device",model_name="m"} 30.0',
            'sglang:cached_tokens_total{cache_source="host",model_name="m"} 10.0',
            'sglang:generation_tokens_total{model_name="m"} 55.0',
        ]
    )
    after = parse_metrics(text)
    assert after == Counters(120.0, 40.0, 55.0)
    assert after.prefilled_since(Counters(20.0, 5.0, 0.0)) == 65
    assert parse_metrics('sglang:generation_tokens_total{model_name="m"} 5.0') is None


def test_the_log_counts_new_tokens_after_the_offset(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    line = "[t] Prefill batch, #new-seq: 1, #new-token: {n}, #cached-token: 4, token usage: 0.01, cpu graph: False\n"
    log.write_text(line.format(n=7) + "[t] Decode batch, #running-req: 1\n")
    _, end = log_new_tokens(log, 0)
    with open(log, "a") as f:
        f.write(line.format(n=12) + line.format(n=3))
    assert log_new_tokens(log, 0)[0] == 22 and log_new_tokens(log, end)[0] == 15


@pytest.fixture
def capture_plan() -> ServerPlan:
    hooks = [
        {"name": "hs_cpu_mla", "target_modules": ["model"], "hook_factory": CPU_MLA_FACTORY, "config": {}},
        {"name": "hs_capture", "target_modules": ["model"], "hook_factory": "hs_dataset.server_patch.hooks:model_hook", "config": {}},
    ]
    argv = ["-m", "sglang.launch_server", "--disable-radix-cache", "--disable-prefill-cuda-graph", "--forward-hooks", json.dumps(hooks)]
    env = {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": "/support", "HS_CAPTURE_CONTENT_KEYS": "1", "HS_DATASET_DATASETS_HOOK": "0"}
    return ServerPlan(
        python="python", argv=argv, env=env, url="http://127.0.0.1:30000", host="127.0.0.1", port=30000, model_path="/m",
        staging_dir="/s", sglang_version="0.5.23", mechanism=Mechanism.LAYER_HOOKS, support_status="", hf_aux_layer_ids=[2],
        sglang_aux_layer_ids=None, hook_config={},
    )  # fmt: skip


def test_the_plain_server_keeps_the_sizing_and_drops_capture(capture_plan: ServerPlan) -> None:
    card = load_card("tiny-deepseek-sglang").with_overrides(sglang={"radix_cache": True, "chunked_prefill_size": 64})
    argv = plain_argv(card, capture_plan, 30001)
    assert argv[:2] == ["-m", "sglang.launch_server"] and argv[argv.index("--port") + 1] == "30001"
    assert "--disable-radix-cache" not in argv and "--disable-prefill-cuda-graph" not in argv
    assert argv[argv.index("--chunked-prefill-size") + 1] == "64" and argv.count("--enable-metrics") == 1
    assert " ".join(map(str, card.sglang.args)) in " ".join(argv)
    assert [h["name"] for h in json.loads(argv[argv.index("--forward-hooks") + 1])] == ["hs_cpu_mla"]
    assert plain_env(capture_plan) == {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": "/support"}


def test_the_second_server_on_a_gpu_gets_its_own_memory_fraction() -> None:
    argv = ["-m", "sglang.launch_server", "--mem-fraction-static", "0.5", "--port", "1"]
    assert with_mem_fraction(argv, 0.8) == ["-m", "sglang.launch_server", "--mem-fraction-static", "0.8", "--port", "1"]
    assert with_mem_fraction(["--port", "1"], 0.8) == ["--port", "1", "--mem-fraction-static", "0.8"]


def test_the_common_head_is_what_every_prompt_starts_with() -> None:
    assert common_head([[1, 2, 3, 4], [1, 2, 3], [1, 2, 9, 4]]) == [1, 2]
    assert common_head([[5, 6], [7]]) == [] and common_head([]) == []


def test_the_capture_free_stand_in_takes_what_the_builds_capture_takes() -> None:
    """``--isolate`` swaps the build's ``_capture`` for ``_no_capture``: a parameter added to one must reach the
    other, or the GPU profile's capture-free builds fail on the device (as on 2026-12-07, after ``task`` was added)."""
    import hs_dataset.pipeline.build as build

    assert list(inspect.signature(_no_capture).parameters) == list(inspect.signature(build._capture).parameters)
