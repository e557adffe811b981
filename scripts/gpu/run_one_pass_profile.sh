#!/usr/bin/env bash
# On the GPU host (device tool): scripts/gpu/one_pass_profile.py against the regeneration benchmark's build server
# alone (scripts/gpu/regenerate_setup.py's Kimi-wide model and card, `hs-dataset serve`), py-spy from $PY_SPY if set
# (a py-spy binary carried in: the host has no network). Output in $OUT; the server stopped by pid at the end.
#   PY_SPY=.tools/py-spy bash scripts/gpu/run_one_pass_profile.sh 0.5.16 [--rounds 2]
# HS_REGEN_SERVER_ARGS: extra SGLang arguments for the card, as in run_regenerate.sh
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
python3 -m hs_dataset.cli.main serve --config "$CARD" --log "$WORK/server.log" > "$WORK/serve.out" 2>&1 &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null' EXIT
t0=$(date +%s)
until curl -sf "$URL/health" > /dev/null; do
  kill -0 $SERVE 2>/dev/null || { echo "the server exited"; tail -n 40 "$WORK/serve.out" "$WORK/server.log"; exit 2; }
  sleep 2
done
echo "server healthy after $(( $(date +%s) - t0 )) s"
SPY=(); [ -n "${PY_SPY:-}" ] && SPY=(--py-spy "$PY_SPY")
python3 scripts/gpu/one_pass_profile.py --server $URL --config "$CARD" --model-path "$WORK/model" --out "$OUT" "${SPY[@]}" "$@" 2>&1 \
  | grep --line-buffered -v "SyntaxWarning\|Configuration class for applying\|incorrect regex pattern" | tee "$OUT/live.txt"
rc=${PIPESTATUS[0]}
grep -E "hs_dataset|rror" "$WORK/server.log" | tail -n 30 > "$OUT/server-tail.log"
exit $rc
