#!/usr/bin/env bash
# Fetch the sglang wheels some tests read real SGLang sources from, and extract what they read:
# * sglang/srt/models/deepseek_v2.py of each release the legacy patch is tested against
#   (tests/server_patch/legacy/test_source_patch.py);
# * every sglang/**/*.py of each release the model-import check is tested against
#   (hs_dataset/capture/serve/model_import.py follows the module-level imports through the whole
#   package: tests/capture/serve/test_model_import.py).
#
#   scripts/fetch_sglang_sources.sh            # default versions of both
#   scripts/fetch_sglang_sources.sh 0.5.5      # deepseek_v2.py of just these (package trees: HS_SGLANG_SITE_VERSIONS)
#
# Layout: $CACHE/sglang-<version>-*.whl, $CACHE/<version>/deepseek_v2.py and
# $CACHE/<version>/site/sglang/... (its .complete stamp written last),
# CACHE = ${HS_DATASET_CACHE:-~/.cache/hs_dataset}/sglang-wheels.
# Idempotent: what is already extracted is skipped, a wheel already downloaded is not
# downloaded again. Needs pip and PyPI access. PYTHON picks the interpreter whose pip
# downloads (default python3).
set -euo pipefail

CACHE="${HS_DATASET_CACHE:-$HOME/.cache/hs_dataset}/sglang-wheels"
PYTHON="${PYTHON:-python3}"
# 0.4.10.post2, 0.5.5, 0.5.5.post3, 0.5.8.post1: patchable (0.5.8.post1 is the
# last release before forward hooks); 0.5.23: must be refused.
DEFAULT_VERSIONS="0.4.10.post2 0.5.5 0.5.5.post3 0.5.8.post1 0.5.23"
# 0.5.15: its deepseek_v2.py imports cutlass when it loads (refused without it); 0.5.14, 0.5.16, 0.5.17: it does not.
DEFAULT_SITE_VERSIONS="0.5.14 0.5.15 0.5.16 0.5.17"
if [ "$#" -gt 0 ]; then
    VERSIONS="$*"
    SITE_VERSIONS="${HS_SGLANG_SITE_VERSIONS:-}"
else
    VERSIONS="${HS_SGLANG_VERSIONS:-$DEFAULT_VERSIONS}"
    SITE_VERSIONS="${HS_SGLANG_SITE_VERSIONS-$DEFAULT_SITE_VERSIONS}"
fi

wheel_for() {  # the cached wheel of one release, downloaded first where missing
    local version="$1" wheel
    wheel=$(ls "$CACHE"/sglang-"$version"-*.whl 2>/dev/null | head -n 1 || true)
    if [ -z "$wheel" ]; then
        # Newer sglang wheels are CPython/manylinux-specific: ask for one
        # explicitly so the download works from any host Python.
        "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
            --implementation cp --python-version 3.11 --platform manylinux_2_34_x86_64 \
            --dest "$CACHE" "sglang==$version" >&2
        wheel=$(ls "$CACHE"/sglang-"$version"-*.whl | head -n 1)
    fi
    echo "$wheel"
}

mkdir -p "$CACHE"
for version in $VERSIONS; do
    target="$CACHE/$version/deepseek_v2.py"
    if [ -s "$target" ]; then
        echo "ok      $version  $target"
        continue
    fi
    wheel=$(wheel_for "$version")
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

for version in $SITE_VERSIONS; do
    site="$CACHE/$version/site"
    if [ -f "$site/.complete" ]; then
        echo "ok      $version  $site"
        continue
    fi
    wheel=$(wheel_for "$version")
    # Into a temp folder renamed into place: an interrupted run leaves no half tree.
    "$PYTHON" - "$wheel" "$site" <<'PY'
import os, shutil, sys, tempfile, zipfile
wheel, site = sys.argv[1], sys.argv[2]
parent = os.path.dirname(site)
os.makedirs(parent, exist_ok=True)
tmp = tempfile.mkdtemp(dir=parent, prefix=".site-")
with zipfile.ZipFile(wheel) as whl:
    for name in whl.namelist():
        if name.startswith("sglang/") and name.endswith(".py") and ".." not in name.split("/"):
            whl.extract(name, tmp)
open(os.path.join(tmp, ".complete"), "w").close()
shutil.rmtree(site, ignore_errors=True)
os.replace(tmp, site)
PY
    echo "fetched $version  $site"
done
