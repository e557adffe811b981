"""Support for serving with a real SGLang on a CPU-only machine: ``hs-dataset serve`` uses it for every ``device: cpu`` card (see README.md here)."""
