"""How tensors are stored: the one codec registry and the bytes it stands for. stdlib + torch.

:mod:`.registry` names every encoding once (plain dtypes, fp8, the 4-bit ones) with
its storage alias, dtypes, host quantizer and dequantizer, scale rule, device
quantizer and bytes per value; the writer, reader, verify, the card schema, the CLI
choices and the server side all read it. The quantizers themselves are
:mod:`.fp8`, :mod:`.fp4` and, fused for a CUDA device, :mod:`.fp4_kernel`; the
safetensors header is built by :mod:`.safetensors_header` and parsed by
:mod:`.safetensors_layout`. torch is imported lazily, so the card schema can name
encodings without it.
"""
