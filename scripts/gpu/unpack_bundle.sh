#!/usr/bin/env bash
# On the GPU host: unpack the bundle built by build_bundle.sh into /tmp/hs-sglang-site and print the
# PYTHONPATH to export (source it: `eval "$(bash scripts/gpu/unpack_bundle.sh)"`).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TAR="$(ls "$REPO"/.gpu-bundle/sglang-*-py312-site.tar.xz | tail -n 1)"
DEST="${HS_GPU_SITE:-/tmp/hs-sglang-site}"
mkdir -p "$DEST"
xz -dc -T0 "$TAR" | tar -C "$DEST" -xf -
echo "export PYTHONPATH=$DEST:$REPO\${PYTHONPATH:+:\$PYTHONPATH}"
