#!/usr/bin/env bash
# Here (with a package index): the packages benchmarks/bench_remote_read.py needs on the GPU host beyond its image
# (moto's S3 server, s3fs, boto, and hs_dataset's own dependencies the image lacks, taken from the SGLang bundle's
# site, which scripts/gpu/build_bundle.sh makes), as one tarball to carry. On the host:
#   mkdir -p /tmp/rs && xz -dc .gpu-bundle/remote/remote-site-py312.tar.xz | tar -C /tmp/rs -xf -
#   PYTHONPATH=/tmp/rs:$PWD python3 benchmarks/bench_remote_read.py --dir /tmp
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SITE="$REPO/.gpu-bundle/site-0.5.14"
PY="$REPO/.venv/bin/python"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/site" "$WORK/wheels" "$REPO/.gpu-bundle/remote"
(cd "$SITE" && cp -r blake3* pydantic* datasets* dill* multiprocess* deepseek* annotated_types* typing_inspection* "$WORK/site/")
# the versions this repo's venv tests with; the host runs Python 3.12
pins=$("$PY" -m pip list --format=freeze | grep -i -E '^(moto|s3fs|boto3|botocore|aiobotocore|aioitertools|flask|flask-cors|itsdangerous|blinker|cryptography|cffi|pycparser|xmltodict|responses|s3transfer|jmespath)==')
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$WORK/wheels" $pins py-partiql-parser
for w in "$WORK"/wheels/*.whl; do "$PY" -m zipfile -e "$w" "$WORK/site/"; done
tar -C "$WORK/site" -cf - . | xz -T0 -6 > "$REPO/.gpu-bundle/remote/remote-site-py312.tar.xz"
ls -la "$REPO/.gpu-bundle/remote/remote-site-py312.tar.xz"
