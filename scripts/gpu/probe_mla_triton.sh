#!/usr/bin/env bash
# On the GPU host (device tool): does a plain SGLang server (no hs_dataset hooks) of one release serve the
# Kimi-shaped DeepseekV3 of scripts/gpu/check_server.py (MLA) on the triton attention backend, with decode CUDA
# graphs on and with them off (--disable-cuda-graph)? Each server gets a /generate of 16 new tokens when healthy.
# It first imports sglang.srt.models.deepseek_v2 as SGLang's model registry does at start (a failure there makes SGLang
# serve the model through its Transformers fallback: docs/SGLANG.md, "SGLang 0.5.15 on a GPU"), and greps each server
# log for the registry's "Ignore import error" and the fallback's warning. Logs in $OUT: <release>-<case>.log.
#   bash scripts/gpu/probe_mla_triton.sh 0.5.15
set -uo pipefail
cd "$(dirname "$0")/../.."
VERSION="$1"; shift
OUT="${OUT:-/tmp/hs-mla-probe-$VERSION}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
eval "$(bash scripts/gpu/unpack_bundle.sh "$VERSION")"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"
echo "== import sglang.srt.models.deepseek_v2 (what SGLang's model registry does at start; a failure is logged and skipped)"
python3 - <<'PY' 2>&1 | tail -n 25
import traceback
try:
    import sglang.srt.models.deepseek_v2 as m
    print("deepseek_v2 imports:", [c.__name__ for c in m.EntryClass])
except Exception:
    traceback.print_exc()
PY
MODEL=/tmp/hs-mla-probe-model
python3 - "$MODEL" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "scripts/gpu")
import check_server
check_server.build_model(Path(sys.argv[1]), "bfloat16")
PY
PORT=31250
BASE=(--model-path "$MODEL" --host 127.0.0.1 --port "$PORT" --dtype bfloat16 --skip-tokenizer-init
      --attention-backend triton --sampling-backend pytorch --grammar-backend none --mem-fraction-static 0.3
      --disable-radix-cache --chunked-prefill-size 256)
python3 -c "import sglang.srt.server_args as s, inspect; import sys; sys.exit(0 if 'disable_prefill_cuda_graph' in inspect.getsource(s) else 1)" \
  && BASE+=(--disable-prefill-cuda-graph)

serve_case() {  # name, extra args...
  local name="$1"; shift
  local log="$OUT/$VERSION-$name.log"
  echo "== $name: ${BASE[*]} $*"
  setsid python3 -m sglang.launch_server "${BASE[@]}" "$@" >"$log" 2>&1 &  # its own process group: stopped whole below
  local pid=$! t0=$SECONDS state=died
  while kill -0 "$pid" 2>/dev/null; do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then state=healthy; break; fi
    [ $((SECONDS - t0)) -gt 240 ] && { state=timeout; break; }
    sleep 2
  done
  echo "   $name: $state after $((SECONDS - t0)) s"
  if [ "$state" = healthy ]; then
    curl -s -m 60 "http://127.0.0.1:$PORT/generate" -H 'Content-Type: application/json' \
      -d '{"input_ids": [10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25], "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": true}}' \
      | python3 -c "import json,sys; r=json.load(sys.stdin); print('   generate:', len(r.get('output_ids') or []), 'new tokens', r.get('meta_info',{}).get('finish_reason'))" \
      || echo "   generate: failed"
  fi
  kill -- "-$pid" 2>/dev/null; sleep 5; kill -9 -- "-$pid" 2>/dev/null; sleep 2
  grep -n -m1 -A60 "Traceback" "$log" | grep -v "^\s*$" | head -80
  grep -E "shape mismatch|RuntimeError|Error|Ignore import error when loading sglang.srt.models.(deepseek|kimi)|falling back to Transformers" "$log" | head -8
}

serve_case graphs-on
serve_case eager --disable-cuda-graph
ls -la "$OUT"
