"""TEST-ONLY: SGLang 0.5.5's own norms (see ``vllm/__init__.py`` of this shim)."""

from sglang.srt.layers.layernorm import GemmaRMSNorm, RMSNorm  # noqa: F401
