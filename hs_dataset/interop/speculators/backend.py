"""An ``hs_dataset`` hidden-states backend for speculators 0.9.0: train straight from our shards.

speculators' trainer reads states through a plug-in registry,
``hs_connectors.HiddenStatesBackend`` (``speculators/train/cli.py``:
``HiddenStatesBackend.registry[args.hidden_states_backend].from_train_args(args, data_path)``),
and per sample calls ``transfer.get_cached(file_idx)`` for a dict with
``hidden_states`` [T, K+1, H] (aux ascending, pre-norm final last) and ``token_ids``
[T], exactly what its ``file`` backend loads from ``hs_{idx}.safetensors``. For MTP,
whose draft reads the final state alone, K is 0 whatever the dataset stores.

This backend answers ``get_cached(idx)`` from sample ``idx`` of our dataset (manifest
order, the export's file index): the token ids are a view of the mapped shard, and the
states are assembled from views with the one copy speculators' tensor layout needs
(the ``file`` backend reads the whole file instead). Shard hashes are checked once,
in the process that builds the backend; dataloader workers reopen the dataset
without rehashing. No state file is ever written.

speculators also opens ``--data-path`` as an Arrow dataset (``input_ids``,
``loss_mask``, ``seq_len``) and reads ``token_freq.pt`` from it:
:func:`write_rows` builds those from our index (token ids and masks only).
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from hs_dataset.errors import UsageError

__all__ = [
    "BACKEND_NAME",
    "TESTED_VERSIONS",
    "HsDatasetTransfer",
    "check_interface",
    "register",
    "trainer_entry",
    "write_rows",
]

BACKEND_NAME = "hs_dataset"
TESTED_VERSIONS = {"speculators": "0.9.0", "hs_connectors": "0.9.0"}
_BACKEND_HOOKS = {"add_train_args", "add_launch_args", "from_train_args", "build_kv_transfer_config"}
_TRANSFER_HOOKS = {"get_cached", "get_generated"}


def _installed_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("speculators", "hs-connectors"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def check_interface() -> None:
    """Refuse, naming versions and the difference, when hs_connectors' backend interface is not the one this module implements."""
    versions = _installed_versions()
    hint = (
        f"installed: speculators {versions['speculators']}, hs-connectors {versions['hs-connectors']}; this backend implements "
        f"the 0.9.0 interface (bash scripts/make_interop_env.sh VENV installs it)"
    )
    try:
        from hs_connectors import HiddenStatesBackend, HiddenStatesTransfer
    except ImportError as exc:
        raise UsageError(f"hs_connectors cannot be imported ({exc}); {hint}") from None
    problems = []
    if not isinstance(getattr(HiddenStatesBackend, "registry", None), dict) or not callable(getattr(HiddenStatesBackend, "register", None)):
        problems.append("hs_connectors.HiddenStatesBackend has no registry/register")
    missing = _BACKEND_HOOKS - set(getattr(HiddenStatesBackend, "__abstractmethods__", ()))
    extra = set(getattr(HiddenStatesBackend, "__abstractmethods__", ())) - _BACKEND_HOOKS
    if missing or extra:
        problems.append(f"HiddenStatesBackend hooks differ (missing {sorted(missing)}, new {sorted(extra)})")
    if set(getattr(HiddenStatesTransfer, "__abstractmethods__", ())) != _TRANSFER_HOOKS:
        problems.append(
            f"HiddenStatesTransfer abstract methods are {sorted(HiddenStatesTransfer.__abstractmethods__)}, expected {sorted(_TRANSFER_HOOKS)}"
        )
    if list(inspect.signature(HiddenStatesTransfer.get_cached).parameters) != ["self", "file_idx"]:
        problems.append("HiddenStatesTransfer.get_cached(self, file_idx) changed")
    if problems:
        raise UsageError(f"speculators' hidden-states backend interface differs: {'; '.join(problems)}; {hint}")


