"""Draw docs/BENCHMARKS.md's charts (docs/img/*.png) from the recorded runs in benchmarks/results/ (issue 46).

The tables in docs/BENCHMARKS.md quote runs; a chart of the same figures is easier to read, but a chart
drawn from numbers typed into a script drifts from the runs it claims to show. So every number here is
parsed from a results file, each chart's title names the files and the dates of the runs it read, and
tests/benchmarks/test_charts.py runs these parsers on the real files: a changed results format fails
that test instead of silently emptying a chart.

    python benchmarks/charts.py                 # rewrite docs/img/*.png   (make charts)
    python benchmarks/charts.py --out DIR       # somewhere else

The parsers need only the standard library; drawing needs matplotlib (the `plots` extra).
"""

from __future__ import annotations

import argparse
import io
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")
RESULTS = REPO / "benchmarks" / "results"
IMG = REPO / "docs" / "img"
REDRAW = "make charts"
DPI = 100

DATE = re.compile(r"\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2})?")
GPU = re.compile(r"\b(H100|H200)\b")
CPU = re.compile(r"\bon CPU\b|\bCPU server\b|\bthis VM\b")  # not 'CPU s', the runs' own CPU time
NUM = r"([0-9.]+(?:e[+-]?\d+)?)"


def first_date(lines: Iterable[str]) -> str | None:
    """The first date (with its time of day where recorded) in these lines: the runs record theirs in headers and comments."""
    for line in lines:
        match = DATE.search(line)
        if match:
            return match.group(0)
    return None


def floats(text: str) -> tuple[float, ...]:
    """Space- or comma-separated numbers, as the results files list per-seed and per-round figures."""
    return tuple(float(x) for x in re.split(r"[,\s]+", text.strip()) if x)


# ---------------------------------------------------------------------------- storage per encoding vs drafter tau

ENC_BYTES = re.compile(r"^(\S+)\s+state bytes per token (\d+) = " + NUM + r" of bf16's (\d+) \(encoding (\S+)\)")
ENC_ERROR = re.compile(r"^(\S+)\s+(aux\d+|final)\s+per-token relative error median " + NUM)
ENC_TAU_MEAN = re.compile(r"^(\S+)\s+tau mean " + NUM + r" over seeds \[([\d, ]+)\]")
ENC_TAU_RATIO = re.compile(r"^(\S+)\s+tau / bf16's tau per seed ([\d. ]+?) \(min ")


@dataclass(frozen=True)
class Encoding:
    """One storage encoding of bench_acceptance --encoding: its bytes, its drafters' tau against bf16's, its state error."""

    name: str
    codec: str
    bytes_per_token: int
    bytes_ratio: float
    tau_ratios: tuple[float, ...]
    error_medians: tuple[float, ...]


@dataclass(frozen=True)
class EncodingRun:
    """The encodings of one recorded run, with the file and date a chart must name."""

    source: str
    date: str
    encodings: tuple[Encoding, ...]


def parse_encodings(path: Path) -> EncodingRun:
    """Read bench_acceptance.py --encoding's output; bf16 is the baseline, so its tau ratio is 1 for each of its seeds by definition."""
    lines = path.read_text().splitlines()
    sizes: dict[str, tuple[int, float, str]] = {}
    errors: dict[str, list[float]] = {}
    ratios: dict[str, tuple[float, ...]] = {}
    seeds: dict[str, int] = {}
    for line in lines:
        if m := ENC_BYTES.match(line):
            sizes[m.group(1)] = (int(m.group(2)), float(m.group(3)), m.group(5))
        elif m := ENC_ERROR.match(line):
            errors.setdefault(m.group(1), []).append(float(m.group(3)))
        elif m := ENC_TAU_MEAN.match(line):
            seeds[m.group(1)] = len(floats(m.group(3)))
        elif m := ENC_TAU_RATIO.match(line):
            ratios[m.group(1)] = floats(m.group(2))
    if "bf16" in seeds:
        ratios.setdefault("bf16", (1.0,) * seeds["bf16"])
    encodings = tuple(
        Encoding(name, codec, size, ratio, ratios[name], tuple(errors.get(name, ())))
        for name, (size, ratio, codec) in sizes.items()
        if name in ratios
    )
    if not encodings:
        raise ValueError(f"{path}: no encoding has both a 'state bytes per token' and a tau ratio line")
    return EncodingRun(path.name, first_date(lines) or "undated", encodings)


