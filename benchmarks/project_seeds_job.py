"""The seeds' job projected onto one TP8 node from what was measured here: terabytes per encoding, hours with and
without one pass. A projection, not a measurement: every input that no run here produced is printed as an assumption.

What is exact: the bytes a token's states take in each encoding (``codecs/registry.py``: the stored rows, scales
included, times the card's states), so the terabytes follow from the token count alone. What is measured, on one
lent H100 with an 8-layer Kimi-wide stand-in (``benchmarks/results/bench_regenerate_gpu.txt``): one pass's wall
against generation alone (the last ``wall_ratio=`` line there). What is assumed: the node's generation and prefill
rates for Kimi-K2.5 (no TP8 node was lent), the seeds' split into prompt and answer tokens (the issue's figures),
and that one pass costs the same share of a TP8 node's step as of the H100's.

Hours:

* generation alone = answer tokens / decode rate + prompt tokens / prefill rate (what a user runs anyway);
* one pass = generation alone x the measured one-pass ratio;
* prefill capture (no one pass) = generation alone + every stored token prefilled once more at the prefill rate
  (the second pass one pass removes).

    python benchmarks/project_seeds_job.py [--decode-tok-s 5000 10000 20000] [--prefill-tok-s 20000]
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hs_dataset.codecs.registry import ENCODINGS  # noqa: E402
from hs_dataset.config import load_card  # noqa: E402
from hs_dataset.dtypes import dtype_info  # noqa: E402

GPU_RESULTS = REPO / "benchmarks" / "results" / "bench_regenerate_gpu.txt"
KIMI_CARD = REPO / "cards" / "kimi-k25-sglang.yaml"
KIMI_HIDDEN = 7168  # Kimi-K2.5's text model (shared/reference: the real config)
IDS_MASK_BYTES = dtype_info("int64").itemsize + dtype_info("bool").itemsize  # a token's input_ids and loss_mask (sample.py)
STATE_ENCODINGS = ("bf16", "fp8_e4m3_per_token", "nf4_g32", "mxfp4_e2m1_g32")


@dataclass(frozen=True)
class Job:
    """The seeds' job (issue 48): 10K samples, 17.3M tokens, about 1.4k of a sample's 1.7k tokens a regenerated answer."""

    samples: int = 10_000
    tokens: float = 17.3e6
    answer_tokens_per_sample: float = 1_400

    @property
    def answer_tokens(self) -> float:
        return self.samples * self.answer_tokens_per_sample

    @property
    def prompt_tokens(self) -> float:
        return self.tokens - self.answer_tokens


def token_bytes(encoding: str, states: int, hidden: int = KIMI_HIDDEN) -> int:
    """Stored bytes of one token: its states in ``encoding`` (scales included), its id and its mask bit."""
    return states * ENCODINGS[encoding].row_bytes(hidden) + IDS_MASK_BYTES


def card_states(card_path: Path = KIMI_CARD) -> int:
    """How many states a token stores under the card: its aux layers and the final state, if kept."""
    layers = load_card(card_path).layers
    return len(layers.aux) + (1 if layers.final else 0)


def measured_one_pass_ratio(results: Path = GPU_RESULTS) -> tuple[float, str]:
    """The last one-pass wall ratio in the GPU results, and the date line it follows."""
    text = results.read_text()
    ratios = re.findall(r"^wall_ratio=([0-9.]+)", text, flags=re.M)
    if not ratios:
        raise SystemExit(f"{results}: no 'wall_ratio=' line: run scripts/gpu/run_regenerate.sh on a GPU first")
    dated = re.findall(r"# (\d{4}-\d\d-\d\d \d\d:\d\d) UTC", text[: text.rfind("wall_ratio=")])
    return float(ratios[-1]), dated[-1] if dated else "undated"


def hours(job: Job, decode_tok_s: float, prefill_tok_s: float, one_pass_ratio: float) -> dict[str, float]:
    generation = job.answer_tokens / decode_tok_s + job.prompt_tokens / prefill_tok_s
    return {
        "generation alone": generation / 3600,
        "one pass": generation * one_pass_ratio / 3600,
        "prefill capture": (generation + job.tokens / prefill_tok_s) / 3600,
    }


def report(job: Job, decode_rates: list[float], prefill_tok_s: float, states: int, ratio: float, ratio_when: str) -> str:
    lines = [
        f"the seeds' job: {job.samples:,} samples, {job.tokens / 1e6:.1f}M tokens: {job.answer_tokens / 1e6:.1f}M regenerated "
        f"answer tokens ({job.answer_tokens_per_sample:,.0f} a sample), {job.prompt_tokens / 1e6:.1f}M prompt tokens (assumed, issue 48)",
        f"states a token: {states} of hidden {KIMI_HIDDEN} (cards/kimi-k25-sglang.yaml), plus its id and mask ({IDS_MASK_BYTES} B)",
        f"one pass: {ratio:.3f}x generation alone (measured {ratio_when} UTC, one H100, 8-layer Kimi-wide model, "
        f"benchmarks/results/bench_regenerate_gpu.txt; assumed to hold on a TP8 node)",
        f"node rates (assumed, not measured here): prefill {prefill_tok_s:,.0f} tok/s; decode "
        + ", ".join(f"{r:,.0f}" for r in decode_rates)
        + " tok/s at the job's batch",
        "",
        f"{'encoding':20s} {'B/token':>8s} {'TB':>7s}  GB/s written over the one-pass hours at each decode rate",
    ]
    one_pass_s = [hours(job, r, prefill_tok_s, ratio)["one pass"] * 3600 for r in decode_rates]
    for enc in STATE_ENCODINGS:
        b = token_bytes(enc, states)
        rates = "  ".join(f"{job.tokens * b / s / 1e9:5.2f}" for s in one_pass_s)
        lines.append(f"{enc:20s} {b:8,d} {job.tokens * b / 1e12:7.2f}  {rates}")
    seeds_gib = job.tokens * token_bytes("bf16", states) / 2**30
    lines.append(f"(bf16 cross-check: the seeds' own run stored 924 GB; the bytes above make {seeds_gib:,.0f} GiB)")
    lines += ["", f"{'decode tok/s':>12s} {'generation alone h':>19s} {'one pass h':>11s} {'prefill capture h':>18s}"]
    for r in decode_rates:
        h = hours(job, r, prefill_tok_s, ratio)
        lines.append(f"{r:12,.0f} {h['generation alone']:19.2f} {h['one pass']:11.2f} {h['prefill capture']:18.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decode-tok-s", type=float, nargs="+", default=[5_000, 10_000, 20_000], help="assumed node decode rates")
    ap.add_argument("--prefill-tok-s", type=float, default=20_000, help="assumed node prefill rate")
    ap.add_argument("--results", type=Path, default=GPU_RESULTS, help="GPU results holding the measured one-pass ratio")
    args = ap.parse_args(argv)
    ratio, when = measured_one_pass_ratio(args.results)
    print(report(Job(), args.decode_tok_s, args.prefill_tok_s, card_states(), ratio, when))
    return 0


if __name__ == "__main__":
    sys.exit(main())
