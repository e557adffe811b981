"""Trainer formats: export to and import from the speculators and SpecForge layouts (docs/EXPORTS.md).

The public facade, lazy so that importing it (the CLI does, to build its parser) loads
neither torch nor the trainers' modules:

* :func:`export_speculators` -- speculators 0.9.0 (``speculators/train/data.py``
  ``ArrowDataset``): an Arrow dataset (``save_to_disk``, torch format) plus
  ``hidden_states/hs_{idx}.safetensors`` holding ``hidden_states`` [T, K+1, H] (aux
  ascending, PRE-norm final last) and ``token_ids`` [T].
* :func:`export_specforge` -- SpecForge 0.2.0 offline data
  (``OfflineManifestReader``): ``rows_{g}-{g+2000}/data_{idx}.ckpt`` with
  ``input_ids``, ``loss_mask``, ``aux_hidden_state`` [1, T, K*H] and ``hidden_state``
  [1, T, H] POST-norm, derived from the stored pre-norm state with the recorded norm.
* :func:`import_speculators`, :func:`import_specforge` -- their data back into our
  format, with :class:`ImportSettings` stating what neither layout records.

The parts, by trainer (:mod:`.trainers` lists them): :mod:`.speculators` (``export``,
``import_``, ``cli``, ``settings``, ``backend``, ``launch``) and :mod:`.specforge`
(``export``, ``import_``, ``cli``, ``settings``): each trainer's export settings (:class:`SpeculatorsExportSettings`,
:class:`SpecForgeExportSettings`) extend the common :class:`ExportSettings`; shared:
:mod:`.settings` (:class:`ExportSettings`, :class:`ImportSettings`), :mod:`.common`
(export helpers and errors), :mod:`.exporting` (the one export loop) and
:mod:`.importing` (the import machinery).
"""

from __future__ import annotations

import importlib
from typing import Any

from hs_dataset.interop.trainers import TRAINERS

__all__ = [
    *(f"export_{name}" for name in TRAINERS),
    *(f"import_{name}" for name in TRAINERS),
    "ImportSettings",
    "ExportSettings",
    *(trainer.export_settings.__name__ for trainer in TRAINERS.values()),
    "ImportReport",
    "ImportDataError",
    "ExportError",
    "ExportMismatchError",
    "ExportReport",
    "EXPORT_RECORD_NAME",
    "read_export_record",
    "derive_post_norm",
]

_HOME = {
    **{f"export_{name}": f"{trainer.package}.export" for name, trainer in TRAINERS.items()},
    **{f"import_{name}": f"{trainer.package}.import_" for name, trainer in TRAINERS.items()},
    **{trainer.export_settings.__name__: trainer.export_settings.__module__ for trainer in TRAINERS.values()},
    "ImportSettings": "hs_dataset.interop.settings",
    "ExportSettings": "hs_dataset.interop.settings",
    "ImportReport": "hs_dataset.interop.importing",
    "ImportDataError": "hs_dataset.interop.importing",
    "ExportError": "hs_dataset.interop.common",
    "ExportMismatchError": "hs_dataset.interop.common",
    "ExportReport": "hs_dataset.interop.common",
    "EXPORT_RECORD_NAME": "hs_dataset.interop.common",
    "read_export_record": "hs_dataset.interop.common",
    "derive_post_norm": "hs_dataset.interop.common",
}


def __getattr__(name: str) -> Any:  # lazy: a name's module loads when the name is first used
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
