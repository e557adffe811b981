"""Which SGLang releases a test of this repository ran, per capture mechanism and device: the support table.

The mechanism itself follows from what the installed source provides
(:class:`~hs_dataset.capture.serve.facts.SGLangFacts`), never from the version number: each
mechanism's launch object says when it is available
(:func:`hs_dataset.capture.serve.mechanisms.choose`).

"Verified" is a narrower word: a release, mechanism and device that a test or check of this
repository ran against a real server, comparing its states with an independent forward
(:data:`VERIFIED` names which). Everything else is reported *unverified* -- by
``hs-dataset serve --check``, in the launch log and in the manifest (``capture.verified``) --
even when the facts say it should work. Adding a verified release is one entry in
:data:`VERIFIED`.
"""

from __future__ import annotations

from hs_dataset.errors import HsDatasetError
from hs_dataset.server_patch.contract.mechanism import Mechanism
from hs_dataset.server_patch.contract.sglang_version import parse_version

__all__ = ["VERIFIED", "UnsupportedVersionError", "verification"]

# (release, mechanism, device) -> what ran it: a real server, its states vs an independent forward
VERIFIED: dict[tuple[str, Mechanism, str], str] = {
    ("0.5.23", Mechanism.AUX_RETURN, "cpu"): "tests/capture/sglang/test_server.py, test_parallel_server.py (tp 2, DP attention), "
    "test_kimi_server.py (float32, CPU)",
    ("0.5.19", Mechanism.LAYER_HOOKS, "cpu"): "tests/capture/sglang/test_versions.py (float32, CPU)",
    ("0.5.14", Mechanism.LAYER_HOOKS, "cpu"): "tests/capture/sglang/test_versions.py (float32, CPU)",
    ("0.5.5", Mechanism.LEGACY, "cpu"): "tests/server_patch/legacy/test_patched_server.py (the source patch, float32, CPU)",
    ("0.5.14", Mechanism.LAYER_HOOKS, "cuda"): "scripts/gpu/check_server.py on an H200, 2026-12-01 (bf16, decode CUDA graphs on; "
    "benchmarks/results/check_server_gpu.txt)",
    (
        "0.5.16",
        Mechanism.LAYER_HOOKS,
        "cuda",
    ): "scripts/gpu/run_release_check.sh 0.5.16 on an H200, 2026-12-01 (bf16, decode CUDA graphs on, "
    "tp 1; benchmarks/results/check_server_gpu_0.5.16.txt), and benchmarks/bench_flagship_gpu.py "
    "at Kimi-K2.5's shape (nf4; benchmarks/results/bench_flagship_gpu.txt); the Kimi-K2.5-class "
    "snapshot on 2026-12-02 (benchmarks/results/check_server_gpu_kimi_0.5.16.txt)",
    (
        "0.5.17",
        Mechanism.LAYER_HOOKS,
        "cuda",
    ): "scripts/gpu/run_release_check.sh 0.5.17 on an H200, 2026-12-02 (bf16, decode CUDA graphs on, "
    "tp 1; the Kimi-shaped DeepseekV3 and the Kimi-K2.5-class snapshot: "
    "benchmarks/results/check_server_gpu_0.5.17.txt, check_server_gpu_kimi_0.5.17.txt)",
}


class UnsupportedVersionError(HsDatasetError, ValueError):
    """This SGLang cannot be captured from as asked (the message names the fix)."""


def _release(version: str) -> str:
    try:
        return ".".join(map(str, parse_version(version)))
    except ValueError:
        return str(version)


def verification(version: str, mechanism: Mechanism | str, device: str) -> tuple[bool, str]:
    """(verified, the words for it): which test ran this release, mechanism and device, or that none did."""
    wanted = (_release(version), str(mechanism), device)  # a server's hook config may name any string
    ran = next((words for (v, m, d), words in VERIFIED.items() if (v, m.value, d) == wanted), None)
    if ran is not None:
        return True, f"verified by {ran}"
    known = "; ".join(f"{v} {m} on {d}" for v, m, d in VERIFIED)
    return False, (
        f"unverified: no test of this repository ran SGLang {version} with {mechanism} on {device} (verified: {known}); "
        "the mechanism was chosen from what the installed source provides"
    )
