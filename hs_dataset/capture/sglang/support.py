"""Which capture mechanism an installed SGLang allows, and which releases a test of this repository ran.

The mechanism follows from what the installed source provides
(:class:`~hs_dataset.capture.serve.facts.SGLangFacts`), never from the version number:
``aux_return`` where SGLang returns the aux states itself (``--enable-return-aux-hidden-states``)
and takes forward hooks, ``layer_hooks`` where it takes forward hooks only, ``legacy`` (the
source patch, ``hs-dataset patch apply``) where it takes neither and its ``deepseek_v2.py``
carries the patch.

"Verified" is a narrower word: a release, mechanism and device that a test or check of this
repository ran against a real server, comparing its states with an independent forward
(:data:`VERIFIED` names which). Everything else is reported *unverified* -- by
``hs-dataset serve --check``, in the launch log and in the manifest (``capture.verified``) --
even when the facts say it should work.
"""

from __future__ import annotations

from typing import Protocol

from hs_dataset.errors import HsDatasetError
from hs_dataset.server_patch.contract.sglang_version import parse_version

__all__ = ["MECHANISMS", "VERIFIED", "UnsupportedVersionError", "mechanism_for", "verification"]

MECHANISMS = ("aux_return", "layer_hooks", "legacy")

# (release, mechanism, device) -> what ran it: a real server, its states vs an independent forward
VERIFIED: dict[tuple[str, str, str], str] = {
    ("0.5.23", "aux_return", "cpu"): "tests/capture/sglang/test_server.py, test_parallel_server.py (tp 2, DP attention), "
                                     "test_kimi_server.py (float32, CPU)",
    ("0.5.19", "layer_hooks", "cpu"): "tests/capture/sglang/test_versions.py (float32, CPU)",
    ("0.5.14", "layer_hooks", "cpu"): "tests/capture/sglang/test_versions.py (float32, CPU)",
    ("0.5.5", "legacy", "cpu"): "tests/server_patch/legacy/test_patched_server.py (the source patch, float32, CPU)",
    ("0.5.14", "layer_hooks", "cuda"): "scripts/gpu/check_server.py on an H200, 2026-12-01 (bf16, decode CUDA graphs on; "
                                      "benchmarks/results/check_server_gpu.txt)",
    ("0.5.16", "layer_hooks", "cuda"): "scripts/gpu/run_release_check.sh 0.5.16 on an H200, 2026-12-01 (bf16, decode CUDA graphs on, "
                                      "tp 1; benchmarks/results/check_server_gpu_0.5.16.txt), and benchmarks/bench_flagship_gpu.py "
                                      "at Kimi-K2.5's shape (nf4; benchmarks/results/bench_flagship_gpu.txt); the Kimi-K2.5-class "
                                      "snapshot on 2026-12-02 (benchmarks/results/check_server_gpu_kimi_0.5.16.txt)",
    ("0.5.17", "layer_hooks", "cuda"): "scripts/gpu/run_release_check.sh 0.5.17 on an H200, 2026-12-02 (bf16, decode CUDA graphs on, "
                                      "tp 1; the Kimi-shaped DeepseekV3 and the Kimi-K2.5-class snapshot: "
                                      "benchmarks/results/check_server_gpu_0.5.17.txt, check_server_gpu_kimi_0.5.17.txt)",
}


class UnsupportedVersionError(HsDatasetError, ValueError):
    """This SGLang cannot be captured from as asked (the message names the fix)."""


class _Facts(Protocol):
    version: str
    forward_hooks: bool
    aux_return: bool
    source_patched: bool


def mechanism_for(facts: _Facts, requested: str = "auto") -> str:
    """The mechanism to use on this SGLang: the card's choice where the source allows it, else the best it allows."""
    available = [m for m, ok in (("aux_return", facts.forward_hooks and facts.aux_return), ("layer_hooks", facts.forward_hooks),
                                 ("legacy", not facts.forward_hooks and facts.source_patched)) if ok]
    if not available:
        raise UnsupportedVersionError(
            f"SGLang {facts.version} has no forward hooks (its server arguments define no forward_hooks) and its "
            "models/deepseek_v2.py carries no hs_dataset patch: patch it with `hs-dataset patch apply --python "
            "<server python>` (docs/LEGACY_PATCH.md), then serve again"
        )
    if requested == "auto":
        return available[0]
    if requested not in available:
        raise UnsupportedVersionError(f"mechanism {requested!r} is not available on SGLang {facts.version} (use {available[0]!r})")
    return requested


def _release(version: str) -> str:
    try:
        return ".".join(map(str, parse_version(version)))
    except ValueError:
        return str(version)


def verification(version: str, mechanism: str, device: str) -> tuple[bool, str]:
    """(verified, the words for it): which test ran this release, mechanism and device, or that none did."""
    ran = VERIFIED.get((_release(version), mechanism, device))
    if ran is not None:
        return True, f"verified by {ran}"
    known = "; ".join(f"{v} {m} on {d}" for v, m, d in VERIFIED)
    return False, (
        f"unverified: no test of this repository ran SGLang {version} with {mechanism} on {device} (verified: {known}); "
        "the mechanism was chosen from what the installed source provides"
    )
