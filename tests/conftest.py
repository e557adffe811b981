"""The suite's one conftest: no test reaches a hub, and the fixtures come from tests/fixtures as plugins.

A session fixture imported into several test modules would be a separate definition in
each (one SGLang server per module: ~30 s and 2.4 GB each on 2 cores), so every shared
fixture is registered here, once, as a plugin.
"""

from __future__ import annotations

import os

# No test may reach a hub: everything is built locally or shipped in packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

pytest_plugins = [
    "tests.fixtures.samples",
    "tests.fixtures.models",
    "tests.fixtures.families",
    "tests.fixtures.sglang_server",
    "tests.fixtures.tally",
    "tests.fixtures.s3_server",
]
