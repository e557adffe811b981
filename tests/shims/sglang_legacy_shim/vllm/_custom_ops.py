"""TEST-ONLY: ``rotary_embedding`` is imported by SGLang 0.5.5's float32 ``RotaryEmbedding`` but called only on CUDA."""


def rotary_embedding(*args, **kwargs):
    raise NotImplementedError("vllm._custom_ops.rotary_embedding: not provided by the SGLang 0.5.5 CPU test shim")
