#!/usr/bin/env bash
# On the GPU host (device tool): the GPU check of one SGLang release from its bundle (.gpu-bundle/sglang-VERSION-...),
# on the Kimi-K2.5-class remote-code snapshot, then on the Kimi-shaped DeepseekV3 (fail-fast servers included unless
# --no-fail-fast). Logs and results in $OUT (at most 8 files come back).
#   bash scripts/gpu/run_release_check.sh 0.5.16 [--no-fail-fast]
set -uo pipefail
cd "$(dirname "$0")/../.."
VERSION="$1"; shift
OUT="${OUT:-/tmp/hs-gpu-release-$VERSION}"; mkdir -p "$OUT"
WORK="/tmp/hs-gpu-release-$VERSION"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
eval "$(bash scripts/gpu/unpack_bundle.sh "$VERSION")"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -c "import sglang, transformers, torch; print('sglang', sglang.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
noise="SyntaxWarning\|Configuration class for applying\|RoPE scaling factor\|Writing model shards\|Loading weights"
python3 scripts/gpu/check_server.py --out "$WORK/kimi" --model kimi --no-fail-fast --port 31100 2>&1 | grep --line-buffered -v "$noise" | tee "$OUT/kimi-$VERSION.txt"
rc_kimi=${PIPESTATUS[0]}
python3 scripts/gpu/check_server.py --out "$WORK/deepseek" "$@" 2>&1 | grep --line-buffered -v "$noise" | tee "$OUT/check-$VERSION.txt"
rc=${PIPESTATUS[0]}
cp "$WORK/deepseek/check_server.json" "$OUT/check-$VERSION.json" 2>/dev/null
cp "$WORK/kimi/check_server.json" "$OUT/kimi-$VERSION.json" 2>/dev/null
for d in deepseek kimi; do
  { grep -E "hs_dataset|Error|rror:|cuda graph" "$WORK/$d/server.log" | tail -n 30; tail -n 12 "$WORK/$d/build.log"
    for g in "$WORK/$d"/server-graph-*.log; do [ -f "$g" ] && { echo "== $g"; tail -n 40 "$g"; }; done
  } > "$OUT/$d-$VERSION-tail.log" 2>/dev/null
done
echo "release $VERSION: deepseek check exit $rc, kimi check exit $rc_kimi"
[ "$rc" -eq 0 ] && [ "$rc_kimi" -eq 0 ]
