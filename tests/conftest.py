"""The suite's one conftest: no test reaches a hub, the fixtures come from tests/fixtures as plugins, every test has a kind.

A session fixture imported into several test modules would be a separate definition in
each (one SGLang server per module: ~30 s and 2.4 GB each on 2 cores), so every shared
fixture is registered here, once, as a plugin.

The test tree mirrors the package tree, so a test's kind is a marker, not a folder: the
modules listed in ``INTEGRATION_MODULES`` (real servers, the trainers' own code, child
processes, kill -9, hostile input through the real entry points) are marked
``integration``; every other test is marked ``unit`` (fast, one module or mechanism at a
time, no server), the selection ``make test-unit`` runs (``pytest -m unit``). A new module
is a unit module unless it is added to the list.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
    "tests.fixtures.hub",
]

TESTS = Path(__file__).resolve().parent

# Paths relative to tests/ of the modules whose tests are not fast unit tests.
INTEGRATION_MODULES = frozenset(
    {
        "capture/sglang/test_eagle3_server.py",
        "capture/sglang/test_one_pass.py",
        "capture/sglang/test_encoded_server.py",
        "capture/sglang/test_final_only_server.py",
        "capture/sglang/test_kimi_server.py",
        "capture/sglang/test_parallel_server.py",
        "capture/sglang/test_server.py",
        "capture/sglang/test_server_faults.py",
        "capture/sglang/test_untrusted_dumps.py",
        "capture/sglang/test_versions.py",
        "cli/test_error_boundary.py",
        "cli/test_progress_lines.py",
        "cli/test_repair.py",
        "codecs/test_fp4_datasets.py",
        "end_to_end/test_acceptance.py",
        "end_to_end/test_bad_inputs.py",
        "end_to_end/test_input_bounds.py",
        "end_to_end/test_kill_resume.py",
        "end_to_end/test_pipeline.py",
        "end_to_end/test_round_five.py",
        "end_to_end/test_served_integrity.py",
        "end_to_end/test_unfinished_build.py",
        "formats/test_crash_resume.py",
        "formats/test_dataloader.py",
        "formats/test_integrity.py",
        "formats/test_nonfinite_server_states.py",
        "formats/test_stale_temps.py",
        "formats/test_untrusted_datasets.py",
        "hub/test_push_kills.py",
        "hub/test_upload_download.py",
        "interop/specforge/test_import_memory.py",
        "interop/specforge/test_kimi_masks.py",
        "interop/specforge/test_train.py",
        "interop/speculators/test_train.py",
        "interop/speculators/test_train_families.py",
        "interop/test_export_storage_notes.py",
        "interop/test_exports.py",
        "model/test_card_from_model.py",
        "model/test_untrusted_configs.py",
        "regenerate/test_kill_resume.py",
        "regenerate/test_regenerate_build.py",
        "regenerate/test_signals.py",
        "remote/test_bounded_reads.py",
        "remote/test_follow.py",
        "remote/test_merge_kills.py",
        "remote/test_s3_build.py",
        "remote/test_s3_read.py",
        "remote/test_shared_cache.py",
        "remote/test_untrusted_stores.py",
        "server_patch/legacy/test_patched_server.py",
        "server_patch/legacy/test_source_patch.py",
        "server_patch/test_staging_faults.py",
        "sources/test_untrusted_templates.py",
        "streaming/test_stream.py",
        "test_builder.py",
        "test_distributed.py",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    missing = sorted(name for name in INTEGRATION_MODULES if not (TESTS / name).is_file())
    if missing:
        raise pytest.UsageError(
            f"tests/conftest.py: INTEGRATION_MODULES names {', '.join(missing)}, not in tests/: "
            "update the list to the module's new path (or drop it)"
        )


def kind_of(path: Path) -> str:
    """``integration`` for a module in ``INTEGRATION_MODULES``, else ``unit``."""
    resolved = path.resolve()
    if not resolved.is_relative_to(TESTS):
        return "unit"
    return "integration" if resolved.relative_to(TESTS).as_posix() in INTEGRATION_MODULES else "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(kind_of(item.path))
