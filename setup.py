"""Ship ``hs_dataset_datasets_hook.pth`` at the site-packages root (metadata lives in pyproject.toml).

The .pth lets ``datasets.load_dataset("hs_dataset", ...)`` work in a fresh interpreter
without ``import hs_dataset``: at startup it only registers a lazy import finder
(see hs_dataset/datasets_hook.py). setuptools has no declarative way to put a file at
the wheel's root, so a ``build`` sub-command writes it: into build_lib for a wheel, and
into the unpacked editable wheel for ``pip install -e .`` (where build_lib is discarded).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from setuptools import Command, setup
from setuptools.command.build import build

PTH_NAME = "hs_dataset_datasets_hook.pth"
# One line, run by site.py at interpreter start: stdlib only until the hook is wanted, and off with
# HS_DATASET_DATASETS_HOOK=0 (the SGLang server environment has the .pth removed, see make_sglang_env.sh).
PTH_LINE = 'import os; os.environ.get("HS_DATASET_DATASETS_HOOK", "1") == "0" or __import__("hs_dataset.datasets_hook", fromlist=["install"]).install()\n'


class build_pth(Command):
    """Write the startup .pth next to the package."""

    description = "write the hs_dataset startup .pth"
    user_options: ClassVar[list[tuple[str, str | None, str]]] = []

    def initialize_options(self) -> None:
        self.build_lib: str | None = None
        self.editable_mode = False

    def finalize_options(self) -> None:
        self.set_undefined_options("build", ("build_lib", "build_lib"))

    def _target(self) -> Path:
        # editable_wheel points install_lib at the unpacked wheel; build_lib is a temp dir there
        if self.editable_mode:
            return Path(self.get_finalized_command("install").install_lib)
        return Path(self.build_lib)

    def run(self) -> None:
        target = self._target()
        target.mkdir(parents=True, exist_ok=True)
        (target / PTH_NAME).write_text(PTH_LINE, encoding="utf-8")

    def get_outputs(self) -> list[str]:
        return [] if self.editable_mode else [str(Path(self.build_lib) / PTH_NAME)]

    def get_output_mapping(self) -> dict[str, str]:
        return {}

    def get_source_files(self) -> list[str]:
        return []


class build_with_pth(build):
    sub_commands = build.sub_commands + [("build_pth", None)]


setup(cmdclass={"build": build_with_pth, "build_pth": build_pth})
