#!/usr/bin/env bash
# On the GPU host (device tool): one-pass capture through `hs-dataset serve` (scripts/gpu/one_pass_check.py) against one
# release's bundle. The result table goes to $OUT/one_pass_check.txt, the server log's hs_dataset lines beside it.
#   bash scripts/gpu/run_one_pass_check.sh 0.5.16 [check options]
set -uo pipefail
cd "$(dirname "$0")/../.."
VERSION="$1"; shift
OUT="${OUT:-/tmp/hs-one-pass-check-out}"; mkdir -p "$OUT"
WORK=/tmp/hs-one-pass-check; mkdir -p "$WORK"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
eval "$(bash scripts/gpu/unpack_bundle.sh "$VERSION")"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 scripts/gpu/one_pass_check.py --out "$WORK" "$@" 2>&1 | grep -v "SyntaxWarning\|Configuration class for applying\|RoPE scaling factor"
rc=${PIPESTATUS[0]}
cp "$WORK/one_pass_check.txt" "$OUT/" 2>/dev/null
grep -E "hs_dataset|rror|Traceback|Capture .*graph|decode_capture" "$WORK/server.log" | tail -n 60 > "$OUT/server-tail.log" 2>/dev/null
tail -n 40 "$WORK/server.log" >> "$OUT/server-tail.log" 2>/dev/null
exit $rc
