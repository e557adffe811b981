#!/usr/bin/env bash
# On the GPU host (device tool): unpack the bundle, then benchmarks/bench_server_gpu.py writing straight into $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/hs-gpu-bench-out}"; mkdir -p "$OUT"
eval "$(bash scripts/gpu/unpack_bundle.sh ${HS_SGLANG_VERSION:-})"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 benchmarks/bench_server_gpu.py --out "$OUT" "$@" 2>&1 \
  | grep --line-buffered -v "SyntaxWarning\|Configuration class for applying\|RoPE scaling factor\|Writing model shards\|Loading weights\|Ignore import error" | tee "$OUT/bench_server_gpu.txt"
