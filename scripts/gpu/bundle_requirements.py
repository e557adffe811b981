"""Resolve the wheels an SGLang server needs on a GPU host that has no package index.

The host already holds a CUDA torch and a long list of packages (the device tool's KINDS.md);
everything else sglang imports must travel with the working tree (at most 64 MiB a call). This walks
sglang's requirements breadth-first with `pip download --no-deps` for the host's Python (3.12, manylinux
x86_64), skipping what the host has and what the server never imports with the flags `hs-dataset serve`
passes on a GPU (`--attention-backend triton --sampling-backend pytorch --grammar-backend none`), and writes
the wheels into DEST with a list of what was fetched and why.

Usage: python bundle_requirements.py DEST sglang==0.5.14 [transformers==5.8.1 ...]
"""

from __future__ import annotations

import email.parser
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# On the image already (KINDS.md, 'Python packages already there', read 2026-11-17).
HOST = set(
    map(
        canonicalize_name,
        [
            "absl-py",
            "accelerate",
            "aiofiles",
            "aiohappyeyeballs",
            "aiohttp",
            "aiosignal",
            "annotated-doc",
            "anyio",
            "attrs",
            "botorch",
            "build",
            "certifi",
            "charset-normalizer",
            "chex",
            "click",
            "cloudpickle",
            "cmake",
            "colorama",
            "contourpy",
            "coverage",
            "cuda-bindings",
            "cuda-core",
            "cuda-pathfinder",
            "cuda-toolkit",
            "cupy-cuda13x",
            "cycler",
            "cython",
            "diffrax",
            "e3nn",
            "einops",
            "equinox",
            "etils",
            "execnet",
            "filelock",
            "flatbuffers",
            "flax",
            "fonttools",
            "formulaic",
            "frozenlist",
            "fsspec",
            "gpytorch",
            "grpcio",
            "h11",
            "h5py",
            "hf-xet",
            "httpcore",
            "httpx",
            "huggingface-hub",
            "humanize",
            "hypothesis",
            "idna",
            "imageio",
            "iniconfig",
            "interface-meta",
            "jax",
            "jax-cuda13-pjrt",
            "jax-cuda13-plugin",
            "jaxlib",
            "jaxtyping",
            "jinja2",
            "joblib",
            "kiwisolver",
            "lazy-loader",
            "lightning",
            "lightning-utilities",
            "linear-operator",
            "lineax",
            "llvmlite",
            "lxml",
            "markdown",
            "markdown-it-py",
            "markupsafe",
            "matplotlib",
            "mdurl",
            "meson",
            "ml-dtypes",
            "mpi4py",
            "mpmath",
            "msgpack",
            "multidict",
            "multipledispatch",
            "mypy-extensions",
            "nanobind",
            "narwhals",
            "networkx",
            "ninja",
            "numba",
            "numba-cuda",
            "numpy",
            "numpyro",
            "nvidia-cublas",
            "nvidia-cuda-cupti",
            "nvidia-cuda-nvrtc",
            "nvidia-cuda-runtime",
            "nvidia-cudnn-cu13",
            "nvidia-cufft",
            "nvidia-cufile",
            "nvidia-curand",
            "nvidia-cusolver",
            "nvidia-cusparse",
            "nvidia-cusparselt-cu13",
            "nvidia-ml-py",
            "nvidia-nccl-cu13",
            "nvidia-nvjitlink",
            "nvidia-nvshmem-cu13",
            "nvidia-nvtx",
            "onnx",
            "onnx-ir",
            "onnxruntime",
            "onnxscript",
            "opencv-python-headless",
            "optax",
            "opt-einsum",
            "opt-einsum-fx",
            "optimistix",
            "orbax-checkpoint",
            "packaging",
            "pandas",
            "pathspec",
            "patsy",
            "peft",
            "pillow",
            "pip",
            "pluggy",
            "portalocker",
            "prometheus-client",
            "propcache",
            "protobuf",
            "psutil",
            "pyarrow",
            "pybind11",
            "py-cpuinfo",
            "pygments",
            "pyparsing",
            "pyproject-hooks",
            "pyre-extensions",
            "pytest",
            "pytest-benchmark",
            "pytest-cov",
            "pytest-mock",
            "pytest-timeout",
            "pytest-xdist",
            "python-dateutil",
            "pytorch-lightning",
            "pyyaml",
            "regex",
            "requests",
            "rich",
            "sacrebleu",
            "safetensors",
            "scikit-build-core",
            "scikit-image",
            "scikit-learn",
            "scipy",
            "seaborn",
            "sentencepiece",
            "sentence-transformers",
            "setuptools",
            "shellingham",
            "simplejson",
            "six",
            "sortedcontainers",
            "statsmodels",
            "sympy",
            "tabulate",
            "tensorboard",
            "tensorboard-data-server",
            "tensorstore",
            "threadpoolctl",
            "tifffile",
            "tiktoken",
            "timm",
            "tokenizers",
            "toolz",
            "torch",
            "torchaudio",
            "torchdiffeq",
            "torch-geometric",
            "torchmetrics",
            "torchvision",
            "tqdm",
            "transformers",
            "treescope",
            "triton",
            "typer",
            "typing-extensions",
            "typing-inspect",
            "urllib3",
            "uvloop",
            "wadler-lindig",
            "werkzeug",
            "wheel",
            "wrapt",
            "xarray",
            "xxhash",
            "yarl",
            "zipp",
        ],
    )
)

