#!/usr/bin/env bash
# First look at a GPU host with the offline bundle (docs/GPU.md): unpack, import sglang, start
# `hs-dataset serve` on the GPU check's model and send one prefill by hand. Writes its logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/hs-gpu-smoke}"; mkdir -p "$OUT"
t0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
eval "$(bash scripts/gpu/unpack_bundle.sh ${HS_SGLANG_VERSION:-})"; echo "unpacked in $(( $(date +%s) - t0 )) s"
python3 -c "import sglang, transformers, torch; print('sglang', sglang.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, torch.cuda.is_available())"
python3 -c "import sglang.srt.entrypoints.http_server, sglang.srt.models.deepseek_v2; print('server imports ok')" 2>&1 | tail -3
python3 - <<'PY'
import sys, time
sys.path.insert(0, ".")
from pathlib import Path
t = time.monotonic()
from scripts.gpu.check_server import build_model
build_model(Path("/tmp/hs-gpu-check-model"), "bfloat16")
print(f"model built in {time.monotonic() - t:.1f} s")
PY
python3 - <<'PY'
import argparse, json, os, sys, time, urllib.request
sys.path.insert(0, ".")
from pathlib import Path
from scripts.gpu import check_server as C
out = Path(os.environ.get("OUT", "/tmp/hs-gpu-smoke"))
args = argparse.Namespace(server_arg=["--disable-prefill-cuda-graph"], device="cuda", dtype="bfloat16", python=sys.executable,
                          concurrency=8, chunk=256)
staging = Path("/dev/shm/hs-smoke-stage")
card = C.write_card(out / "smoke.yaml", Path("/tmp/hs-gpu-check-model"), args, 31000, staging)
t = time.monotonic()
try:
    server = C.serve(card, out / "server.log", "http://127.0.0.1:31000", 420)
except SystemExit as e:
    print("SERVER FAILED:", e); print(open(out / "server.log").read()[-6000:]); sys.exit(1)
print(f"server healthy in {time.monotonic() - t:.1f} s")
try:
    for rid, n in (("hs-smoke-1-40", 40), ("hs-smoke-2-700", 700)):
        body = json.dumps({"rid": rid, "input_ids": list(range(100, 100 + n)), "sampling_params": {"max_new_tokens": 1, "temperature": 0}}).encode()
        t = time.monotonic()
        r = urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:31000/generate", data=body, headers={"Content-Type": "application/json"}), timeout=120)
        print(rid, "answered in", round(time.monotonic() - t, 3), "s", r.read()[:120])
        time.sleep(1.0)
        print("staging:", sorted(os.listdir(staging)))
finally:
    C.stop(server)
    log = open(out / "server.log").read()
    print("server log lines with 'hs_dataset' or 'cuda graph':")
    for line in log.splitlines():
        if "hs_dataset" in line or "cuda graph" in line.lower() or "Error" in line:
            print("  ", line[:300])
PY
echo "smoke done in $(( $(date +%s) - t0 )) s"
