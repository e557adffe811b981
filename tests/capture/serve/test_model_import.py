"""`hs-dataset serve` refuses an SGLang that cannot load its own DeepSeek class in the server's Python (model_import.py).

Real sources: every ``sglang/**/*.py`` of 0.5.14-0.5.17, extracted by scripts/fetch_sglang_sources.sh
(never downloaded here). A missing tree skips its test with the reason, except in CI (CI set),
where it fails. The installed CPU environment (.sglang-venv and its overlays) is read where it exists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hs_dataset.capture.serve import model_import, plan as serve, probe
from hs_dataset.capture.serve.errors import ServeError
from hs_dataset.capture.serve.model_import import FAMILY_MODULES, WATCHED, eager_import, installed_modules, refuse_unloadable_model
from tests.fixtures.fake_sglang import fake_sglang
from tests.fixtures.paths import REPO

CACHE = Path(os.environ.get("HS_DATASET_CACHE", "~/.cache/hs_dataset")).expanduser() / "sglang-wheels"
DEEPSEEK = FAMILY_MODULES["deepseek"]
CHAIN_0_5_15 = (
    "srt/models/deepseek_v2.py -> srt/layers/attention/dsa/dsa_indexer.py -> jit_kernel/dsa/__init__.py -> "
    "jit_kernel/dsa/cutedsl_paged_mqa_logits.py"
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def real_site(version: str) -> str:
    """The ``sglang`` package folder of one release's wheel (all its .py files)."""
    site = CACHE / version / "site"
    if not (site / ".complete").is_file():
        message = f"{site} is missing: run scripts/fetch_sglang_sources.sh first"
        if _in_ci():
            pytest.fail(message + " (CI is set, so missing sources are an error)")
        pytest.skip(message)
    return str(site / "sglang")


# ---------------------------------------------------------------------------- the real releases


def test_0_5_15_loads_cutlass_with_its_deepseek_model():
    found = eager_import(installed_modules(real_site("0.5.15")), DEEPSEEK, WATCHED)
    assert found is not None and found.target == "cutlass"
    assert found.files() == CHAIN_0_5_15


@pytest.mark.parametrize("version", ["0.5.14", "0.5.16", "0.5.17"])
def test_the_releases_that_ran_on_the_gpu_load_no_cutlass_with_it(version):
    """0.5.14 has no such import; 0.5.16 and 0.5.17 import the CuTe DSL module lazily (a function, __getattr__)."""
    assert eager_import(installed_modules(real_site(version)), DEEPSEEK, WATCHED) is None


def _installed_cpu_sites() -> list[Path]:
    venv = Path(os.environ.get("HS_SGLANG_VENV", REPO / ".sglang-venv"))
    sites = sorted(venv.glob("lib/python*/site-packages/sglang")) + sorted(venv.glob("overlays/*/sglang"))
    return [s for s in sites if (s / "srt" / "models" / "deepseek_v2.py").is_file()]


def test_the_installed_cpu_environment_loads_no_cutlass_with_it():
    """The CPU server env (0.5.23) and its overlays (0.5.14, 0.5.19, 0.5.5) lack cutlass: none of them needs it."""
    sites = _installed_cpu_sites()
    if not sites:
        pytest.skip(f"no SGLang CPU environment at {REPO / '.sglang-venv'} (make sglang-env sglang-overlays)")
    for site in sites:
        assert eager_import(installed_modules(str(site)), DEEPSEEK, WATCHED) is None, site


def test_the_refusal_is_one_line_naming_the_error_the_files_and_the_fix():
    with pytest.raises(ServeError) as caught:
        refuse_unloadable_model("0.5.15", real_site("0.5.15"), ["DeepseekV3ForCausalLM"], ["cutlass"], python="/srv/python", device="cuda")
    text = str(caught.value)
    assert "\n" not in text
    assert "RuntimeError: shape mismatch: value tensor of shape [768, 16, 64] cannot be broadcast" in text
    assert "mem_cache/memory_pool.py set_kv_buffer" in text and "layers/attention/triton_backend.py forward_decode" in text
    assert CHAIN_0_5_15 in text and "/srv/python has no `cutlass` (nvidia-cutlass-dsl)" in text
    assert "Transformers fallback" in text and "0.5.14, 0.5.16, 0.5.17" in text and "(unverified)" in text


@pytest.mark.parametrize(
    "absent, architectures, device",
    [
        ([], ["DeepseekV3ForCausalLM"], "cuda"),  # cutlass installed: the import succeeds
        (["cutlass"], ["LlamaForCausalLM"], "cuda"),  # another family's module
        (["cutlass"], ["DeepseekV3ForCausalLM"], "cpu"),  # not checked on CPU servers
    ],
)
def test_0_5_15_is_served_where_nothing_is_missing_or_it_is_not_the_model(absent, architectures, device):
    refuse_unloadable_model("0.5.15", real_site("0.5.15"), architectures, absent, python="/srv/python", device=device)


# ---------------------------------------------------------------------------- how the source is read