# Never imported by a server started with --attention-backend triton --sampling-backend pytorch
# --grammar-backend none (or only by models/features hs_dataset does not use): left behind. The CUDA compiler
# wheels (nvcc, nvvm, crt, cccl: 338 MB unpacked) serve JIT-compiled kernels (humming's quantized MoE) that an
# unquantized model on the triton backends never builds. xgrammar is NOT here: 0.5.15+ import it whatever the
# grammar backend (sglang/srt/function_call/inkling_detector.py), so it travels, minus its static library.
NOT_NEEDED = set(
    map(
        canonicalize_name,
        [
            "flash-attn-4",
            "flashinfer-cubin",
            # SGLang 0.5.15's models/deepseek_v2.py imports cutlass when it loads (jit_kernel/dsa/__init__.py): without it
            # 0.5.15 serves a DeepSeek model through its Transformers fallback, which dies on the MLA cache, and
            # `hs-dataset serve` refuses it (capture/serve/model_import.py). Its libraries (74 MB) do not fit a transfer.
            "nvidia-cutlass-dsl",
            "nvidia-mathdx",
            "tilelang",
            "tokenspeed-mla",
            "quack-kernels",
            "llguidance",
            "mistral-common",
            "outlines",
            "modelscope",
            "py-spy",
            "torchcodec",
            "kernels",
            "decord2",
            "av",
            "timm",
            "nvidia-cuda-nvcc",
            "nvidia-nvvm",
            "nvidia-cuda-crt",
            "nvidia-cuda-cccl",
        ],
    )
)

# Wanted even though the host has a version: sglang pins another one it needs to import.
OVERRIDE_HOST = {"transformers", "tokenizers"}

PLATFORMS = [
    "manylinux_2_34_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
    "any",
]
ENV = {
    **default_environment(),
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "platform_machine": "x86_64",
    "sys_platform": "linux",
    "implementation_name": "cpython",
    "platform_system": "Linux",
}


def download(spec: str, dest: Path) -> Path:
    before = set(dest.glob("*.whl"))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--abi",
        "cp312",
        "--abi",
        "abi3",
        "--abi",
        "none",
        "-d",
        str(dest),
        "-q",
        spec,
    ]
    for p in PLATFORMS:
        cmd[cmd.index("-d") : cmd.index("-d")] = ["--platform", p]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pip download {spec} failed:\n{done.stderr[-2000:]}")
    new = set(dest.glob("*.whl")) - before
    name = canonicalize_name(Requirement(spec).name)
    found = new or {w for w in dest.glob("*.whl") if canonicalize_name(w.name.split("-")[0]) == name}
    return sorted(found)[-1]


def requirements(wheel: Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode())
    out = []
    for raw in meta.get_all("Requires-Dist") or []:
        req = Requirement(raw)
        if req.marker is None or any(req.marker.evaluate({**ENV, "extra": e}) for e in (extras or {""})):
            out.append(req)
    return out


def main() -> None:
    dest = Path(sys.argv[1]).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    queue = [Requirement(s) for s in sys.argv[2:]]
    pinned = {canonicalize_name(r.name) for r in queue}
    seen: dict[str, dict] = {}
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in seen or name in NOT_NEEDED or (name in HOST and name not in OVERRIDE_HOST and name not in pinned):
            continue
        spec = str(req.name) + (str(req.specifier) if req.specifier else "")
        wheel = download(spec, dest)
        seen[name] = {"wheel": wheel.name, "asked": spec, "bytes": wheel.stat().st_size}
        queue.extend(requirements(wheel, set(req.extras)))
    (dest / "bundle.json").write_text(json.dumps(seen, indent=1, sort_keys=True))
    total = sum(v["bytes"] for v in seen.values())
    print(f"{len(seen)} wheels, {total / 2**20:.1f} MiB in {dest}")


if __name__ == "__main__":
    main()