# ---------------------------------------------------------------------------- the SGLang version matrix

CHECK_ROW = re.compile(r"^(aux hidden_states\[\d+\]|final \(pre-norm\))" + (r"\s+" + NUM) * 6 + r"\s*$")
CHECK_HEADER = re.compile(r"^layer\s+server med")
STORED = re.compile(r"stored (\S+?);")
PROBE_ROW = re.compile(r"^\s*(\S+)\s+(aux\d+|final)\s+vs (.+?)\s*: median " + NUM + r"\s+max " + NUM + r"\s+\((\d+) rows\)")
RELEASE = re.compile(r"(\d+\.\d+\.\d+)")


@dataclass(frozen=True)
class ErrorCheck:
    """One tested release: per-layer relative error of the served states against a reference, and how far a wrong state would be.

    ``reference`` says what it was compared with: float32 transformers (an independent forward) for the release
    checks, a prefill of the same sequence on the same server for the one-pass checks and probes.
    """

    source: str
    date: str
    release: str
    device: str
    what: str
    reference: str
    medians: tuple[float, ...]
    maxima: tuple[float, ...]
    neighbour_medians: tuple[float, ...]
    transformers_bf16_medians: tuple[float, ...] = ()

    @property
    def label(self) -> str:
        """The chart's row name: release, device, what ran, and the file and date it was read from."""
        return f"{self.release} {self.device} {self.what}\n{self.source}, {self.date}"


def device_of(text: str) -> str:
    """The machine a run names: a lent GPU model, or CPU."""
    match = GPU.search(text)
    if match:
        return match.group(1)
    return "CPU" if CPU.search(text) else "?"


def release_of(path: Path, context: str) -> str:
    """The SGLang release: the one the run's header names after 'SGLang', else the one in the file name."""
    match = re.search(r"SGLang (\d+\.\d+\.\d+)", context) or RELEASE.search(path.stem)
    return match.group(1) if match else "?"


def parse_release_checks(path: Path) -> list[ErrorCheck]:
    """Every error table of a check_server_gpu*.txt file (some hold several runs), each with the header lines above it."""
    lines = path.read_text().splitlines()
    checks: list[ErrorCheck] = []
    context_start = 0
    for i, line in enumerate(lines):
        if not CHECK_HEADER.match(line):
            continue
        rows = [m for m in (CHECK_ROW.match(x) for x in lines[i + 1 : i + 5]) if m]
        context = lines[context_start:i]
        header = "\n".join(context)
        date = next((d for d in (first_date([x]) for x in reversed(context)) if d), "undated")
        stored = STORED.search(lines[i - 1])
        model = "release check, Kimi snapshot" if "kimi" in path.stem else "release check"
        checks.append(
            ErrorCheck(
                source=path.name,
                date=date,
                release=release_of(path, header),
                device=device_of(header) if device_of(header) != "?" else (checks[-1].device if checks else "?"),
                what=f"{model}, {stored.group(1) if stored else 'bf16'}",
                reference="float32 transformers",
                medians=tuple(float(m.group(2)) for m in rows),
                maxima=tuple(float(m.group(3)) for m in rows),
                neighbour_medians=tuple(min(float(m.group(6)), float(m.group(7))) for m in rows),
                transformers_bf16_medians=tuple(float(m.group(4)) for m in rows),
            )
        )
        context_start = i + 1 + len(rows)
    return checks


