"""Which layers each drafter family reads, derived from the model's layer count: the card's ``layers.preset``.

Every id here is an HF ``hidden_states`` index (``0`` the embedding output, ``i`` the
output of decoder layer ``i - 1``), the card's and the manifest's convention, which is
also speculators' ``--target-layer-ids`` convention. The final state (id ``L``) is
stored separately and is never an aux id. A preset's rule and where it comes from are
in :data:`LAYER_PRESETS` (docs/CARDS.md renders them); speculators' ``speculator_type``
of the same name trains on what the preset captures.

Small models, where a rule's ids collide or fall outside ``1..L-1``, get the nearest
distinct ids (repeats moved up, then down from the top); a model with fewer layer
outputs than taps is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "DEFAULT_TAPS",
    "LAYER_PRESETS",
    "PRESET_NAMES",
    "TAPPED_PRESETS",
    "LayerPreset",
    "dflash2_aux_layers",
    "dflash_aux_layers",
    "eagle3_default_aux_layers",
    "preset_aux_layers",
]

DEFAULT_TAPS = 5  # the published DFlash / DFlash2 recipes tap five layers


def eagle3_default_aux_layers(num_layers: int) -> list[int]:
    """The EAGLE-3 default aux layers as HF ``hidden_states`` indexes: ``[2, L // 2, L - 3]``.

    Both trainers agree once their index conventions are aligned:

    * speculators 0.9 (``speculators/models/utils.py`` ``resolve_target_layer_ids``)
      defaults to ``[2, L // 2, L - 3]`` in vLLM's convention, where id ``i`` is the
      residual stream *entering* decoder layer ``i`` = the output of layer ``i - 1`` =
      HF ``hidden_states[i]`` (it also accepts ``L``, the final state, as HF does).
    * SpecForge 0.2 (``specforge/algorithms/model_providers.py``
      ``resolve_eagle_capture_layers``) defaults to ``[1, L // 2 - 1, L - 4]`` in
      SGLang's convention, where id ``i`` is the *output* of decoder layer ``i``
      (SGLang captures before layer ``i + 1``) = HF ``hidden_states[i + 1]``: the same
      ``[2, L // 2, L - 3]`` after the +1 shift.

    Kimi-K2.5 (61 layers): ``[2, 30, 58]``. Small test models, where the rule's ids
    collide (6 layers: ``[2, 3, 3]``), get each repeat moved one layer up
    (``[2, 3, 4]``); models too small for three ids get ``[0, .., L - 1]``.
    """
    _check_layers(num_layers)
    ids: list[int] = []
    for wanted in sorted(max(0, i) for i in (2, num_layers // 2, num_layers - 3)):
        ids.append(max(wanted, ids[-1] + 1) if ids else wanted)
    return ids if ids[-1] < num_layers else list(range(num_layers))


def dflash_aux_layers(num_layers: int, taps: int = DEFAULT_TAPS) -> list[int]:
    """DFlash's published rule: ``taps`` layer outputs evenly spread over ``[1, L - 3]``, as HF ids.

    z-lab's ``build_target_layer_ids`` (mirrored by SGLang's DFlash worker) picks layer
    outputs ``round(1 + i * (L - 4) / (taps - 1))`` (one tap: ``L // 2``); a layer
    output ``j`` is HF ``hidden_states[j + 1]`` (speculators' DFlash converter adds the
    same 1). Qwen3-8B (36 layers): outputs ``[1, 9, 17, 25, 33]``, HF ``[2, 10, 18, 26, 34]``.
    """
    _check_layers(num_layers)
    _check_taps(taps)
    outputs = [num_layers // 2] if taps == 1 else [round(1 + i * (num_layers - 4) / (taps - 1)) for i in range(taps)]
    return _distinct([j + 1 for j in outputs], num_layers)


def dflash2_aux_layers(num_layers: int, taps: int = DEFAULT_TAPS) -> list[int]:
    """The DFlash2 recipe's taps: ``taps`` layer outputs at one stride, the last at ``L - 3``, as HF ids.

    SpecForge PR #869's DFlash2 recipe taps layer outputs 5/19/33/47/61 of a 64-layer
    model: the last at ``L - 3`` as DFlash's, then back at a stride of 14 rather than
    DFlash's 15 (``[1, 16, 31, 46, 61]``), so the first tap skips the first layers. The
    stride ``round((L - 3) / (taps - 1/2))`` gives exactly those taps; it is fitted to
    that one published recipe. HF ids (+1): ``[6, 20, 34, 48, 62]``.
    """
    _check_layers(num_layers)
    _check_taps(taps)
    last = num_layers - 3
    stride = max(1, round(last / (taps - 0.5)))
    return _distinct([last - (taps - 1 - i) * stride + 1 for i in range(taps)], num_layers)


def _check_layers(num_layers: int) -> None:
    if num_layers < 1:
        raise ValueError(f"a model needs at least one decoder layer, got num_hidden_layers={num_layers}")


def _check_taps(taps: int) -> None:
    if taps < 1:
        raise ValueError(f"a DFlash-family preset taps at least one layer, got taps={taps}")


def _distinct(ids: list[int], num_layers: int) -> list[int]:
    """The nearest ascending, distinct ids in ``1..L-1`` (layer outputs below the final state)."""
    low, high = 1, num_layers - 1
    if len(ids) > high - low + 1:
        raise ValueError(
            f"{len(ids)} taps do not fit a {num_layers}-layer model: it has {max(0, high - low + 1)} layer outputs "
            f"below the final state (HF hidden_states 1..{high}); ask for fewer taps"
        )
    out = sorted(ids)
    for i in range(len(out)):
        out[i] = max(out[i], low if i == 0 else out[i - 1] + 1)
    for i in reversed(range(len(out))):
        out[i] = min(out[i], high if i == len(out) - 1 else out[i + 1] - 1)
    return out


@dataclass(frozen=True)
class LayerPreset:
    """One drafter family's layers: the rule (``L`` layers, ``taps``) and where it comes from."""

    name: str
    families: str
    rule: str
    source: str
    ids: Callable[[int, int], list[int]]
    tapped: bool = False  # takes ``layers.taps``

    def aux_layers(self, num_layers: int, taps: int | None = None) -> list[int]:
        return self.ids(num_layers, DEFAULT_TAPS if taps is None else taps)


_EAGLE3_SOURCE = "speculators 0.9.0 `resolve_target_layer_ids` (`speculators/models/utils.py`); SpecForge's default, +1"
_DFLASH_SOURCE = "z-lab DFlash `build_target_layer_ids`, also SGLang's DFlash worker; layer output j = HF j+1"

LAYER_PRESETS: dict[str, LayerPreset] = {
    preset.name: preset
    for preset in (
        LayerPreset(
            "eagle3",
            "EAGLE-3 and Eagle 3.1 (speculators `eagle3`)",
            "`[2, L//2, L-3]`",
            _EAGLE3_SOURCE,
            lambda layers, _taps: eagle3_default_aux_layers(layers),
        ),
        LayerPreset(
            "peagle",
            "P-EAGLE (`peagle`)",
            "as `eagle3`: `[2, L//2, L-3]`",
            _EAGLE3_SOURCE + " (P-EAGLE reads the EAGLE-3 data)",
            lambda layers, _taps: eagle3_default_aux_layers(layers),
        ),
        LayerPreset(
            "dflash",
            "DFlash (`dflash`)",
            "`taps` layer outputs `round(1 + i(L-4)/(taps-1))`, +1",
            _DFLASH_SOURCE,
            dflash_aux_layers,
            tapped=True,
        ),
        LayerPreset(
            "dflash2",
            "DFlash2 (`dflash2`)",
            "`taps` layer outputs `L-3 - (taps-1-i)·round((L-3)/(taps-½))`, +1",
            "SpecForge PR #869's DFlash2 recipe (taps 5/19/33/47/61 of 64 layers), the stride fitted to it",
            dflash2_aux_layers,
            tapped=True,
        ),
        LayerPreset(
            "dspark",
            "DSpark (`dspark`)",
            "as `dflash`",
            _DFLASH_SOURCE + " (DSpark extends the DFlash draft)",
            dflash_aux_layers,
            tapped=True,
        ),
        LayerPreset(
            "xpress",
            "XPress (`xpress`)",
            "as `dflash`",
            _DFLASH_SOURCE + " (XPress extends the DFlash draft)",
            dflash_aux_layers,
            tapped=True,
        ),
        LayerPreset(
            "mtp",
            "MTP fine-tune (`mtp`)",
            "`[]`: the final state only",
            "speculators 0.9.0 `MTPDraftModel.target_layer_ids` is `[L]` (`speculators/models/mtp/core.py`)",
            lambda _layers, _taps: [],
        ),
    )
}
PRESET_NAMES = tuple(LAYER_PRESETS)
TAPPED_PRESETS = tuple(name for name, preset in LAYER_PRESETS.items() if preset.tapped)


def preset_aux_layers(name: str, num_layers: int, taps: int | None = None) -> list[int]:
    """The aux layers (HF ``hidden_states`` ids) preset ``name`` captures on an ``num_layers``-layer model."""
    return LAYER_PRESETS[name].aux_layers(num_layers, taps)
