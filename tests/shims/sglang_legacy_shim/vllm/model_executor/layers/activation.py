"""TEST-ONLY: SGLang 0.5.5's own activations (see ``vllm/__init__.py`` of this shim)."""

from sglang.srt.layers.activation import GeluAndMul, SiluAndMul  # noqa: F401
