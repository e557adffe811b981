"""On a GPU host: the Kimi-wide model and the card ``run_regenerate.sh`` serves for ``benchmarks/bench_regenerate.py``.

The model is Kimi-K2.5's text layer shape (hidden 7168, its MLA dims, MoE with a shared expert) at a few layers,
with the demo tokenizer's vocabulary (generated ids must decode) and weights filled by ``--load-format dummy``:
decoding speed, not the answers' words, is what the benchmark measures. CUDA graphs stay on for decoding, as
``hs-dataset serve`` plans them; the card stores nf4 (the states of ~4 builds a round must fit the host's disk).
The prefix cache stays on (``sglang.radix_cache``), as on the plain server beside it, and both servers export their
prompt-token counters (``--enable-metrics``). Both run on the one GPU at once, so the KV pool is capped
(``--max-total-tokens``, default 800,000: 7.4 GB at 8 layers of Kimi's MLA, several times what 128 conversations
in flight hold) and the build's server gets ``--mem-fraction`` (default 0.5). SGLang charges that fraction
against the memory free when a server starts (``kv_cache_configurator._profile_available_bytes``), so the plain
server, started second, is given its own, larger one (``run_regenerate.sh``).

    python scripts/gpu/regenerate_setup.py --out DIR [--layers 8] [--experts 8] [--max-running 128] [--mem-fraction 0.5]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_flagship_gpu import write_model  # noqa: E402


def write_card(path: Path, model: Path, args: argparse.Namespace) -> Path:
    import yaml

    layers = args.layers
    card = {
        "name": "regenerate-gpu",
        "description": "benchmarks/bench_regenerate.py on a GPU: a Kimi-wide model (scripts/gpu/regenerate_setup.py)",
        "model": {"path": str(model)},
        "layers": {"aux": [2, layers // 2, layers - 2]},
        "dtype": "bfloat16",
        "max_length": args.max_length,
        "source": {"path": "builtin:conversations"},
        "backend": {
            "name": "sglang",
            "urls": [f"http://127.0.0.1:{args.port}"],
            "concurrency": 32,
            "request_timeout_s": 900,
            "dump_timeout_s": 300,
        },
        "shards": {"bytes": 1 << 30, "storage": "nf4"},
        "sglang": {
            "python": sys.executable,
            "device": "cuda",
            "port": args.port,
            "startup_timeout_s": 900,
            "radix_cache": True,
            "chunked_prefill_size": 8192,
            "args": [
                "--attention-backend",
                "triton",
                "--sampling-backend",
                "pytorch",
                "--grammar-backend",
                "none",
                "--mem-fraction-static",
                str(args.mem_fraction),
                "--load-format",
                "dummy",
                "--max-total-tokens",
                str(args.max_total_tokens),
                "--max-running-requests",
                str(args.max_running),
                "--cuda-graph-max-bs",
                str(args.max_running),
                "--enable-metrics",
                *args.server_arg,
            ],
            "staging": {"dir": "/dev/shm/hs-regenerate-stage", "max_bytes": 16 << 30, "pinned_pool_bytes": 4 << 30},
        },
    }
    path.write_text(yaml.safe_dump(card, sort_keys=False))
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--max-running", type=int, default=128)
    p.add_argument("--max-length", type=int, default=16384)
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--mem-fraction", type=float, default=0.5, help="--mem-fraction-static of the build's server (started first)")
    p.add_argument("--max-total-tokens", type=int, default=800_000, help="each server's KV pool, in tokens")
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra SGLang argument for the card (repeatable), e.g. --server-arg=--enable-mixed-chunk",
    )
    args = p.parse_args()
    from hs_dataset.demo.tiny_model import TINY_DEEPSEEK_CONFIG

    model = write_model(args.out / "model", args.experts, 2)
    config = json.loads((model / "config.json").read_text())
    config.update(num_hidden_layers=args.layers, vocab_size=TINY_DEEPSEEK_CONFIG["vocab_size"])
    (model / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    card = write_card(args.out / "card.yaml", model, args)
    print(card)
    return 0


if __name__ == "__main__":
    sys.exit(main())
