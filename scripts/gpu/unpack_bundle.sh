#!/usr/bin/env bash
# On the GPU host: unpack the bundle built by build_bundle.sh into /tmp/hs-sglang-site-VERSION and print the
# PYTHONPATH to export (source it: `eval "$(bash scripts/gpu/unpack_bundle.sh 0.5.16)"`). Without VERSION: the
# only bundle in .gpu-bundle (several there: name one). A bundle unpacked before on a warm host is reused.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="${1:-}"
if [ -z "$VERSION" ]; then
  found=("$REPO"/.gpu-bundle/sglang-*-py312-site.tar.xz)
  [ "${#found[@]}" -eq 1 ] || { echo "unpack_bundle: ${#found[@]} bundles in .gpu-bundle; name the version" >&2; exit 2; }
  VERSION="$(basename "${found[0]}" | sed 's/^sglang-\(.*\)-py312-site.tar.xz$/\1/')"
fi
TAR="$REPO/.gpu-bundle/sglang-$VERSION-py312-site.tar.xz"
DEST="${HS_GPU_SITE:-/tmp/hs-sglang-site-$VERSION}"
if [ ! -f "$DEST/.unpacked" ]; then
  [ -f "$TAR" ] || { echo "unpack_bundle: no $TAR (build it with scripts/gpu/build_bundle.sh $VERSION and carry .gpu-bundle)" >&2; exit 2; }
  mkdir -p "$DEST"
  xz -dc -T0 "$TAR" | tar -C "$DEST" -xf -
  touch "$DEST/.unpacked"
fi
echo "export PYTHONPATH=$DEST:$REPO\${PYTHONPATH:+:\$PYTHONPATH}"
