#!/usr/bin/env bash
# On the GPU host (device tool): unpack the bundle; the prefill-graph fail-fast check in the background while the
# benchmark's servers start; then benchmarks/bench_server_gpu.py (it waits for the check before measuring).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/hs-gpu-bench-out}"; mkdir -p "$OUT"
WORK=/tmp/hs-gpu-bench
mkdir -p "$WORK"
eval "$(bash scripts/gpu/unpack_bundle.sh ${HS_SGLANG_VERSION:-})"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 scripts/gpu/fail_fast_graph.py --out "$WORK/ff" > "$WORK/ff.log" 2>&1 &
python3 benchmarks/bench_server_gpu.py --out "$WORK" --wait-for "$WORK/ff/fail_fast_graph.done" "$@" 2>&1 \
  | grep -v "SyntaxWarning\|Configuration class for applying\|RoPE scaling factor\|Writing model shards\|Loading weights" | tee "$OUT/bench_server_gpu.txt"
rc=${PIPESTATUS[0]}
wait
cp "$WORK/bench_server_gpu.json" "$WORK/ff/fail_fast_graph.json" "$OUT/" 2>/dev/null
grep -v "SyntaxWarning\|Configuration class" "$WORK/ff.log" | tail -n 20 > "$OUT/ff-tail.log"
tail -n 8 "$WORK/ff/build-graph.log" > "$OUT/build-graph-tail.log" 2>/dev/null
for f in "$WORK"/stress-hooks.log "$WORK"/kimi-hooks.log; do [ -f "$f" ] && grep -E "hs_dataset|rror" "$f" | tail -n 12 > "$OUT/$(basename "$f" .log)-tail.log"; done
exit $rc