def trainer_entry() -> Callable[[list[str]], None]:
    """speculators' own ``train`` entry (``main(TrainConfig.resolve(argv))``); call after :func:`register`."""
    versions = _installed_versions()
    try:
        from speculators.train.cli import main
        from speculators.train.config import TrainConfig
    except ImportError as exc:
        raise UsageError(
            f"speculators' trainer cannot be imported ({exc}; speculators {versions['speculators']}); install its trainer "
            "dependencies: bash scripts/make_interop_env.sh VENV"
        ) from None
    if not callable(getattr(TrainConfig, "resolve", None)):
        raise UsageError(f"speculators {versions['speculators']}: TrainConfig.resolve is missing; this command drives the 0.9.0 trainer")
    return lambda argv: main(TrainConfig.resolve(argv))


# ---------------------------------------------------------------------------- the transfer
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _stack_states(aux: torch.Tensor, final: torch.Tensor, positions: Sequence[int]) -> torch.Tensor:
    """``[T, K+1, H]``: the selected aux layers, then the final state, copied with numpy.

    Not ``torch.cat``/``copy_``: those run as an OpenMP parallel region, which on a busy
    CPU (threads >= cores, other processes) waits for the pool far longer than numpy's
    single-threaded copy takes (docs/TRAINING.md, "Speed"). Copies the bits (same-size integer
    view), so any stored dtype works, bfloat16 and fp8 included.
    """
    t, _, h = aux.shape
    out = torch.empty((t, len(positions) + 1, h), dtype=aux.dtype)
    bits = _BITS[out.element_size()]
    dst, src = out.view(bits).numpy(), aux.view(bits).numpy()
    for j, p in enumerate(positions):
        dst[:, j] = src[:, p]
    dst[:, -1] = final.view(bits).numpy()
    return out


class HsDatasetTransfer:
    """``HiddenStatesTransfer`` over an hs_dataset directory (an instance is made by :func:`_transfer_class`)."""

    def __init__(self, root: str, positions: Sequence[int]) -> None:
        self.root = str(root)
        self.positions = list(positions)
        self._dataset: Any = None

    def __getstate__(self) -> dict[str, Any]:  # workers reopen the mapped shards themselves
        return {"root": self.root, "positions": self.positions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], state["positions"])

    def setup(self) -> None:
        from hs_dataset.formats.reader import open_dataset

        if self._dataset is None:
            self._dataset = open_dataset(self.root)  # hashes were checked by from_train_args

    def get_cached(self, file_idx: int) -> dict[str, torch.Tensor] | None:
        """Sample ``file_idx`` in speculators' ``hs_{idx}.safetensors`` layout; ``None`` past the end (as a missing file)."""
        self.setup()
        if not 0 <= file_idx < len(self._dataset):
            return None
        sample = self._dataset[file_idx]
        states = _stack_states(sample["aux_hidden_states"], sample["final_hidden_state"], self.positions)
        return {"hidden_states": states, "token_ids": sample["input_ids"]}

    def get_generated(self, hs_transfer_params: dict[str, Any]) -> dict[str, torch.Tensor] | None:
        raise UsageError(
            f"the {BACKEND_NAME} backend serves captured samples only; a sample missing from {self.root} cannot be generated "
            "(train with --on-missing raise or skip)"
        )

    def delete(self, handle: str) -> None:
        """Nothing to clean: no file is ever written."""


def _verified_positions(root: str, target_layer_ids: Sequence[int] | None, final_only: bool = False) -> list[int]:
    """Check every shard's hash once (BLAKE3; sha256 for format-1 shards); the positions of the aux layers speculators will train on.

    ``final_only`` (MTP, whose draft reads the final state alone): none, so no aux layer is copied per sample.
    """
    from hs_dataset.formats.reader import open_dataset
    from hs_dataset.interop.common import check_layer_convention, select_aux_layers
    from hs_dataset.interop.speculators.export import check_final_state

    ds = open_dataset(root, verify_hashes=True)
    for i in range(len(ds.manifest.shards)):
        ds.shard(i)
    check_layer_convention(ds, "speculators")
    check_final_state(ds)
    if final_only:
        return []
    positions, _ = select_aux_layers(ds, list(target_layer_ids) if target_layer_ids else None, "speculators")
    return positions


