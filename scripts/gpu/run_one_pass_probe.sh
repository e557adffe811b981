#!/usr/bin/env bash
# On the GPU host (device tool): scripts/gpu/one_pass_probe.py against one release's bundle. Output in $OUT.
#   bash scripts/gpu/run_one_pass_probe.sh 0.5.16 [probe options]
set -uo pipefail
cd "$(dirname "$0")/../.."
VERSION="$1"; shift
OUT="${OUT:-/tmp/hs-one-pass-out}"; mkdir -p "$OUT"
WORK=/tmp/hs-one-pass; mkdir -p "$WORK"
eval "$(bash scripts/gpu/unpack_bundle.sh "$VERSION")"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# a Kimi-shaped DeepseekV3 with random weights (real MLA dims, MoE after one dense layer), so every layer changes the state
python3 -c "import sys; sys.path.insert(0, 'scripts/gpu'); import check_server; check_server.build_model(__import__('pathlib').Path('$WORK/model-random'), 'bfloat16')" || exit 2
python3 scripts/gpu/one_pass_probe.py --model "$WORK/model-random" --out "$WORK/probe" "$@"
rc=$?
cp "$WORK/probe/one_pass_probe.txt" "$OUT/" 2>/dev/null
grep -E "rror|Traceback|hs_one_pass|Capture cuda graph|cuda graph" "$WORK/probe/server.log" | tail -n 40 > "$OUT/server-tail.log"
tail -n 60 "$WORK/probe/server.log" >> "$OUT/server-tail.log"
exit $rc
