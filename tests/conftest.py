"""Shared test helpers: deterministic synthetic samples and dataset metadata."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from hs_dataset.sample import CapturedSample

REPO = Path(__file__).resolve().parents[1]


def make_metadata(k: int = 3, h: int = 16, dtype: str = "bfloat16", **extra) -> dict:
    md = {
        "config_name": "unit-test",
        "config_fingerprint": "0" * 64,
        "model": {"path": "synthetic", "fingerprint": "none"},
        "aux_layer_ids": list(range(2, 2 + k)),
        "layer_convention": "hf_hidden_states_index",
        "final_state": "pre_norm",
        "final_norm": {"eps": 1e-6},
        "dtype": dtype,
        "hidden_size": h,
    }
    md.update(extra)
    return md


def make_sample(sid: str, tokens: int, k: int = 3, h: int = 16, dtype: torch.dtype = torch.bfloat16, seed: int | None = None) -> CapturedSample:
    """A sample whose contents depend only on (sid, tokens, k, h, dtype, seed)."""
    g = torch.Generator().manual_seed(seed if seed is not None else stable_seed(sid))
    return CapturedSample(
        sample_id=sid,
        input_ids=torch.randint(0, 50_000, (tokens,), generator=g),
        loss_mask=torch.rand(tokens, generator=g) > 0.3,
        aux_hidden_states=torch.randn(tokens, k, h, generator=g).to(dtype),
        final_hidden_state=torch.randn(tokens, h, generator=g).to(dtype),
    )


def stable_seed(sid: str) -> int:
    import zlib

    return zlib.crc32(sid.encode())


@pytest.fixture
def python_env() -> dict:
    """Environment for child Python processes that import hs_dataset from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("HS_DATASET_CRASH_AT", None)
    return env


PYTHON = sys.executable


# No test may reach a hub: everything is built locally or shipped in packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from hs_dataset.testing.tiny_model import build_tiny_deepseek

    return build_tiny_deepseek()


@pytest.fixture(scope="session")
def tiny_card():
    from hs_dataset.config import load_card

    return load_card("tiny-deepseek-hf")


@pytest.fixture(scope="session")
def hf_backend(tiny_model_dir):
    from hs_dataset.capture.hf import HFBackend

    backend = HFBackend(tiny_model_dir, [2, 3, 4], dtype="float32", device="cpu")
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def tiny_default_dataset(tmp_path_factory, tiny_card, hf_backend) -> Path:
    """The embedded default (tiny-deepseek-hf, all bundled conversations), built once per session (~2 s). Read-only."""
    from hs_dataset.pipeline import build_dataset

    out = tmp_path_factory.mktemp("tiny-default") / "tiny-deepseek-hf"
    build_dataset(tiny_card, out, backend=hf_backend)
    return out


# ---------------------------------------------------------------------------- bad-input tally
# Every test of the bad-input tables is one case. A failing case is classified by its
# assertion tag (ESCAPE:, SILENT:, LOST:) or, when an exception other than an assertion
# escaped, as a traceback. The totals line is what the README cites:
#   pytest tests/test_bad_inputs.py tests/test_untrusted.py
# the real-SGLang-server session fixtures, registered here once so every module shares one server
from sglang_server_util import capture_server, card, hf_model, hs_tmp, tiny_model  # noqa: E402,F401

_TALLY_FILES = ("test_bad_inputs.py", "test_untrusted.py")
_TALLY = {"tried": 0, "passed": 0, "escapes": 0, "tracebacks": 0, "silent wrong data": 0, "samples lost": 0, "other failures": 0}
_TAGS = {"ESCAPE:": "escapes", "SILENT:": "silent wrong data", "LOST:": "samples lost"}


def _classify(excinfo) -> str:
    if excinfo is None:
        return "other failures"
    if not isinstance(excinfo.value, AssertionError):
        return "tracebacks" if excinfo.typename not in ("Failed", "Skipped") else "other failures"
    text = str(excinfo.value)
    return next((name for tag, name in _TAGS.items() if tag in text), "other failures")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call" or item.path.name not in _TALLY_FILES:
        return
    _TALLY["tried"] += 1
    if rep.passed:
        _TALLY["passed"] += 1
    elif rep.failed:
        _TALLY[_classify(call.excinfo)] += 1


def pytest_terminal_summary(terminalreporter):
    if _TALLY["tried"]:
        t = _TALLY
        terminalreporter.write_line(
            f"bad-input cases: {t['tried']} tried, {t['passed']} passed; escapes {t['escapes']}, tracebacks {t['tracebacks']}, "
            f"silent wrong data {t['silent wrong data']}, samples lost {t['samples lost']}, other failures {t['other failures']}"
        )


def require_interop(module: str):
    """Import a trainer module installed by ``make interop-env``; missing fails under CI, skips elsewhere."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        message = f"{module} is not importable ({exc}); run: bash scripts/make_interop_env.sh .venv"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
