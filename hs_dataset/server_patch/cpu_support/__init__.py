"""CPU-test-only support for running a real SGLang server without a GPU (see README.md here)."""
