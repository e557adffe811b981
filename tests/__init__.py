"""The test suite, mirroring hs_dataset/; a test's kind (unit, integration, sglang, slow) is a marker (tests/conftest.py)."""
