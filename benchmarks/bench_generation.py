"""Regeneration throughput: many /generate requests in flight vs one at a time, same CPU SGLang server, same run.

One real SGLang 0.5.23 server (CPU) runs the ``tiny-deepseek-sglang`` card (started
here through ``hs_dataset.capture.serve``, with the capture hooks on: generation requests carry
``gen-`` ids the hook ignores, which this run also checks: nothing is staged). The
prompts are the first turns of the bundled conversations rendered with the chat
template's generation prompt, cycled to ``--prompts``; each asks for
``--new-tokens`` greedy tokens (no stop token, so every request writes the same count).
``SGLangGenerator`` runs them with ``concurrency=1`` and ``--concurrency``, alternating
(serial, concurrent, concurrent, serial, ...) so drift in the machine's load hits both;
each figure is the median over ``--rounds``. The concurrent and serial outputs must be
the same tokens. Last line: ``generation_speedup=X`` (tokens/s, concurrent / serial).

    .venv/bin/python benchmarks/bench_generation.py [--prompts 32] [--new-tokens 32] [--concurrency 16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sglang_bench_util import SERVER_PYTHON, finish_run, free_port, server_python_missing, server_shm_files, start_run

CARD = "tiny-deepseek-sglang"


def prompts(tokenizer, n: int) -> list[list[int]]:
    """First-turn generation prompts of the bundled conversations, cycled to ``n``."""
    from hs_dataset.sources import bundled_conversations_path, normalize_conversation

    rows = [json.loads(line) for line in bundled_conversations_path().read_text().splitlines() if line.strip()]
    out = []
    for row in rows:
        msgs = normalize_conversation(row).messages
        first = next(k for k, m in enumerate(msgs) if m["role"] == "assistant")
        ids = tokenizer.apply_chat_template(msgs[:first], add_generation_prompt=True, thinking=False, tokenize=True, return_dict=True)[
            "input_ids"
        ]
        out.append(list(ids))
    return [out[k % len(out)] for k in range(n)]


def timed(generator, batch, params) -> tuple[float, list]:
    t0 = time.perf_counter()
    results = generator.generate(batch, params)
    return time.perf_counter() - t0, results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--server-env", nargs="*", default=["OMP_WAIT_POLICY=PASSIVE"], help="extra KEY=VALUE for the server")
    args = ap.parse_args()
    if server_python_missing():
        return 2

    from transformers import AutoTokenizer

    from hs_dataset.capture.serve import launch, plan_server
    from hs_dataset.capture.sglang.generate import SGLangGenerator
    from hs_dataset.config import load_card
    from hs_dataset.demo.tiny_model import build_tiny_deepseek
    from hs_dataset.regenerate.generator import GenerationParams

    tmp, shm = start_run("generation")  # SIGTERM -> SystemExit, so the finally below still stops the server
    server, shm_seen, gens = None, set(), []
    try:
        model_dir = build_tiny_deepseek()
        port = free_port()
        base = load_card(CARD)
        staging = {**base.sglang.staging.model_dump(), "dir": str(shm / "stage")}
        env = {**base.sglang.env, **dict(kv.split("=", 1) for kv in args.server_env)}
        card = base.with_overrides(
            model={"path": str(model_dir)},
            sglang={"port": port, "python": str(SERVER_PYTHON), "staging": staging, "env": env},
        )
        plan = plan_server(card, port=port, staging_dir=staging["dir"], python=str(SERVER_PYTHON), model_path=str(model_dir))
        t0 = time.perf_counter()
        server = launch(plan, log_path=str(tmp / "server.log"), timeout=300)
        shm_seen = server_shm_files(server.proc.pid)
        print(
            f"server: SGLang {plan.sglang_version} on CPU, card {CARD}, extra env {args.server_env}, healthy after {time.perf_counter() - t0:.1f} s"
        )
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        batch = prompts(tokenizer, args.prompts)
        params = GenerationParams(args.new_tokens, stop_token_ids=())  # no stop: every request writes --new-tokens
        serial = SGLangGenerator([server.url], concurrency=1)
        concurrent = SGLangGenerator([server.url], concurrency=args.concurrency)
        gens = [serial, concurrent]
        timed(concurrent, batch[:4], params)  # warm-up
        times: dict[str, list[float]] = {"serial": [], "concurrent": []}
        outputs: dict[str, list] = {}
        for r in range(args.rounds):
            order = ["serial", "concurrent"] if r % 2 == 0 else ["concurrent", "serial"]
            for name in order:
                seconds, results = timed(serial if name == "serial" else concurrent, batch, params)
                times[name].append(seconds)
                outputs.setdefault(name, [x.token_ids for x in results])
                assert all(x.finish == "length" for x in results), [x.error for x in results if x.finish == "failed"][:3]
                print(f"round {r + 1} {name:10s} {seconds:7.2f} s")
        tokens = args.prompts * args.new_tokens
        rate = {k: tokens / statistics.median(v) for k, v in times.items()}
        same = sum(a == b for a, b in zip(outputs["serial"], outputs["concurrent"]))
        staged = os.listdir(staging["dir"]) if os.path.isdir(staging["dir"]) else []
        print(
            f"{args.prompts} prompts x {args.new_tokens} new tokens ({tokens} tokens), prompt lengths "
            f"{min(map(len, batch))}-{max(map(len, batch))}; median of {args.rounds} rounds"
        )
        print(f"serial (1 in flight):                {rate['serial']:8.1f} tokens/s")
        print(f"concurrent ({args.concurrency} in flight):          {rate['concurrent']:8.1f} tokens/s")
        print(f"identical outputs serial vs concurrent: {same}/{args.prompts}; files staged by the capture hook: {len(staged)}")
        print(f"generation_speedup={rate['concurrent'] / rate['serial']:.2f}")
        return 0
    except BaseException:
        if server is not None:
            print("server log tail:\n" + server.log_tail(3000), file=sys.stderr)
        raise
    finally:
        finish_run(server, shm_seen, tmp, shm, gens)


if __name__ == "__main__":
    sys.exit(main())
