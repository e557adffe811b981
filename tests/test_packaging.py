"""Every subpackage is listed in pyproject.toml (cards/ maps outside the package folder)."""

from __future__ import annotations

from pathlib import Path

import tomllib

from tests.fixtures.paths import REPO


def test_all_subpackages_are_listed():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "hs_dataset").rglob("__init__.py")}
    missing = found - listed
    assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages in pyproject.toml"
    assert "hs_dataset.cards" in listed


def test_cards_ship_with_the_package():
    from hs_dataset.config import list_cards

    assert {"tiny-deepseek-hf", "kimi-k25-sglang"} <= set(list_cards())
    assert all(Path(REPO / "cards" / f"{name}.yaml").exists() for name in list_cards())
