"""Fast tests: one module or one mechanism at a time, no server, no trainer (`pytest tests/unit`, under two minutes)."""
