#!/usr/bin/env bash
# On the GPU host (device tool): benchmarks/bench_regenerate.py with both of its servers on the one GPU
# (scripts/gpu/regenerate_setup.py writes the Kimi-wide model and the card): the build's, started by
# `hs-dataset serve` (prefix cache on), on port 30000, and the plain SGLang server a user runs for generation alone
# (benchmarks/_plain_server.py, the same card's model and sizing, no capture) on 30001. One release's bundle; output in
# $OUT; both servers stopped by pid at the end.
# The two start one after the other: SGLang sizes a server's memory from what is free when it starts, so two started
# at once each count the other's allocations (2026-12-06: the second refused to start). The plain server starts
# once the build's has allocated its KV pool ("Memory pool end" in its log), with --mem-fraction-static
# $PLAIN_FRACTION (default 0.8) of the memory then free; both KV pools are capped by the card's --max-total-tokens.
#   bash scripts/gpu/run_regenerate.sh 0.5.16 [bench options: --conversations 256 --mean-tokens 500 --rounds 3]
# HS_REGEN_SERVER_ARGS: extra SGLang arguments for the card (both servers), e.g. HS_REGEN_SERVER_ARGS="--enable-mixed-chunk"
set -uo pipefail
cd "$(dirname "$0")/../.."
VERSION="$1"; shift
OUT="${OUT:-/tmp/hs-regenerate-out}"; mkdir -p "$OUT"
WORK=/tmp/hs-regenerate; mkdir -p "$WORK"
eval "$(bash scripts/gpu/unpack_bundle.sh "$VERSION")"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
SETUP_ARGS=(); for a in ${HS_REGEN_SERVER_ARGS:-}; do SETUP_ARGS+=("--server-arg=$a"); done
CARD="$(python3 scripts/gpu/regenerate_setup.py --out "$WORK" "${SETUP_ARGS[@]}")" || exit 2
BUILD_URL=http://127.0.0.1:30000 PLAIN_URL=http://127.0.0.1:30001
for url in $BUILD_URL $PLAIN_URL; do
  curl -sf "$url/health" > /dev/null && { echo "something already answers at $url: stop it first (by pid)"; exit 2; }
done
python3 -m hs_dataset.cli.main serve --config "$CARD" --log "$WORK/server.log" > "$WORK/serve.out" 2>&1 &
SERVE=$!
PLAIN=""
stop_servers() {
  kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null
  [ -n "$PLAIN" ] || return 0
  kill -- -$PLAIN 2>/dev/null || kill $PLAIN 2>/dev/null  # (before its setsid: the pid alone)
  wait $PLAIN 2>/dev/null
}
trap stop_servers EXIT
t0=$(date +%s)
wait_healthy() {  # URL PID LOG...: until it answers, or say why not and stop (the trap stops both servers)
  local url=$1 pid=$2; shift 2
  until curl -sf "$url/health" > /dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "the server for $url exited"; tail -n 40 "$@"; exit 2; }
    sleep 2
  done
}
until grep -q "Memory pool end" "$WORK/server.log" 2>/dev/null || curl -sf "$BUILD_URL/health" > /dev/null; do
  kill -0 $SERVE 2>/dev/null || { echo "the build's server exited"; tail -n 40 "$WORK/serve.out" "$WORK/server.log"; exit 2; }
  sleep 2
done
echo "build's server: $(grep -m1 "KV Cache is allocated" "$WORK/server.log" | sed 's/.*KV Cache/KV Cache/') after $(( $(date +%s) - t0 )) s; starting the plain server"
python3 benchmarks/_plain_server.py --config "$CARD" --port 30001 --mem-fraction "${PLAIN_FRACTION:-0.8}" > "$WORK/plain.log" 2>&1 &
PLAIN=$!  # _plain_server.py makes itself a process-group leader and becomes the server: `kill -- -$PLAIN` ends its children too
wait_healthy $BUILD_URL $SERVE "$WORK/serve.out" "$WORK/server.log"
wait_healthy $PLAIN_URL $PLAIN "$WORK/plain.log"
echo "plain server: $(grep -m1 "KV Cache is allocated" "$WORK/plain.log" | sed 's/.*KV Cache/KV Cache/')"
echo "both servers healthy after $(( $(date +%s) - t0 )) s"
python3 benchmarks/bench_regenerate.py --server $BUILD_URL --plain-server $PLAIN_URL --model-path "$WORK/model" --config "$CARD" \
  --server-log "$WORK/server.log" --plain-log "$WORK/plain.log" --results "$OUT/bench_regenerate_gpu.txt" "$@" 2>&1 \
  | grep --line-buffered -v "SyntaxWarning\|Configuration class for applying" | tee "$OUT/live.txt"
rc=${PIPESTATUS[0]}
grep -E "hs_dataset|rror|Decode batch" "$WORK/server.log" | tail -n 20 > "$OUT/server-tail.log"
grep -E "rror|Decode batch" "$WORK/plain.log" | tail -n 20 > "$OUT/plain-tail.log"
exit $rc
