#!/usr/bin/env bash
# On the GPU host (device tool): unpack the bundle, then the GPU check (scripts/gpu/check_server.py). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/hs-gpu-check}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
eval "$(bash scripts/gpu/unpack_bundle.sh)"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 scripts/gpu/check_server.py --out "$OUT/check" "$@" 2>&1 | grep -v "SyntaxWarning\|Configuration class for applying\|RoPE scaling factor" | tee "$OUT/check.txt"
rc=${PIPESTATUS[0]}
cp "$OUT/check/check_server.json" "$OUT/" 2>/dev/null
tail -n 40 "$OUT/check/server.log" > "$OUT/server-tail.log" 2>/dev/null
for f in "$OUT"/check/server-graph-*.log; do [ -f "$f" ] && grep -E "hs_dataset|Error|cuda graph" "$f" | tail -n 15 > "$OUT/$(basename "$f" .log)-tail.log"; done
exit $rc
