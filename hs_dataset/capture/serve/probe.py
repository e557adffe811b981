"""Facts about the server's Python and the SGLang installed there, read without importing SGLang here.

The server runs in its own environment (``make sglang-env``), so what it has installed
is asked of its interpreter (:func:`probe_server_env`: one short subprocess), and the
source of an installed SGLang module is read from its file (:func:`installed_source`),
never imported into this process.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from hs_dataset.capture.serve.errors import ServeError
from hs_dataset.capture.serve.model_import import WATCHED

__all__ = ["check_processor_in_server", "installed_source", "probe_server_env"]

_PROBE = (
    "import importlib.metadata as m, importlib.util as u, json, os\n"
    "out = {'sglang': None}\n"
    "try:\n    out['sglang'] = m.version('sglang')\nexcept m.PackageNotFoundError:\n    pass\n"
    "out['hs_dataset'] = u.find_spec('hs_dataset') is not None\n"
    "s = u.find_spec('sgl_kernel')\nout['sgl_kernel'] = s.origin if s else None\n"
    "s = u.find_spec('sglang')\nout['sglang_dir'] = os.path.dirname(s.origin) if s and s.origin else None\n"
    f"out['absent'] = [n for n in {sorted(WATCHED)!r} if u.find_spec(n) is None]\n"
    "print(json.dumps(out))\n"
)


def probe_server_env(python: str) -> dict:
    """``{"sglang": version, "hs_dataset": importable, "sgl_kernel": path or None, "sglang_dir": path or None,
    "absent": [the modules of model_import.WATCHED it cannot find]}`` (found, never imported).

    :class:`ServeError` where the interpreter is missing, fails, or has no SGLang.
    """
    if not os.path.exists(python):
        raise ServeError(f"server Python {python} does not exist: run `make sglang-env` (or set HS_SGLANG_PYTHON)")
    try:
        res = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServeError(f"cannot run the server Python {python}: {exc}") from None
    if res.returncode != 0:
        raise ServeError(f"the server Python {python} failed: {res.stderr.strip()[-500:]}")
    info = json.loads(res.stdout.strip().splitlines()[-1])
    if not info.get("sglang"):
        raise ServeError(f"sglang is not installed in {python}: run `make sglang-env`")
    return info


def installed_source(sglang_dir: str | None) -> Callable[[str, str], str | None]:
    """``read_source`` for :func:`~hs_dataset.server_patch.contract.layer_outputs.layer_hooks_problem`: a module's file in the server env, unimported."""

    def read(module: str, class_name: str) -> str | None:
        if not sglang_dir or not module.startswith("sglang."):
            return None
        path = Path(sglang_dir, *module.split(".")[1:]).with_suffix(".py")
        try:
            return path.read_text(encoding="utf-8")
        except OSError:
            return None

    return read


_PROCESSOR_CHECK = (
    "import json, sys\n"
    "from hs_dataset.model.processor import check_processor_files\n"
    "try:\n"
    "    check_processor_files(sys.argv[1], sys.argv[2] == '1')\n"
    "except Exception as exc:\n"
    "    print(json.dumps({'error': str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}))\n"
    "    sys.exit(3)\n"
    "print(json.dumps({'ok': True}))\n"
)


def check_processor_in_server(python: str, env: dict[str, str], model_path: str, trust_remote_code: bool) -> None:
    """The multimodal processor check (:func:`hs_dataset.model.processor.check_processor_files`), run where SGLang
    will load the processor: in the server's interpreter, whose packages (torchvision, the snapshot's remote code's
    needs) may differ from the builder's. A text model is answered here without starting it."""
    from hs_dataset.model.model_config import text_config

    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if text_config(config) is config:
        return
    try:
        res = subprocess.run(
            [python, "-c", _PROCESSOR_CHECK, model_path, "1" if trust_remote_code else "0"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, **env},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServeError(f"cannot run the processor check in the server Python {python}: {exc}") from None
    lines = res.stdout.strip().splitlines()
    answer = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {"error": res.stderr.strip()[-500:] or "no answer"}
    if "error" in answer:
        raise ServeError(f"the server Python {python}: {answer['error']}")