def _tree(tmp_path: Path, files: dict[str, str]) -> str:
    """A stand-in ``sglang`` package holding ``files`` (paths under ``sglang/``)."""
    root = tmp_path / "site" / "sglang"
    for rel, text in {"__init__.py": "", "srt/__init__.py": "", "srt/models/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return str(root)


MODEL = "from sglang.srt.layers.indexer import Indexer\n"
INDEXER = "from sglang.kern.dsa import paged_logits\nclass Indexer:\n    pass\n"
CUTE = "import cutlass\nimport cutlass.cute as cute\n"


@pytest.mark.parametrize(
    "dsa_init, loads",
    [
        ("from .paged import paged_logits\nif not is_hip():\n    from .cute import Runner\n", True),  # 0.5.15's shape
        ("from .paged import paged_logits\nfrom . import cute\n", True),
        ("from .paged import paged_logits\ndef __getattr__(name):\n    from .cute import Runner\n    return Runner\n", False),
        ("from .paged import paged_logits\ntry:\n    from .cute import Runner\nexcept ImportError:\n    Runner = None\n", False),
        ("from .paged import paged_logits\nif _is_hip:\n    from .cute import Runner\n", False),
        ("from .paged import paged_logits\nif TYPE_CHECKING:\n    from .cute import Runner\n", False),
        ("from .paged import paged_logits\nif get_bool_env_var('X'):\n    from .cute import Runner\n", False),
        ("from .paged import paged_logits\nif _is_cuda:\n    from .cute import Runner\n", True),
    ],
)
def test_only_imports_a_cuda_server_makes_at_load_are_followed(tmp_path, dsa_init, loads):
    site = _tree(
        tmp_path,
        {
            "srt/models/deepseek_v2.py": MODEL,
            "srt/layers/__init__.py": "",
            "srt/layers/indexer.py": INDEXER,
            "kern/__init__.py": "",
            "kern/dsa/__init__.py": dsa_init,
            "kern/dsa/paged.py": "def paged_logits():\n    pass\n",
            "kern/dsa/cute.py": CUTE,
        },
    )
    found = eager_import(installed_modules(site), DEEPSEEK, WATCHED)
    assert (found is not None) == loads
    if loads:
        assert found.files() == "srt/models/deepseek_v2.py -> srt/layers/indexer.py -> kern/dsa/__init__.py -> kern/dsa/cute.py"


@pytest.mark.parametrize(
    "init, loads",
    [
        ("def cute():\n    pass\n", False),  # `from P import cute` finds the function: the submodule is never loaded
        ("", True),  # nothing of that name in P: Python loads the submodule P.cute
    ],
)
def test_from_a_package_import_loads_a_submodule_only_where_the_package_binds_no_such_name(tmp_path, init, loads):
    site = _tree(tmp_path, {"srt/models/deepseek_v2.py": "from sglang.kern import cute\n", "kern/__init__.py": init, "kern/cute.py": CUTE})
    assert (eager_import(installed_modules(site), DEEPSEEK, WATCHED) is not None) == loads


# ---------------------------------------------------------------------------- serve refuses before starting anything


def _unloadable_release(tmp_path: Path) -> str:
    """A stand-in SGLang with every capture feature whose deepseek_v2.py loads cutlass the way 0.5.15's does."""
    site = fake_sglang(tmp_path / "env")
    model = Path(site, "srt", "models", "deepseek_v2.py")
    model.write_text("from sglang.jit_kernel.dsa import paged\n" + model.read_text())
    for rel, text in {
        "jit_kernel/__init__.py": "",
        "jit_kernel/dsa/__init__.py": "from .paged import paged\nif not is_hip():\n    from .cute import Runner\n",
        "jit_kernel/dsa/paged.py": "def paged():\n    pass\n",
        "jit_kernel/dsa/cute.py": CUTE,
    }.items():
        Path(site, rel).parent.mkdir(parents=True, exist_ok=True)
        Path(site, rel).write_text(text)
    return site


@pytest.fixture
def unloadable_env(monkeypatch, tmp_path):
    info = {"sglang": "0.5.15", "hs_dataset": True, "sgl_kernel": "x", "sglang_dir": _unloadable_release(tmp_path), "absent": ["cutlass"]}
    monkeypatch.setattr(probe, "probe_server_env", lambda python: dict(info))
    return info


def _cuda_card(tmp_path: Path) -> Path:
    text = (REPO / "cards" / "tiny-deepseek-sglang.yaml").read_text(encoding="utf-8")
    assert "  device: cpu\n" in text
    card = tmp_path / "cuda-card.yaml"
    card.write_text(text.replace("  device: cpu\n", "  device: cuda\n"), encoding="utf-8")
    return card


def test_the_plan_is_refused_where_the_server_python_lacks_what_the_model_loads(unloadable_env, tmp_path):
    from hs_dataset.config import load_card

    card = load_card(str(_cuda_card(tmp_path)))
    with pytest.raises(ServeError, match=r"cannot load its DeepseekV3ForCausalLM here: .* has no `cutlass`"):
        serve.plan_server(card, staging_dir=str(tmp_path / "st"))
    unloadable_env["absent"] = []  # the same source with cutlass installed: planned
    assert serve.plan_server(card, staging_dir=str(tmp_path / "st")).mechanism


@pytest.mark.parametrize("check", [True, False])
def test_serve_and_serve_check_refuse_in_one_line_before_starting_a_server(unloadable_env, monkeypatch, tmp_path, capsys, check):
    import hs_dataset.capture.serve as serve_package
    from hs_dataset.cli.main import main

    def never(*_args, **_kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(serve_package, "launch", never)
    monkeypatch.setattr(probe, "check_processor_in_server", never)  # the refusal comes first
    argv = ["serve", "--config", str(_cuda_card(tmp_path)), "--staging-dir", str(tmp_path / "st")] + (["--check"] if check else [])
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hs-dataset serve: error: SGLang 0.5.15 cannot load its DeepseekV3ForCausalLM")
    assert "shape mismatch" in lines[0] and "jit_kernel/dsa/cute.py" in lines[0] and not captured.out


def test_the_probe_reports_the_watched_modules_it_cannot_find(tmp_path):
    """The probe's code asks find_spec for every watched module (nothing imported) and reports the absent ones."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", probe._PROBE], capture_output=True, text=True, check=True, cwd=tmp_path)
    info = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(info["absent"]) <= set(WATCHED) and isinstance(info["absent"], list)
    assert model_import.WATCHED["cutlass"] == "nvidia-cutlass-dsl"
