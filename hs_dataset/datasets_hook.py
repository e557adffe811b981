"""Make ``datasets.load_dataset("hs_dataset", ...)`` resolve to our builder, even without ``import hs_dataset``.

datasets >= 4 runs no loading scripts and never looks an installed package up by
name, so the only place to answer the name is ``datasets.load.dataset_module_factory``.
We wrap it, answering for the exact name ``hs_dataset`` only (and only when no
``data_files`` are given; ``data_dir`` names an existing dataset, a directory or an
``s3://`` URL, that our builder serves as rows); everything else, ``"./hs_dataset"`` included,
goes through untouched. Answering first also means a local ``./hs_dataset`` folder
(this repository's source, when run from its root) cannot hijack the name.

The wrap is applied lazily: :func:`install` registers a meta-path finder that wraps
``datasets.load`` right after it is first executed. The ``hs_dataset_datasets_hook.pth``
file shipped with the package calls :func:`install` at interpreter start; it imports
nothing but the standard library (no datasets, no torch).

Off switches: ``HS_DATASET_DATASETS_HOOK=0`` in the environment (the ``.pth`` line then
imports nothing of hs_dataset), and the SGLang server environment, which has the
``.pth`` removed (``scripts/make_sglang_env.sh``; ``hs-dataset serve`` also sets the
variable for the server). A ``datasets`` release without ``dataset_module_factory`` is
left alone: ``hs_dataset.load_dataset(...)`` is the same builder through public API only.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

__all__ = ["DATASET_NAME", "OFF_SWITCH", "install"]

DATASET_NAME = "hs_dataset"
OFF_SWITCH = "HS_DATASET_DATASETS_HOOK"  # "0": the hook installs nothing
_MARK = "_hs_dataset_wrapped"


def _answers(original: Any, path: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if path != DATASET_NAME:
        return False
    import inspect

    given = inspect.signature(original).bind_partial(path, *args, **kwargs).arguments
    return given.get("data_files") is None


def _wrap(load_module: Any) -> None:
    original = getattr(load_module, "dataset_module_factory", None)
    if original is None or getattr(original, _MARK, False):
        return  # a datasets without the private factory: hs_dataset.load_dataset still works

    def dataset_module_factory(path: str, *args: Any, **kwargs: Any) -> Any:
        if _answers(original, path, args, kwargs):
            from hs_dataset.builder import builder_module

            return builder_module()
        return original(path, *args, **kwargs)

    setattr(dataset_module_factory, _MARK, True)
    dataset_module_factory.__doc__ = original.__doc__
    dataset_module_factory.__wrapped__ = original  # type: ignore[attr-defined]
    load_module.dataset_module_factory = dataset_module_factory


class _PatchOnImport:
    """Meta-path finder (duck-typed: importing importlib.abc would add to every startup) that wraps
    ``datasets.load`` right after it is first executed; inert for every other import."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "datasets.load":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module: Any) -> None:
            exec_module(module)
            _wrap(module)

        spec.loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Idempotent; cheap enough for interpreter start (stdlib imports only); off with ``HS_DATASET_DATASETS_HOOK=0``."""
    if os.environ.get(OFF_SWITCH, "1") == "0":
        return
    if "datasets.load" in sys.modules:
        _wrap(sys.modules["datasets.load"])
        return
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
