"""hs_dataset: EAGLE-3 drafter training data from a served LLM's hidden states.

Reading: ``hs_dataset.open_dataset(path)``. Building: ``hs-dataset build`` or
``datasets.load_dataset("hs_dataset", config=...)`` after ``import hs_dataset``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from hs_dataset.formats.reader import HiddenStateDataset, open_dataset  # noqa: E402

__all__ = ["__version__", "open_dataset", "HiddenStateDataset"]
