#!/usr/bin/env bash
# On the GPU host (device tool): scripts/gpu/one_pass_profile.py against the regeneration benchmark's build server
# alone (scripts/gpu/regenerate_setup.py's Kimi-wide model and card, `hs-dataset serve`), py-spy from $PY_SPY if set
# (a py-spy binary carried in: the host has no network). Output in $OUT; the server stopped by pid at the end.
#   PY_SPY=.tools/py-spy bash scripts/gpu/run_one_pass_profile.sh 0.5.16 [--rounds 2]
# HS_REGEN_SERVER_ARGS: extra SGLang arguments for the card, as in run_regenerate.sh
# HS_PROFILE_B_ENV: "KEY=VALUE ...": after the first server's rounds, a second server with these variables set, and
# its one-pass rounds (an A/B of a server setting on the same warm machine), e.g.
#   HS_PROFILE_B_ENV="HS_CAPTURE_SWITCH_INTERVAL_S=0.0005"
set -uo pipefail
cd "$(dirname "$0")/../.."
VERSION="$1"; shift
OUT="${OUT:-/tmp/hs-one-pass-profile-out}"; mkdir -p "$OUT"
WORK=/tmp/hs-one-pass-profile; mkdir -p "$WORK"
eval "$(bash scripts/gpu/unpack_bundle.sh "$VERSION")"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
SETUP_ARGS=(); for a in ${HS_REGEN_SERVER_ARGS:-}; do SETUP_ARGS+=("--server-arg=$a"); done
CARD="$(python3 scripts/gpu/regenerate_setup.py --out "$WORK" --mem-fraction 0.85 "${SETUP_ARGS[@]}")" || exit 2
URL=http://127.0.0.1:30000
curl -sf "$URL/health" > /dev/null && { echo "something already answers at $URL: stop it first (by pid)"; exit 2; }
SERVE=""
trap '[ -n "$SERVE" ] && kill $SERVE 2>/dev/null; wait 2>/dev/null' EXIT
start_server() {  # LOG [KEY=VALUE...]: `hs-dataset serve` with those variables, until healthy
  local log=$1; shift
  env "$@" python3 -m hs_dataset.cli.main serve --config "$CARD" --log "$log" > "$log.out" 2>&1 &
  SERVE=$!
  local t0; t0=$(date +%s)
  until curl -sf "$URL/health" > /dev/null; do
    kill -0 $SERVE 2>/dev/null || { echo "the server exited"; tail -n 40 "$log.out" "$log"; exit 2; }
    sleep 2
  done
  echo "server ($*) healthy after $(( $(date +%s) - t0 )) s"
}
profile() {  # OUTDIR [profile options]
  local out=$1; shift
  python3 scripts/gpu/one_pass_profile.py --server $URL --config "$CARD" --model-path "$WORK/model" --out "$out" "$@" 2>&1 \
    | grep --line-buffered -v "SyntaxWarning\|Configuration class for applying\|incorrect regex pattern" | tee -a "$OUT/live.txt"
  return "${PIPESTATUS[0]}"
}
SPY=(); [ -n "${PY_SPY:-}" ] && SPY=(--py-spy "$PY_SPY")
start_server "$WORK/server.log"
profile "$OUT" "${SPY[@]}" "$@"; rc=$?
grep -E "hs_dataset|rror" "$WORK/server.log" | tail -n 30 > "$OUT/server-tail.log"
grep -E "Decode batch" "$WORK/server.log" > "$OUT/decode-log.txt"  # SGLang's own running-request count and rate, by time
if [ $rc -eq 0 ] && [ -n "${HS_PROFILE_B_ENV:-}" ]; then
  kill $SERVE; wait $SERVE 2>/dev/null; SERVE=""
  until ! curl -sf "$URL/health" > /dev/null; do sleep 1; done
  for _ in $(seq 90); do [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && break; sleep 1; done
  read -r -a B_ENV <<< "$HS_PROFILE_B_ENV"
  echo "---- B: ${B_ENV[*]}" | tee -a "$OUT/live.txt"
  start_server "$WORK/server-b.log" "${B_ENV[@]}"
  mkdir -p "$OUT/b"; profile "$OUT/b" --only-one-pass --no-reference "$@"; rc=$?
  grep -E "hs_dataset|rror" "$WORK/server-b.log" | tail -n 30 > "$OUT/server-b-tail.log"
  grep -E "Decode batch" "$WORK/server-b.log" > "$OUT/b/decode-log.txt"
fi
exit $rc