def parse_one_pass(path: Path) -> ErrorCheck:
    """A one_pass_check / one_pass_probe file: the generated (decode) rows against a prefill of the same sequence on the same server.

    Prompt rows are left out: they are that prefill's own rows (median 0), not the thing tested.
    """
    lines = path.read_text().splitlines()
    same: dict[str, list[tuple[float, float]]] = {}
    others: dict[str, list[float]] = {}
    for line in lines:
        m = PROBE_ROW.match(line)
        if not m or m.group(1) == "prompt":
            continue
        if m.group(3) == "same":
            same.setdefault(m.group(2), []).append((float(m.group(4)), float(m.group(5))))
        else:
            others.setdefault(m.group(2), []).append(float(m.group(4)))
    if not same:
        raise ValueError(f"{path}: no 'vs same' rows of generated states")
    head = "\n".join(lines[:4])
    kind = "one-pass check" if path.stem.startswith("one_pass_check") else "one-pass probe"
    return ErrorCheck(
        source=path.name,
        date=first_date(lines) or "undated",
        release=release_of(path, head),
        device=device_of(head),
        what=kind + (", decode graphs" if "graph" in head.lower() else ", eager decode"),
        reference="prefill on the same server",
        medians=tuple(max(med for med, _ in rows) for rows in same.values()),
        maxima=tuple(max(mx for _, mx in rows) for rows in same.values()),
        neighbour_medians=tuple(min(others[layer]) for layer in same if layer in others),
    )


def version_matrix(results: Path) -> list[ErrorCheck]:
    """Every release check and one-pass run in the results folder, release checks first."""
    checks: list[ErrorCheck] = []
    for path in sorted(results.glob("check_server_gpu*.txt")):
        checks.extend(parse_release_checks(path))
    checks.extend(parse_one_pass(path) for path in sorted(results.glob("one_pass_*.txt")))
    return checks


# ---------------------------------------------------------------------------- regeneration vs the client

RUN_LINE = re.compile(r"^\$ python benchmarks/bench_regenerate\.py")
BEST = re.compile(
    r"^best of (\d+): generation tok/s new "
    + NUM
    + r"(?:, old "
    + NUM
    + r")?, client "
    + NUM
    + r"; wall s new "
    + NUM
    + r"(?:, old "
    + NUM
    + r")?, client "
    + NUM
    + r" \+ prefill "
    + NUM
)
GEN_RATIO = re.compile(r"^\(a\) generation, .*?: " + NUM + r"(?: \(per round: ([\d., ]+); median " + NUM + r"\))?")
END_TO_END = re.compile(r"^\(b\) end to end, .*?: " + NUM + "x")
TURN_ORDER = re.compile(r"^wall_ratio=" + NUM + r" extra_prefill_pct=" + NUM + r" build_tok_s=" + NUM + r" turn_order_tok_s=" + NUM)


@dataclass(frozen=True)
class TurnOrderSummary:
    """A run against the turn-order client on a plain server (one pass's benchmark): its machine-readable last line."""

    wall_ratio: float
    extra_prefill_pct: float
    build_tok_s: float
    turn_order_tok_s: float


@dataclass(frozen=True)
class RegenSummary:
    """A run's summary lines: best-of-N rates and walls, (a) generation vs the client, (b) end to end vs client + prefill."""

    rounds: int
    new_tok_s: float
    old_tok_s: float | None
    client_tok_s: float
    new_wall_s: float
    client_wall_s: float
    prefill_wall_s: float
    generation_ratio: float
    generation_per_round: tuple[float, ...]
    generation_median: float | None
    end_to_end: float


@dataclass(frozen=True)
class RegenRun:
    """One `$ python benchmarks/bench_regenerate.py` block; ``summary`` is None where the run stopped before printing it."""

    source: str
    date: str
    device: str
    summary: RegenSummary | None
    turn_order: TurnOrderSummary | None = None

    @property
    def label(self) -> str:
        """The chart's tick: date and device (the date without its year, to fit)."""
        return f"{self.date[5:]}\n{self.device}"


