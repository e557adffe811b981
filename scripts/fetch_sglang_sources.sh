#!/usr/bin/env bash
# Fetch the sglang wheels the legacy patch is tested against and extract
# sglang/srt/models/deepseek_v2.py of each, for tests/server_patch/legacy/test_source_patch.py.
#
#   scripts/fetch_sglang_sources.sh            # default versions
#   scripts/fetch_sglang_sources.sh 0.5.5      # just these
#
# Layout: $CACHE/sglang-<version>-*.whl and $CACHE/<version>/deepseek_v2.py,
# CACHE = ${HS_DATASET_CACHE:-~/.cache/hs_dataset}/sglang-wheels.
# Idempotent: a version whose deepseek_v2.py is already extracted is skipped,
# a wheel already downloaded is not downloaded again. Needs pip and PyPI access.
# PYTHON picks the interpreter whose pip downloads (default python3).
set -euo pipefail

CACHE="${HS_DATASET_CACHE:-$HOME/.cache/hs_dataset}/sglang-wheels"
PYTHON="${PYTHON:-python3}"
# 0.4.10.post2, 0.5.5, 0.5.5.post3, 0.5.8.post1: patchable (0.5.8.post1 is the
# last release before forward hooks); 0.5.23: must be refused.
DEFAULT_VERSIONS="0.4.10.post2 0.5.5 0.5.5.post3 0.5.8.post1 0.5.23"
if [ "$#" -gt 0 ]; then VERSIONS="$*"; else VERSIONS="${HS_SGLANG_VERSIONS:-$DEFAULT_VERSIONS}"; fi

mkdir -p "$CACHE"
for version in $VERSIONS; do
    target="$CACHE/$version/deepseek_v2.py"
    if [ -s "$target" ]; then
        echo "ok      $version  $target"
        continue
    fi
    wheel=$(ls "$CACHE"/sglang-"$version"-*.whl 2>/dev/null | head -n 1 || true)
    if [ -z "$wheel" ]; then
        # Newer sglang wheels are CPython/manylinux-specific: ask for one
        # explicitly so the download works from any host Python.
        "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
            --implementation cp --python-version 3.11 --platform manylinux_2_34_x86_64 \
            --dest "$CACHE" "sglang==$version"
        wheel=$(ls "$CACHE"/sglang-"$version"-*.whl | head -n 1)
    fi
    mkdir -p "$CACHE/$version"
    # Extract through a temp file + rename so an interrupted run leaves no half file.
    "$PYTHON" - "$wheel" "$target" <<'PY'
import os, sys, tempfile, zipfile
wheel, target = sys.argv[1], sys.argv[2]
data = zipfile.ZipFile(wheel).read("sglang/srt/models/deepseek_v2.py")
fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), suffix=".tmp")
with os.fdopen(fd, "wb") as fh:
    fh.write(data)
os.replace(tmp, target)
PY
    echo "fetched $version  $target"
done
