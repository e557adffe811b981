"""Finding ``sglang/srt/models/deepseek_v2.py`` of an SGLang install, and its version, without importing SGLang.

Standard library only (see :mod:`hs_dataset.server_patch.legacy.patch`, the script).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

from hs_dataset.server_patch.legacy.edit import LegacyPatchError

__all__ = ["locate_deepseek_v2", "sglang_version"]


_FIND_SGLANG = (
    "import importlib.util, sys\n"
    "spec = importlib.util.find_spec('sglang')\n"
    "sys.stdout.write(list(spec.submodule_search_locations)[0] if spec else '')\n"
)


def locate_deepseek_v2(sglang_root: str | None = None, python: str | None = None) -> Path:
    """deepseek_v2.py of an sglang install, found without importing sglang.

    `sglang_root` is the sglang package directory or a directory holding it
    (site-packages); `python` is the server's interpreter when that differs.
    """
    if sglang_root:
        roots = [Path(sglang_root), Path(sglang_root) / "sglang"]
    elif python:
        proc = subprocess.run([python, "-c", _FIND_SGLANG], capture_output=True, text=True)
        if proc.returncode != 0 or not proc.stdout.strip():
            raise LegacyPatchError(f"sglang is not installed for {python} ({proc.stderr.strip()[-200:]})")
        roots = [Path(proc.stdout.strip())]
    else:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise LegacyPatchError("sglang is not installed in this Python; pass --file PATH, --sglang-root DIR or --python SERVER_PYTHON")
        roots = [Path(p) for p in spec.submodule_search_locations]
    for root in roots:
        candidate = root / "srt" / "models" / "deepseek_v2.py"
        if candidate.is_file():
            return candidate
    raise LegacyPatchError(f"no srt/models/deepseek_v2.py under {', '.join(map(str, roots))}")


def sglang_version(deepseek_v2: Path) -> str | None:
    """Installed sglang version, read as text (dist-info, else version.py / _version.py)."""
    package = deepseek_v2.parent.parent.parent
    for metadata in sorted(package.parent.glob("sglang-*.dist-info/METADATA")):
        match = re.search(r"^Version:\s*(\S+)", metadata.read_text("utf-8", "replace"), re.M)
        if match:
            return match.group(1)
    for name in ("version.py", "_version.py"):
        try:
            text = (package / name).read_text("utf-8")
        except OSError:
            continue
        match = re.search(r"^__version__\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)", text, re.M)
        if match:
            return match.group(1)
    return None