def parse_summary(block: Sequence[str]) -> RegenSummary | None:
    """The summary of one run's lines, or None unless all three summary lines are there."""
    best = gen = e2e = None
    for line in block:
        best = best or BEST.match(line)
        gen = gen or GEN_RATIO.match(line)
        e2e = e2e or END_TO_END.match(line)
    if not (best and gen and e2e):
        return None
    return RegenSummary(
        rounds=int(best.group(1)),
        new_tok_s=float(best.group(2)),
        old_tok_s=float(best.group(3)) if best.group(3) else None,
        client_tok_s=float(best.group(4)),
        new_wall_s=float(best.group(5)),
        client_wall_s=float(best.group(7)),
        prefill_wall_s=float(best.group(8)),
        generation_ratio=float(gen.group(1)),
        generation_per_round=floats(gen.group(2)) if gen.group(2) else (),
        generation_median=float(gen.group(3)) if gen.group(3) else None,
        end_to_end=float(e2e.group(1)),
    )


def parse_turn_order(block: Sequence[str]) -> TurnOrderSummary | None:
    """The ``wall_ratio=...`` line of a run against the turn-order client, or None (an older run, or one cut short)."""
    for line in block:
        m = TURN_ORDER.match(line)
        if m:
            return TurnOrderSummary(*(float(g) for g in m.groups()))
    return None


def run_blocks(lines: Sequence[str]) -> list[tuple[list[str], list[str]]]:
    """Split a results file into (comment lines before, lines of) each run: a run starts at its `$ python ...` line."""
    starts = [i for i, line in enumerate(lines) if RUN_LINE.match(line)]
    blocks = []
    previous_end = 0
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        body = lines[start:end]
        while body and (body[-1].startswith("#") or not body[-1].strip()):
            body = body[:-1]  # the comments after a run introduce the next one
        blocks.append((list(lines[previous_end:start]), list(body)))
        previous_end = start + len(body)
    return blocks


def parse_regenerate(path: Path) -> list[RegenRun]:
    """Every run of a bench_regenerate results file; a run that names no machine ran on the one of the run before it ('the same')."""
    runs: list[RegenRun] = []
    for before, body in run_blocks(path.read_text().splitlines()):
        device = device_of("\n".join(before + body[:4]))
        if device == "?" and runs:
            device = runs[-1].device
        runs.append(RegenRun(path.name, first_date(body[:1]) or "undated", device, parse_summary(body), parse_turn_order(body)))
    return sorted(runs, key=lambda run: run.date)


# ---------------------------------------------------------------------------- drawing


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display on the machines that redraw these), imported only when drawing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, out: Path) -> Path:
    """Write a small PNG and free the figure: git carries these, so the image is reduced to a 64-colour palette (a third the bytes).

    No timestamp or version goes into the file, so redrawing unchanged figures rewrites the same bytes.
    """
    from PIL import Image  # matplotlib's own dependency

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=DPI, format="png")
    pyplot().close(fig)
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=64)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out, format="PNG", optimize=True)
    return out


