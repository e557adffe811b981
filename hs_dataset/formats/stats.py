"""Dataset statistics and pictures: lengths, supervision, and per-layer state scales.

``compute_stats(dir)`` streams once over a dataset (through the one reader, a few
thousand tokens at a time, in float32) and returns :class:`DatasetStats`:

* per sample: its length and how many tokens carry loss (``loss_mask``);
* per captured state (each aux layer, in ``aux_layer_ids`` order, and the final
  state): the RMS over all tokens, the largest ``|x|``, every sample's own RMS, how
  many tokens are exactly all-zero and how many hold NaN/inf.

A layer captured from the wrong place, or a capture that returned zeros, stands out:
its RMS is off the others' scale or 0, and ``zero_tokens`` counts the dead tokens.

``write_plots(dir, out_dir)`` draws ``lengths.png`` (histograms of sample lengths and
supervised tokens per sample) and ``layer_stats.png`` (RMS per layer with the spread
of per-sample RMS, and max ``|x|`` per layer on a log scale; layers with all-zero
tokens are drawn red and annotated). Used by ``hs-dataset info --plots DIR`` and by
``hs-dataset push`` (the PNGs go into the dataset card). Needs matplotlib (the
``plots`` extra).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hs_dataset.errors import HsDatasetError, UsageError

__all__ = ["PLOT_FILES", "DatasetStats", "LayerStats", "PlotsUnavailable", "compute_stats", "write_plots"]

PLOT_FILES = ("lengths.png", "layer_stats.png")


class PlotsUnavailable(HsDatasetError, RuntimeError):
    """matplotlib is not installed."""


@dataclass
class LayerStats:
    """Scale statistics of one stored state (an aux layer or the final state)."""

    name: str  # "hidden_states[2]" or "final (pre_norm)"
    layer: int | None  # the HF hidden_states index, None for the final state
    tokens: int = 0
    rms: float = 0.0  # sqrt(mean(x^2)) over every element of every token
    max_abs: float = 0.0
    zero_tokens: int = 0  # tokens whose whole state vector is exactly 0
    nonfinite_tokens: int = 0  # tokens with any NaN/inf
    sample_rms: list[float] = field(default_factory=list)

    @property
    def suspicious(self) -> bool:
        return self.zero_tokens > 0 or self.nonfinite_tokens > 0 or not self.rms > 0

    def to_json(self) -> dict[str, Any]:
        raw = asdict(self)
        raw.pop("sample_rms")
        raw["sample_rms_min"] = min(self.sample_rms) if self.sample_rms else None
        raw["sample_rms_max"] = max(self.sample_rms) if self.sample_rms else None
        return raw


@dataclass
class DatasetStats:
    samples: int
    tokens: int
    lengths: list[int]
    supervised: list[int]
    layers: list[LayerStats]
    complete: bool  # False when max_samples stopped the scan early

    @property
    def supervised_tokens(self) -> int:
        return sum(self.supervised)

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "tokens": self.tokens,
            "supervised_tokens": self.supervised_tokens,
            "complete": self.complete,
            "layers": [layer.to_json() for layer in self.layers],
        }


def compute_stats(dataset_dir: str | os.PathLike, *, max_samples: int | None = None, chunk_tokens: int = 2048) -> DatasetStats:
    """One streaming pass over ``dataset_dir`` (all samples, or the first ``max_samples``)."""
    import torch

    from hs_dataset.formats.reader import open_dataset

    ds = open_dataset(dataset_dir)
    md = ds.manifest.metadata
    aux_ids = list(md.aux_layer_ids or ())
    final_kind = md.final_state or "pre_norm"
    layers = [LayerStats(f"hidden_states[{i}]", int(i)) for i in aux_ids] + [LayerStats(f"final ({final_kind})", None)]
    n_layers = len(layers)
    sumsq = torch.zeros(n_layers, dtype=torch.float64)
    maxabs = torch.zeros(n_layers, dtype=torch.float64)
    zeros = torch.zeros(n_layers, dtype=torch.int64)
    nonfinite = torch.zeros(n_layers, dtype=torch.int64)
    elements = torch.zeros(n_layers, dtype=torch.float64)
    lengths: list[int] = []
    supervised: list[int] = []
    complete = True
    for shard_index in range(len(ds.manifest.shards)):
        reader = ds.shard(shard_index)
        for i in range(len(reader)):
            if max_samples is not None and len(lengths) >= max_samples:
                complete = False
                break
            item = reader.sample(i)
            tokens = int(item["input_ids"].shape[0])
            lengths.append(tokens)
            supervised.append(int(item["loss_mask"].sum()))
            s_sumsq = torch.zeros(n_layers, dtype=torch.float64)
            for begin in range(0, tokens, chunk_tokens):
                aux = item["aux_hidden_states"][begin : begin + chunk_tokens].float()  # [t, K, H]
                final = item["final_hidden_state"][begin : begin + chunk_tokens].float().unsqueeze(1)  # [t, 1, H]
                x = torch.cat([aux, final], dim=1)  # [t, K+1, H]
                finite = torch.isfinite(x)
                nonfinite += (~finite).any(dim=-1).sum(dim=0)
                x = torch.where(finite, x, torch.zeros((), dtype=x.dtype))
                s_sumsq += (x.double() ** 2).sum(dim=(0, 2))
                maxabs = torch.maximum(maxabs, x.abs().amax(dim=(0, 2)).double())
                zeros += (x == 0).all(dim=-1).sum(dim=0)
            hidden = item["final_hidden_state"].shape[-1]
            sumsq += s_sumsq
            elements += tokens * hidden
            for k, layer in enumerate(layers):
                layer.sample_rms.append(math.sqrt(float(s_sumsq[k]) / (tokens * hidden)))
        else:
            continue
        break
    for k, layer in enumerate(layers):
        layer.tokens = sum(lengths)
        layer.rms = math.sqrt(float(sumsq[k] / elements[k])) if float(elements[k]) else 0.0
        layer.max_abs = float(maxabs[k])
        layer.zero_tokens = int(zeros[k])
        layer.nonfinite_tokens = int(nonfinite[k])
    return DatasetStats(len(lengths), sum(lengths), lengths, supervised, layers, complete)


def write_plots(
    dataset_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    stats: DatasetStats | None = None,
    max_samples: int | None = None,
    replace: bool = False,
) -> list[Path]:
    """Write ``lengths.png`` and ``layer_stats.png`` into ``out_dir``; returns their paths.

    ``out_dir`` may be the user's own directory: a file (or link) already there under
    one of those names is refused, never replaced, unless ``replace`` (the push's own
    work directory). Each figure is drawn into a temp file and linked to its name, so a
    file created meanwhile is not replaced either. The PNGs are deterministic for the
    same data and matplotlib version (no timestamps), so re-pushing a dataset does not
    re-upload its figures.
    """
    out = Path(out_dir)
    if not replace:
        _refuse_existing(out)
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable("plots need matplotlib: pip install 'hs_dataset[plots]' (or pip install matplotlib)") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if stats is None:
        stats = compute_stats(dataset_dir, max_samples=max_samples)
    out.mkdir(parents=True, exist_ok=True)
    scope = "" if stats.complete else f" (first {stats.samples} samples)"
    paths = []
    with plt.style.context("default"), matplotlib.rc_context({"font.size": 9}):
        # ---- lengths
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=100)
        bins = min(50, max(5, int(math.sqrt(max(stats.samples, 1))) * 2))
        ax1.hist(stats.lengths or [0], bins=bins, color="#4C72B0", edgecolor="white")
        ax1.set_title(f"sample length{scope}: {stats.samples} samples, {stats.tokens:,} tokens")
        ax1.set_xlabel("tokens per sample")
        ax1.set_ylabel("samples")
        ax2.hist(stats.supervised or [0], bins=bins, color="#55A868", edgecolor="white")
        share = stats.supervised_tokens / stats.tokens if stats.tokens else 0.0
        ax2.set_title(f"supervised tokens (loss_mask): {stats.supervised_tokens:,} ({share:.0%})")
        ax2.set_xlabel("supervised tokens per sample")
        ax2.set_ylabel("samples")
        for ax in (ax1, ax2):
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        path = _save_figure(fig, out / PLOT_FILES[0], replace)
        plt.close(fig)
        paths.append(path)

        # ---- per-layer scale
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=100)
        names = [f"hs[{layer.layer}]" if layer.layer is not None else layer.name.replace(" (", "\n(") for layer in stats.layers]
        colors = ["#C44E52" if layer.suspicious else "#4C72B0" for layer in stats.layers]
        xs = list(range(len(stats.layers)))
        ax1.bar(xs, [layer.rms for layer in stats.layers], color=colors, alpha=0.35, label="RMS over all tokens")
        spreads = [layer.sample_rms or [0.0] for layer in stats.layers]
        ax1.boxplot(spreads, positions=xs, widths=0.5, showfliers=True)
        ax1.set_xticks(xs, names)
        ax1.set_ylabel("RMS")
        ax1.set_title(f"state RMS per layer (boxes: per-sample RMS){scope}")
        ax1.legend(loc="upper left")
        floor = min([layer.max_abs for layer in stats.layers if layer.max_abs > 0] or [1.0]) / 10
        ax2.bar(xs, [max(layer.max_abs, floor) for layer in stats.layers], color=colors)
        ax2.set_yscale("log")
        ax2.set_ylim(floor, max([layer.max_abs for layer in stats.layers] + [floor]) * 4)
        ax2.set_xticks(xs, names)
        ax2.set_ylabel("max |x|")
        ax2.set_title("largest |x| per layer (red: all-zero or NaN tokens)")
        for x, layer in zip(xs, stats.layers):
            notes = []
            if not layer.max_abs > 0:
                notes.append("ALL ZERO")
            elif layer.zero_tokens:
                notes.append(f"{layer.zero_tokens} all-zero tokens")
            if layer.nonfinite_tokens:
                notes.append(f"{layer.nonfinite_tokens} NaN/inf tokens")
            if notes:
                ax2.annotate("\n".join(notes), (x, max(layer.max_abs, floor)), ha="center", va="bottom", color="#C44E52", fontsize=8)
        fig.tight_layout()
        path = _save_figure(fig, out / PLOT_FILES[1], replace)
        plt.close(fig)
        paths.append(path)
    return paths


def _refuse_existing(out: Path) -> None:
    for name in PLOT_FILES:
        if os.path.lexists(out / name):
            raise UsageError(f"{out / name} already exists; --plots never replaces a file: remove it or choose another directory")


def _save_figure(fig: Any, path: Path, replace: bool) -> Path:
    """Draw ``fig`` into a temp file beside ``path``, then give it the name (``replace`` or no-clobber link)."""
    from hs_dataset.formats.atomic import remove_quietly, temp_path_for

    temp = temp_path_for(path)
    try:
        fig.savefig(temp, format="png", metadata={"Software": None})
        if replace:
            os.replace(temp, path)
        else:
            try:
                os.link(temp, path)
            except FileExistsError:
                raise UsageError(
                    f"{path} appeared while the figure was drawn; --plots never replaces a file: remove it or choose another directory"
                ) from None
    finally:
        remove_quietly(temp)
    return path
