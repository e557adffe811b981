#!/usr/bin/env bash
# On the GPU host (device tool): the flagship rehearsal (benchmarks/bench_flagship_gpu.py) on one SGLang release's
# bundle. Its working files stay in /tmp/hs-flagship (a warm host keeps them for the next phase); the report and
# log tails go to $OUT.   bash scripts/gpu/run_flagship.sh 0.5.16 --phase plain|hooks|both [more options]
set -uo pipefail
cd "$(dirname "$0")/../.."
VERSION="$1"; shift
OUT="${OUT:-/tmp/hs-flagship-out}"; mkdir -p "$OUT"
WORK=/tmp/hs-flagship
eval "$(bash scripts/gpu/unpack_bundle.sh "$VERSION")"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
df -h /tmp /dev/shm | tail -n 2
python3 benchmarks/bench_flagship_gpu.py --out "$WORK" "$@" 2>&1 \
  | grep --line-buffered -v "SyntaxWarning\|Configuration class for applying\|RoPE scaling factor\|Writing model shards\|Loading weights" | tee -a "$OUT/bench_flagship_gpu.txt"
rc=${PIPESTATUS[0]}
cp "$WORK/bench_flagship_gpu.json" "$OUT/" 2>/dev/null
for f in server-plain server-hooks build verify serve; do
  for g in "$WORK/$f.log" "$WORK/$f.out"; do [ -f "$g" ] && grep -E "hs_dataset|rror|Prefill batch|samples|verified|time" "$g" | tail -n 15 > "$OUT/$f-tail.log"; done
done
exit $rc
