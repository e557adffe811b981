"""The plain SGLang server the regeneration benchmark measures against: what a user runs for generation alone.

From the same card as the capture server ``hs-dataset serve`` starts: the same model, dtype, device, tensor
parallelism, chunked prefill and card arguments (the sizing flags, ``--skip-tokenizer-init`` included: both
servers are sent ids), and nothing of capture: ``python -m sglang.launch_server`` with the prefix cache on, CUDA
graphs as SGLang sets them (prefill graphs included), no capture hooks, no staging, no ``HS_*`` variables, plus
``--enable-metrics`` so that its prompt-token counters can be read (``_server_metrics``). The one exception: a CPU
server of a DeepSeek model keeps the CPU MLA hook, without which SGLang cannot run that model on a CPU.

    python benchmarks/_plain_server.py --config CARD --port 30001 [--mem-fraction F]   # replaces itself with the server

``--mem-fraction`` replaces the card's ``--mem-fraction-static``: SGLang charges it against the memory free when the
server starts, so a second server on one GPU needs a larger one for the same KV pool (``run_regenerate.sh``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from hs_dataset.capture.serve.plan import CPU_MLA_FACTORY, ServerPlan

__all__ = ["plain_argv", "plain_env", "plain_plan", "with_mem_fraction"]

METRICS_FLAG = "--enable-metrics"


def _kept_hooks(argv: list[str]) -> list[dict[str, Any]]:
    """The hook specs of the capture plan a plain server still needs (the CPU MLA handler only)."""
    if "--forward-hooks" not in argv:
        return []
    specs = json.loads(argv[argv.index("--forward-hooks") + 1])
    return [s for s in specs if s.get("hook_factory") == CPU_MLA_FACTORY]


def plain_argv(card: Any, plan: ServerPlan, port: int) -> list[str]:
    """``-m sglang.launch_server`` with the card's sizing and no capture (see the module)."""
    sg = card.sglang
    argv = ["-m", "sglang.launch_server", "--model-path", plan.model_path, "--host", plan.host, "--port", str(port)]
    argv += ["--dtype", card.dtype, "--skip-tokenizer-init"]
    if sg.tp != 1:
        argv += ["--tp-size", str(sg.tp)]
    if sg.device == "cpu":
        argv += ["--device", "cpu", "--disable-cuda-graph"]
    if sg.chunked_prefill_size is not None:
        argv += ["--chunked-prefill-size", str(sg.chunked_prefill_size)]
    argv += [str(a) for a in sg.args]
    if card.model.trust_remote_code and "--trust-remote-code" not in argv:
        argv += ["--trust-remote-code"]
    if METRICS_FLAG not in argv:
        argv += [METRICS_FLAG]
    hooks = _kept_hooks(plan.argv)
    if hooks:
        argv += ["--forward-hooks", json.dumps(hooks, separators=(",", ":"))]
    return argv


def with_mem_fraction(argv: list[str], fraction: float) -> list[str]:
    """``argv`` with its ``--mem-fraction-static`` set to ``fraction`` (added where it had none)."""
    flag = "--mem-fraction-static"
    if flag not in argv:
        return [*argv, flag, str(fraction)]
    i = argv.index(flag)
    return [*argv[: i + 1], str(fraction), *argv[i + 2 :]]


def plain_env(plan: ServerPlan) -> dict[str, str]:
    """The capture plan's environment less its ``HS_*`` settings (the CPU engine and the support path stay)."""
    return {k: v for k, v in plan.env.items() if not k.startswith("HS_")}


def plain_plan(card: Any, plan: ServerPlan, port: int, staging_dir: str) -> ServerPlan:
    """The capture plan turned into the plain server's (``staging_dir``: an unused private dir ``launch`` insists on)."""
    return dataclasses.replace(
        plan,
        argv=plain_argv(card, plan, port),
        env=plain_env(plan),
        url=f"http://{plan.host}:{port}",
        port=port,
        staging_dir=staging_dir,
        hook_config={},
        notes=["plain SGLang for generation alone: prefix cache on, no capture"],
    )


def main() -> int:
    from hs_dataset.capture.serve import plan_server
    from hs_dataset.config import load_card

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the card the capture server was started from")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mem-fraction", type=float, default=None, help="instead of the card's --mem-fraction-static")
    args = ap.parse_args()
    card = load_card(args.config)
    plan = plain_plan(card, plan_server(card), args.port, staging_dir="")
    if args.mem_fraction is not None:
        plan = dataclasses.replace(plan, argv=with_mem_fraction(plan.argv, args.mem_fraction))
    print(f"plain server: {plan.command_line()}", file=sys.stderr, flush=True)
    os.setsid()  # its own process group: the caller stops it and its children with `kill -- -PID`
    os.execve(plan.python, [plan.python, *plan.argv], {**os.environ, **plan.env})


if __name__ == "__main__":
    sys.exit(main())