def draw_encodings(run: EncodingRun, out: Path) -> Path:
    """Stored bytes per token (relative to bf16) against the drafters' tau relative to bf16's, one point per seed; beside it the state error."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    for enc in run.encodings:
        xs = [enc.bytes_ratio] * len(enc.tau_ratios)
        points = left.scatter(xs, enc.tau_ratios, s=36, label=f"{enc.name} ({enc.bytes_per_token} B/token)")
        left.annotate(enc.name, (enc.bytes_ratio, max(enc.tau_ratios)), textcoords="offset points", xytext=(6, 4), fontsize=8)
        if enc.error_medians:
            right.scatter([enc.bytes_ratio] * len(enc.error_medians), enc.error_medians, s=20, color=points.get_facecolor()[0])
    left.axhline(1.0, color="grey", lw=0.8, ls="--")
    left.set(xlabel="stored state bytes per token / bf16's", ylabel="drafter tau / bf16's tau (one point per seed)")
    left.legend(fontsize=7, loc="lower right")
    right.set(xlabel="stored state bytes per token / bf16's", ylabel="per-token relative error, median", yscale="log")
    right.set_title("state error, one point per layer", fontsize=9)
    fig.suptitle(f"Storage per encoding vs drafter tau: benchmarks/results/{run.source}, run of {run.date}", fontsize=10)
    fig.tight_layout()
    return save(fig, out)


def draw_versions(checks: Sequence[ErrorCheck], out: Path) -> Path:
    """Per tested release, the served states' error (median and max over layers) beside how far a wrong layer or position would be."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(checks) + 1.6))
    colours = {ref: f"C{i}" for i, ref in enumerate(dict.fromkeys(c.reference for c in checks))}
    for y, check in enumerate(checks):
        colour = colours[check.reference]
        ax.hlines(y, min(check.medians), max(check.maxima), color=colour, lw=1)
        ax.scatter([max(check.medians)], [y], marker="o", color=colour)
        ax.scatter([max(check.maxima)], [y], marker="^", color=colour)
        if check.transformers_bf16_medians:
            ax.scatter([max(check.transformers_bf16_medians)], [y], marker="s", facecolors="none", edgecolors="black")
        if check.neighbour_medians:
            ax.scatter([min(check.neighbour_medians)], [y], marker="x", color="red")
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=f"vs {ref}") for ref, c in colours.items()]
    handles += [
        plt.Line2D([], [], color="grey", marker="o", ls="", label="median (largest over layers)"),
        plt.Line2D([], [], color="grey", marker="^", ls="", label="max over rows and layers"),
        plt.Line2D([], [], color="black", marker="s", mfc="none", ls="", label="transformers' own bf16, median"),
        plt.Line2D([], [], color="red", marker="x", ls="", label="nearest wrong layer/position, median"),
    ]
    ax.set_yticks(range(len(checks)), [c.label for c in checks], fontsize=6.5)
    ax.invert_yaxis()
    ax.set(xscale="log", xlabel="per-token relative error |x' - x| / |x| (log)")
    ax.legend(handles=handles, fontsize=7, loc="lower left", bbox_to_anchor=(1.01, 0.0))
    dates = sorted({c.date[:10] for c in checks})
    ax.set_title(
        f"SGLang releases on GPU and CPU: benchmarks/results/check_server_gpu*.txt, one_pass_*.txt, runs {dates[0]} to {dates[-1]}",
        fontsize=9,
    )
    fig.tight_layout()
    return save(fig, out)


def by_source(done: Sequence[tuple[RegenRun, T]], axes: Sequence[Any]) -> Iterator[tuple[bool, list[int], list[T]]]:
    """``done``'s runs grouped by results file (one machine kind each), with their x positions: (first group?, xs,
    items). Each group after the first gets a dotted line before it on every axis, and series are drawn per group, so
    no line joins a CPU run to an H200 run: side by side they are not a trend."""
    for n, source in enumerate(dict.fromkeys(run.source for run, _ in done)):
        group = [(x, item) for x, (run, item) in enumerate(done) if run.source == source]
        xs = [x for x, _ in group]
        if n:
            for ax in axes:
                ax.axvline(xs[0] - 0.5, color="grey", lw=0.6, ls=":")
        yield n == 0, xs, [item for _, item in group]


