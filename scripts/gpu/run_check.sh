#!/usr/bin/env bash
# On the GPU host (device tool): unpack the bundle, then the GPU check (scripts/gpu/check_server.py). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/hs-gpu-check-out}"; mkdir -p "$OUT"
WORK=/tmp/hs-gpu-check  # the dataset and logs stay here; the few files worth reading go to $OUT (at most 8 come back)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
eval "$(bash scripts/gpu/unpack_bundle.sh ${HS_SGLANG_VERSION:-})"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 scripts/gpu/check_server.py --out "$WORK" "$@" 2>&1 | grep -v "SyntaxWarning\|Configuration class for applying\|RoPE scaling factor" | tee "$OUT/check.txt"
rc=${PIPESTATUS[0]}
cp "$WORK/check_server.json" "$OUT/" 2>/dev/null
grep -E "hs_dataset|Error|rror:|cuda graph" "$WORK/server.log" | tail -n 60 > "$OUT/server-tail.log" 2>/dev/null
tail -n 30 "$WORK/build.log" > "$OUT/build-tail.log" 2>/dev/null
for f in "$WORK"/server-graph-*.log "$WORK"/build-graph.log; do [ -f "$f" ] && grep -E "hs_dataset|Error|rror:|cuda graph|prefill" "$f" | tail -n 20 > "$OUT/$(basename "$f" .log)-tail.log"; done
exit $rc