def _transfer_class() -> type:
    from hs_connectors import HiddenStatesTransfer

    return type("HsDatasetHiddenStatesTransfer", (HsDatasetTransfer, HiddenStatesTransfer), {"__module__": __name__})


def _backend_class() -> type:
    from hs_connectors import HiddenStatesBackend

    def add_train_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--hs-dataset-path", type=str, default=None, help="hs_dataset dataset directory (holds manifest.json)")

    def add_launch_args(parser: argparse.ArgumentParser) -> None:
        """Nothing: this backend reads captured data; it has no vLLM side."""

    def from_train_args(args: argparse.Namespace, data_path: str) -> HsDatasetTransfer:
        root = getattr(args, "hs_dataset_path", None)
        if not root:
            raise UsageError(f"--hidden-states-backend {BACKEND_NAME} needs --hs-dataset-path DIR (an hs_dataset dataset directory)")
        final_only = getattr(args, "speculator_type", None) == "mtp"
        return _transfer_class()(root, _verified_positions(root, getattr(args, "target_layer_ids", None), final_only))

    def build_kv_transfer_config(args: argparse.Namespace) -> dict[str, Any]:
        raise UsageError(f"the {BACKEND_NAME} backend reads captured data; it cannot configure a vLLM server")

    hooks = {
        name: staticmethod(fn)
        for name, fn in (
            ("add_train_args", add_train_args),
            ("add_launch_args", add_launch_args),
            ("from_train_args", from_train_args),
            ("build_kv_transfer_config", build_kv_transfer_config),
        )
    }
    return type("HsDatasetBackend", (HiddenStatesBackend,), {"__module__": __name__, **hooks})


def register() -> type:
    """Register the backend with hs_connectors (idempotent). Must run before speculators' train config module is imported:
    it reads each backend's train args once, at import."""
    import sys

    check_interface()
    from hs_connectors import HiddenStatesBackend

    if BACKEND_NAME in HiddenStatesBackend.registry:
        return HiddenStatesBackend.registry[BACKEND_NAME]
    if "speculators.train.config.resolution" in sys.modules:
        raise UsageError(
            "speculators' train config was imported before the hs_dataset backend was registered, so --hs-dataset-path "
            "would be unknown to it; call hs_dataset.interop.speculators.backend.register() first"
        )
    return HiddenStatesBackend.register(BACKEND_NAME)(_backend_class())


# ---------------------------------------------------------------------------- the Arrow rows
def write_rows(src: str | Path, dest: str | Path) -> int:
    """Write speculators' Arrow rows (input_ids, loss_mask, seq_len) and token_freq.pt for ``src`` into ``dest``.

    Token ids and masks only, from the shards' index tensors; no state is read or
    copied. Returns the number of rows. ``dest`` is speculators' ``--data-path`` (it
    also caches its vocab mappings there).
    """
    from hs_dataset.formats.index import index_rows
    from hs_dataset.formats.reader import open_dataset
    from hs_dataset.interop.speculators.export import token_frequencies, write_arrow_index, write_token_freq

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    ids, masks, sample_ids = [], [], []
    for row in index_rows(open_dataset(src)):
        ids.append(torch.from_numpy(row["input_ids"]))
        masks.append(torch.from_numpy(row["loss_mask"]))
        sample_ids.append(row["sample_id"])
    write_token_freq(dest, token_frequencies(ids, masks))
    write_arrow_index(dest, ids, masks, sample_ids)
    return len(ids)
