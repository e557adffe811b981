"""The shared real-SGLang-server fixtures: ONE capture server per test session.

Fixtures live here and are registered by ``conftest.py`` only: a session fixture
imported into several test modules is a separate definition in each, and would
start one server per module (~30 s and 2.4 GB each on 2 cores).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SERVER_PYTHON = REPO / ".sglang-venv" / "bin" / "python"
AUX = [2, 3, 4]
CHUNK = 64


def require_sglang_env() -> None:
    if not SERVER_PYTHON.exists():
        msg = f"{SERVER_PYTHON} not found: run `make sglang-env` to create the SGLang server environment"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def card():
    from hs_dataset.config import load_card

    return load_card("tiny-deepseek-sglang")


@pytest.fixture(scope="session")
def tiny_model():
    from hs_dataset.testing.tiny_model import build_tiny_deepseek

    return str(build_tiny_deepseek())


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(card, tmp_root: Path, name: str, **overrides):
    from hs_dataset.serve import launch, plan_server

    extra = overrides.pop("extra_args", ())
    plan = plan_server(
        card,
        port=free_port(),
        staging_dir=str(tmp_root / f"{name}-stage"),
        python=str(SERVER_PYTHON),
        sglang_overrides=overrides,
        extra_args=extra,
    )
    t0 = time.monotonic()
    server = launch(plan, log_path=str(tmp_root / f"{name}.log"), timeout=300)
    print(f"[{name}] healthy after {time.monotonic() - t0:.1f} s at {server.url}")
    return server


@pytest.fixture(scope="session")
def hs_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("sglang")


@pytest.fixture(scope="session")
def capture_server(card, tiny_model, hs_tmp):
    require_sglang_env()
    server = start_server(card, hs_tmp, "capture", chunked_prefill_size=CHUNK)
    yield server
    server.stop(timeout=5)


@pytest.fixture(scope="session")
def hf_model(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, local_files_only=True).eval()


def hf_reference(model, ids: torch.Tensor):
    """aux = hidden_states[i] for i in AUX; final = the input of the final norm (pre-norm)."""
    seen = {}
    handle = model.model.norm.register_forward_pre_hook(lambda _m, args: seen.__setitem__("pre", args[0]))
    try:
        with torch.no_grad():
            out = model.model(ids[None], output_hidden_states=True)
    finally:
        handle.remove()
    aux = torch.stack([out.hidden_states[i][0] for i in AUX], dim=1)
    return aux, seen["pre"][0]


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def remove_dumps(staging_dir: str, rids) -> None:
    """Delete the dumps a test read straight from the staging dir (the client would have)."""
    for rid in rids:
        try:
            os.unlink(os.path.join(staging_dir, rid + ".safetensors"))
        except FileNotFoundError:
            pass


def staged_files(staging_dir: str) -> list[str]:
    """What a staging dir holds besides its spare pool (read dumps handed back for reuse: memory, not leftovers)."""
    from hs_dataset.server_patch.protocol import SPARE_DIR

    return sorted(n for n in os.listdir(staging_dir) if n != SPARE_DIR)
