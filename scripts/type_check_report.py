"""Which modules of hs_dataset pass mypy strictly, which only leniently, and which not even that.

``pyproject.toml``'s ``[tool.mypy]`` holds two module lists: modules that pass ``--strict``'s flags (kept
strict, so a new violation fails ``make lint``) and modules excused with ``ignore_errors`` because they fail
even the lenient global settings. This script measures both afresh over every module and prints the lists
with error counts (the figures docs/ARCHITECTURE.md quotes); ``--write`` puts the lists into pyproject.toml.

    python scripts/type_check_report.py [--write]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
STRICT_MARK = "# Modules that pass `mypy --strict`"
EXCUSED_MARK = "# Modules with errors even under the lenient global settings"
_ERROR = re.compile(r"^(hs_dataset/[^:]+\.py):\d+: error:")


def modules() -> list[str]:
    names = []
    for path in sorted((REPO / "hs_dataset").rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def module_of(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def ini(strict: bool) -> str:
    """The project's mypy settings without its two module lists, as an ini file (the stdlib writes no TOML)."""
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["mypy"]
    lines = ["[mypy]", *(f"{k} = {_value(v)}" for k, v in config.items() if k != "overrides")]
    if strict:
        lines.append("strict = True")
    for override in config.get("overrides", []):
        if override.get("ignore_errors") or override.get("disallow_untyped_defs"):
            continue  # the two lists this script measures
        mods = override["module"] if isinstance(override["module"], list) else [override["module"]]
        lines.append(f"[mypy-{','.join(mods)}]")
        lines += [f"{k} = {_value(v)}" for k, v in override.items() if k != "module"]
    return "\n".join(lines) + "\n"


def _value(v: object) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, list):
        return ", ".join(map(str, v))
    return str(v)


def errors(strict: bool) -> Counter[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False) as f:
        f.write(ini(strict))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", f.name, "--no-incremental"], cwd=REPO, capture_output=True, text=True
    ).stdout
    Path(f.name).unlink()
    return Counter(module_of(m.group(1)) for line in out.splitlines() if (m := _ERROR.match(line)))


def short(module: str) -> str:
    return module.removeprefix("hs_dataset.")


def write_lists(strict: list[str], excused: list[str]) -> None:
    text = PYPROJECT.read_text()
    for mark, names in ((STRICT_MARK, strict), (EXCUSED_MARK, excused)):
        start = text.index(mark)
        begin = text.index("module = [", start)
        end = text.index("]\n", begin) + 2
        body = ", ".join(f'"{n}"' for n in names)
        wrapped = "\n".join("    " + line for line in _wrap(body, 112))
        text = text[:begin] + "module = [\n" + wrapped + "\n]\n" + text[end:]
    PYPROJECT.write_text(text)


def _wrap(text: str, width: int) -> list[str]:
    lines, line = [], ""
    for item in text.split(", "):
        piece = item + ","
        if line and len(line) + 1 + len(piece) > width:
            lines.append(line)
            line = piece
        else:
            line = f"{line} {piece}".strip()
    return lines + ([line] if line else [])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="put the strict and excused module lists into pyproject.toml")
    args = p.parse_args()
    lenient, strict = errors(False), errors(True)
    names = modules()
    excused = [m for m in names if lenient[m]]
    passing = [m for m in names if not lenient[m] and not strict[m]]
    between = [m for m in names if not lenient[m] and strict[m]]
    print(f"{len(names)} modules: {len(passing)} strict, {len(between)} lenient only, {len(excused)} excused")
    print("lenient only (errors under --strict): " + ", ".join(f"`{short(m)}` {strict[m]}" for m in between))
    print("excused (errors lenient/strict): " + ", ".join(f"`{short(m)}` {lenient[m]}/{strict[m]}" for m in excused))
    if args.write:
        write_lists(passing, excused)
        print(f"wrote both lists into {PYPROJECT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
