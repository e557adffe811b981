#!/usr/bin/env bash
# On the GPU host (device tool): benchmarks/bench_regenerate.py against a GPU SGLang server that `hs-dataset serve`
# started for a Kimi-wide model (scripts/gpu/regenerate_setup.py), from one release's bundle. Output in $OUT.
#   bash scripts/gpu/run_regenerate.sh 0.5.16 [bench options: --conversations 256 --mean-tokens 600 --rounds 3]
# HS_REGEN_SERVER_ARGS: extra SGLang arguments for the card, e.g. HS_REGEN_SERVER_ARGS="--enable-mixed-chunk"
set -uo pipefail
cd "$(dirname "$0")/../.."
VERSION="$1"; shift
OUT="${OUT:-/tmp/hs-regenerate-out}"; mkdir -p "$OUT"
WORK=/tmp/hs-regenerate; mkdir -p "$WORK"
eval "$(bash scripts/gpu/unpack_bundle.sh "$VERSION")"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
SETUP_ARGS=(); for a in ${HS_REGEN_SERVER_ARGS:-}; do SETUP_ARGS+=("--server-arg=$a"); done
CARD="$(python3 scripts/gpu/regenerate_setup.py --out "$WORK" "${SETUP_ARGS[@]}")" || exit 2
python3 -m hs_dataset.cli.main serve --config "$CARD" --log "$WORK/server.log" > "$WORK/serve.out" 2>&1 &
SERVE=$!
t0=$(date +%s)
until curl -sf http://127.0.0.1:30000/health > /dev/null; do
  kill -0 $SERVE 2>/dev/null || { echo "serve exited"; tail -n 40 "$WORK/serve.out" "$WORK/server.log"; exit 2; }
  sleep 2
done
echo "server healthy after $(( $(date +%s) - t0 )) s"
python3 benchmarks/bench_regenerate.py --server http://127.0.0.1:30000 --model-path "$WORK/model" --config "$CARD" \
  --results "$OUT/bench_regenerate_gpu.txt" "$@" 2>&1 | grep --line-buffered -v "SyntaxWarning\|Configuration class for applying" | tee "$OUT/live.txt"
rc=${PIPESTATUS[0]}
grep -E "hs_dataset|rror|Decode batch" "$WORK/server.log" | tail -n 20 > "$OUT/server-tail.log"
kill $SERVE; wait $SERVE 2>/dev/null
exit $rc
