"""TEST-ONLY: the three ``vllm`` imports SGLang 0.5.5 makes on a CPU without AMX, answered by SGLang itself.

On a CPU where ``cpu_has_amx_support()`` is false, SGLang 0.5.5 ends
``sglang/srt/layers/activation.py`` with ``from vllm.model_executor.layers.activation
import GeluAndMul, SiluAndMul`` and ``sglang/srt/layers/layernorm.py`` with ``from
vllm.model_executor.layers.layernorm import GemmaRMSNorm, RMSNorm`` ("Fallback to other
kernel libraries"), replacing its own classes with vLLM's; in float32
``RotaryEmbedding.__init__`` imports ``vllm._custom_ops.rotary_embedding`` (used only by
its CUDA forward). vLLM is not installed here. These modules hand back SGLang's own
classes (already defined when the fallback import runs), so the layers keep SGLang's
``forward_native`` torch code, which is what runs on such a CPU anyway. Not a vLLM.
"""

__version__ = "0.0.0+hs-dataset-sglang-0.5.5-cpu-test-shim"
