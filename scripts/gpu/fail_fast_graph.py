"""On a GPU host: a build against a server whose prefill runs in a CUDA graph must stop in seconds, naming the cause.

The server is started by hand with SGLang's prefill CUDA graph left on and the hooks told to allow it
(``HS_CAPTURE_ALLOW_PREFILL_GRAPH=1``; as shipped they refuse to start, which check_server.py proves), so no
hook runs for a prefill. Writes ``OUT/fail_fast_graph.json`` and then ``OUT/fail_fast_graph.done``.

    python scripts/gpu/fail_fast_graph.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scripts.gpu import check_server as C  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--port", type=int, default=33000)
    args = p.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = C.build_model(Path("/tmp/hs-gpu-check-model"), "bfloat16")
    ns = argparse.Namespace(server_arg=[], device="cuda", dtype="bfloat16", python=sys.executable, concurrency=4, chunk=256)
    card = C.write_card(out / "graph.yaml", model, ns, args.port, Path("/dev/shm") / f"hs-gpu-check-{args.port}")
    source = C.write_source(out / "source.jsonl", 0)
    started = C.start_graph_servers(card, out, args.port, only=("allowed",))
    result, problems = C.judge_graph_servers(started, card, source, out)
    (out / "fail_fast_graph.json").write_text(json.dumps({"result": result, "problems": problems}, indent=1))
    (out / "fail_fast_graph.done").write_text(time.strftime("%H:%M:%S"))
    print("fail fast:", json.dumps(result), "PROBLEMS:" if problems else "ok", *problems, flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