def draw_regenerate(runs: Sequence[RegenRun], out: Path) -> Path:
    """Per recorded run: build vs the plain client (end to end and generation), and the generation rates they reached.

    Runs are grouped by results file (one machine kind each), lines joining only runs of the same file: a CPU run
    and an H200 run side by side are not a trend.
    """
    plt = pyplot()
    done = [(run, run.summary) for run in runs if run.summary]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.4), sharex=True)
    for label, xs, group in by_source(done, (top, bottom)):  # label: one legend entry per series
        top.plot(xs, [s.end_to_end for s in group], "o-", color="C0", label="(b) build wall / (client wall + prefill)" if label else None)
        gen = [s.generation_median or s.generation_ratio for s in group]
        top.plot(
            xs,
            gen,
            "s--",
            color="C1",
            label="(a) build / client generation, per-round median (best round where none recorded)" if label else None,
        )
        bottom.plot(xs, [s.new_tok_s for s in group], "o-", color="C0", label="build --regenerate" if label else None)
        bottom.plot(xs, [s.client_tok_s for s in group], "s-", color="C1", label="plain client" if label else None)
        olds = [(x, s.old_tok_s) for x, s in zip(xs, group) if s.old_tok_s]
        bottom.plot([x for x, _ in olds], [v for _, v in olds], "^", color="C2", label="old windowed engine" if label else None)
    top.axhline(1.0, color="grey", lw=0.8)
    top.set(ylabel="ratio")
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, 1.0), ncol=1, framealpha=0.8)
    top.margins(y=0.35)
    bottom.set(ylabel="generation tok/s, best round (log)", yscale="log")
    bottom.legend(fontsize=7, loc="center left")
    bottom.set_xticks(range(len(done)), [run.label for run, _ in done], fontsize=7)
    skipped = [run for run in runs if not run.summary]
    note = f"; {len(skipped)} runs without (a)/(b) lines left out (against the turn-order client: the next chart)" if skipped else ""
    sources = ", ".join(dict.fromkeys(f"benchmarks/results/{run.source}" for run, _ in done))
    fig.suptitle(f"Regeneration vs the plain client: {sources}\nruns {done[0][0].date} to {done[-1][0].date}{note}", fontsize=9)
    fig.tight_layout()
    return save(fig, out)


def draw_one_pass(runs: Sequence[RegenRun], out: Path, target: float = 1.05) -> Path:
    """Per run against the turn-order client: the build's wall over the client's (the issue's target beside it), and the
    generation rates both reached; lines join only runs of one results file (one machine kind)."""
    plt = pyplot()
    done = [(run, run.turn_order) for run in runs if run.turn_order]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.0), sharex=True)
    for label, xs, group in by_source(done, (top, bottom)):
        top.plot(xs, [t.wall_ratio for t in group], "o-", color="C0", label="build wall / turn-order client wall" if label else None)
        bottom.plot(xs, [t.build_tok_s for t in group], "o-", color="C0", label="build --regenerate (one pass)" if label else None)
        bottom.plot(xs, [t.turn_order_tok_s for t in group], "s-", color="C1", label="turn-order client, plain server" if label else None)
    top.axhline(1.0, color="grey", lw=0.8)
    top.axhline(target, color="red", lw=0.8, ls="--", label=f"target {target:.2f}x")
    top.set(ylabel="ratio")
    top.legend(fontsize=7, loc="upper left")
    top.margins(y=0.3)
    bottom.set(ylabel="generation tok/s, best round (log)", yscale="log")
    bottom.legend(fontsize=7, loc="center left")
    bottom.set_xticks(range(len(done)), [run.label for run, _ in done], fontsize=7)
    sources = ", ".join(dict.fromkeys(run.source for run, _ in done))
    title = f"One pass vs the turn-order client on a plain server, runs {done[0][0].date} to {done[-1][0].date}"
    fig.suptitle(f"{title}\nfrom benchmarks/results/: {sources}", fontsize=9)
    fig.tight_layout()
    return save(fig, out)


def draw_all(results: Path, out_dir: Path) -> list[Path]:
    """Parse the results folder and draw the four charts docs/BENCHMARKS.md carries."""
    regen = parse_regenerate(results / "bench_regenerate_cpu.txt") + parse_regenerate(results / "bench_regenerate_gpu.txt")
    return [
        draw_encodings(parse_encodings(results / "bench_acceptance_encodings.txt"), out_dir / "encodings_tau.png"),
        draw_versions(version_matrix(results), out_dir / "version_matrix.png"),
        draw_regenerate(regen, out_dir / "regenerate_vs_client.png"),
        draw_one_pass(regen, out_dir / "one_pass_vs_turn_order.png"),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """Redraw the charts; prints the files written."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results folder to read (default: benchmarks/results)")
    parser.add_argument("--out", type=Path, default=IMG, help="where the PNGs go (default: docs/img)")
    args = parser.parse_args(argv)
    for path in draw_all(args.results, args.out):
        print(path)


if __name__ == "__main__":
    main()
