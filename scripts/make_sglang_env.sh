#!/usr/bin/env bash
# Create the separate virtual environment the SGLang server runs in (.sglang-venv/).
#
# The server needs sglang's own pins (transformers 5.19, its own torch), which
# clash with the main environment, so it lives apart; the builder only talks to
# it over HTTP. Route (see docs/SGLANG.md, "Server environment"):
#
#   cpu  (default) torch==2.13.0 CPU wheel + triton + torchvision, sglang wheel
#        with --no-deps, then the imports sglang needs with the torch pin as a
#        constraint; the CPU support files of hs_dataset/server_patch/cpu_support
#        (sgl_kernel stand-in, torchvision sitecustomize) are put on the venv's
#        path with a .pth file. For tests and development on machines without GPU.
#   cuda   plain `pip install sglang==VERSION` (sglang's own torch); nothing CPU-only.
#
# Both routes then install this repository with --no-deps (editable), so the
# scheduler processes can import hs_dataset.server_patch.
#
# Idempotent: a stamp file keyed by this script's hash + route + version makes a
# second run return at once. Force a rebuild with HS_SGLANG_REBUILD=1.
#
# Environment: HS_SGLANG_VENV (default <repo>/.sglang-venv), HS_SGLANG_ROUTE
# (cpu|cuda), HS_SGLANG_VERSION (default 0.5.23), PYTHON (default python3.11).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HS_SGLANG_VENV:-$REPO/.sglang-venv}"
ROUTE="${HS_SGLANG_ROUTE:-cpu}"
SGLANG_VERSION="${HS_SGLANG_VERSION:-0.5.23}"
PYTHON="${PYTHON:-python3.11}"
STAMP="$VENV/.hs_dataset_env_stamp"

KEY="$( (cat "${BASH_SOURCE[0]}"; echo "$ROUTE $SGLANG_VERSION") | sha256sum | cut -c1-32)"
if [[ "${HS_SGLANG_REBUILD:-0}" != "1" && -f "$STAMP" && "$(cat "$STAMP")" == "$KEY" && -x "$VENV/bin/python" ]]; then
    echo "sglang-env: $VENV is up to date (sglang $SGLANG_VERSION, route $ROUTE)"
    exit 0
fi

case "$ROUTE" in cpu|cuda) ;; *) echo "sglang-env: HS_SGLANG_ROUTE must be cpu or cuda, got '$ROUTE'" >&2; exit 2;; esac
command -v "$PYTHON" >/dev/null || { echo "sglang-env: $PYTHON not found; set PYTHON=/path/to/python3.11" >&2; exit 2; }

start=$(date +%s)
echo "sglang-env: building $VENV (sglang $SGLANG_VERSION, route $ROUTE)"
rm -f "$STAMP"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip setuptools wheel

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

if [[ "$ROUTE" == "cpu" ]]; then
    CONSTRAINTS="$VENV/hs_constraints.txt"
    cat > "$CONSTRAINTS" <<CONS
torch==2.13.0
triton==3.9.0
torchvision==0.28.0
CONS
    # 1. torch (local CPU wheel where the machine has one) + triton + torchvision.
    "${PIP[@]}" install -q torch==2.13.0 triton==3.9.0 torchvision==0.28.0
    # 2. sglang itself, without its CUDA pins (torch==2.14.1, flashinfer, sgl-kernel, ...).
    "${PIP[@]}" install -q --no-deps "sglang==$SGLANG_VERSION"
    # 3. What sglang imports on the CPU path, with the torch pin as constraint.
    "${PIP[@]}" install -q -c "$CONSTRAINTS" \
        transformers==5.19.0 sentencepiece==0.2.1 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 \
        openai==2.8.0 openai-harmony==0.0.4 blobfile==3.0.0 xgrammar==0.2.7 'llguidance>=1.7.6,<2' \
        'mistral_common>=1.11.5' soundfile==0.13.1 'python-dateutil<3' \
        numpy scipy safetensors psutil pybase64 requests packaging pillow starlette fastapi uvicorn uvloop \
        msgspec pydantic pyzmq tqdm ipython aiohttp orjson setproctitle python-multipart prometheus-client \
        xxhash interegular dill einops gguf partial_json_parser jsonschema tiktoken anthropic watchfiles \
        zstandard nvidia-ml-py easydict ninja distro smg-grpc-servicer pyyaml
    # 4. CPU support files on every process's path (sitecustomize + sgl_kernel stand-in).
    echo "$REPO/hs_dataset/server_patch/cpu_support" > "$SITE/hs_dataset_cpu_support.pth"
else
    "${PIP[@]}" install -q "sglang==$SGLANG_VERSION"
    rm -f "$SITE/hs_dataset_cpu_support.pth"
fi

# 5. Our server-side code (hs_dataset.server_patch), without the builder's dependencies, and without the
#    `datasets` name hook: nothing in the server may patch `datasets` (docs/DATASETS.md).
"${PIP[@]}" install -q --no-deps -e "$REPO"
rm -f "$SITE/hs_dataset_datasets_hook.pth"

# 6. Smoke check: the imports the scheduler needs.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import sglang, torch, hs_dataset.server_patch.core  # noqa: F401
import sglang.srt.model_executor.hook_manager  # noqa: F401
print(f"sglang-env: ok: sglang {md.version('sglang')}, torch {torch.__version__}")
PY

echo "$KEY" > "$STAMP"
echo "sglang-env: done in $(( $(date +%s) - start )) s"
