#!/usr/bin/env bash
# Install the two trainers' OWN data readers into a test venv, so tests/interop/test_exports.py
# can load our exports with them:
#   speculators==0.9.0 (+ hs-connectors==0.9.0, + openai): speculators.train.data
#       (ArrowDataset, CollateFn) and speculators.train.dataloader import it.
#   specforge==0.2.0: specforge.runtime.data_plane.offline_reader (OfflineManifestReader),
#       feature_store, feature_dataloader, algorithms.eagle3.data, data.utils.
#
# Both are installed with --no-deps: their declared requirements would replace this
# project's stack (speculators pins datasets<=5.1 and transformers<=5.19; specforge pins
# torch==2.11.0, transformers==5.8.1 and sglang==0.5.14, i.e. a CUDA torch). The
# reader modules above import only torch, safetensors, datasets, numpy (already here)
# and openai (speculators.train.data imports it at module level), which is installed
# from PyPI under constraints.txt. torch is never touched.
#
# Usage: bash scripts/make_interop_env.sh [VENV]   (default .venv). Idempotent: exits
# at once when the pinned versions are installed and the reader modules import.
set -euo pipefail

VENV="${1:-.venv}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$VENV/bin/python"
CONSTRAINTS="$ROOT/constraints.txt"

SPECULATORS="speculators==0.9.0"
HS_CONNECTORS="hs-connectors==0.9.0"
SPECFORGE="specforge==0.2.0"
OPENAI="openai==3.57.0"

if [ ! -x "$PY" ]; then
    echo "make_interop_env: $PY not found; create the venv first (make install)" >&2
    exit 1
fi

check() {
    "$PY" - <<'EOF'
import importlib.metadata as md
import sys
want = {"speculators": "0.9.0", "hs-connectors": "0.9.0", "specforge": "0.2.0"}
for name, version in want.items():
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        sys.exit(1)
    if have != version:
        sys.exit(1)
try:
    import openai  # noqa: F401
    import pydantic_settings, httpx, loguru  # noqa: F401,E401  (speculators.train.cli)
except ImportError:
    sys.exit(1)
sys.exit(0)
EOF
}

if check; then
    echo "make_interop_env: speculators 0.9.0 and specforge 0.2.0 already installed in $VENV"
    exit 0
fi

start=$(date +%s)
# Keep whatever torch the venv has (the local CPU wheel): pin it explicitly, and pass
# constraints.txt so no other package of the stack moves.
TORCH_VERSION="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')"
echo "make_interop_env: installing $SPECULATORS $HS_CONNECTORS $SPECFORGE (--no-deps) and $OPENAI into $VENV;"
echo "  pip's resolver will list their unmet declared requirements (vLLM/SGLang/CUDA stack): expected, not needed by the readers"
"$PY" -m pip install -q --no-deps "$SPECULATORS" "$HS_CONNECTORS" "$SPECFORGE"
"$PY" -m pip install -q -c "$CONSTRAINTS" "torch==$TORCH_VERSION" "$OPENAI"
# speculators' trainer (speculators.train.cli, used by `hs-dataset train speculators` and its test) also imports these
"$PY" -m pip install -q -c "$CONSTRAINTS" "torch==$TORCH_VERSION" pydantic-settings httpx loguru

if ! check; then
    echo "make_interop_env: install finished but the pinned versions are not importable" >&2
    exit 1
fi
"$PY" -c 'import speculators.train.data, specforge.runtime.data_plane.offline_reader' >/dev/null
echo "make_interop_env: installed $SPECULATORS $HS_CONNECTORS $SPECFORGE $OPENAI into $VENV in $(( $(date +%s) - start )) s"
