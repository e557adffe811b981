"""Proof by training: a drafter trained on our data speeds up its target; broken data does not.

The trained tiny verifier (``tests/fixtures/tiny_verifier.py``) writes its own greedy answers to
task prompts through ``build_dataset`` (HF backend, regenerate); broken copies of that
dataset are written with ``ShardWriter``; speculators' own trainer trains a 1-layer
EAGLE-3 drafter on each (same seed, same steps); on held-out prompts we measure
per-depth top-1 agreement and tau of a greedy draft-and-verify loop (checked equal to
plain greedy). Repeated for each drafter seed; the last line is the mean over seeds.

    python benchmarks/bench_acceptance.py [--seeds 0 1] [--epochs 8] [--samples 192] [--sglang]
    python benchmarks/bench_acceptance.py --encoding fp8 mxfp4 nf4

``--encoding E [E ...]``: instead of the broken copies, the same samples stored in bf16
(the tiny verifier captures float32: ``ours``) and with each storage encoding (written
by ``ShardWriter``, read back by the reader the trainer uses); drafters trained on each
with the same seeds and batches. Prints tau side by side with its ratio to bf16's, the
stored state bytes per token (scales included) against bf16's, and each layer's
per-token relative error distribution against the captured float32 states.

``--sglang`` also runs SGLang 0.5.23's own EAGLE-3 speculative decoding (real CPU server,
``.sglang-venv``, chain of ``k`` drafts) with a drafter trained on our data, and prints the
accept length SGLang reports next to our loop's tau for the same drafter and prompts.
SGLang's draft layer has no ``norm_before_residual`` (speculators' default), so that
drafter is trained with ``--no-norm-before-residual`` (see ``tests/fixtures/acceptance.py`` ``sglang_draft_dir``).

``--one-pass``: the verifier served on a real CPU SGLang server planned as ``hs-dataset serve``
plans it (capture hooks, prefix cache on), and ``build --regenerate`` run twice on the same
prompts against it: ``regenerate.capture: one_pass`` (states kept while the server generates)
and ``prefill`` (each finished conversation prefilled again). Checks from each manifest's
``captured_by`` that each build captured the way it was asked, that both hold the same
input_ids/loss_mask per sample (greedy answers, one template: the same regenerated turns),
prints the max abs difference of their states, and trains drafters on each with the same seeds
and batches: tau side by side, one_pass / prefill per seed and of the means.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.fixtures


def _table(name: str, score) -> str:
    depths = " ".join(f"{h / max(1, t):.2f}" for h, t in zip(score.hits.tolist(), score.tries.tolist()))
    return f"{name:12s} agreement@1..k {depths}   tau {score.tau:.2f}   greedy-exact {score.exact}"


def _percentiles(errors) -> str:
    import torch

    q = torch.quantile(errors, torch.tensor([0.5, 0.9, 0.99]))
    return f"median {q[0]:.4f} p90 {q[1]:.4f} p99 {q[2]:.4f} max {errors.max():.4f}"


def _encoding_report(A, datasets: dict, encodings: list[str]) -> None:
    """Bytes per token of the stored states (scales included) and per-layer error of each encoded copy."""
    from hs_dataset.codecs.registry import get_encoding
    from hs_dataset.formats.reader import open_dataset

    def state_bytes(path) -> float:
        manifest = open_dataset(path).manifest
        encoding = get_encoding(manifest.tensors["aux_hidden_states"]["encoding"])
        return (len(manifest.aux_layer_ids) + 1) * encoding.row_bytes(manifest.hidden_size)

    base = state_bytes(datasets["bf16"])
    for name in ["bf16", *encodings]:
        stored = state_bytes(datasets[name])
        print(
            f"{name:12s} state bytes per token {stored:.0f} = {stored / base:.3f} of bf16's {base:.0f} (encoding {open_dataset(datasets[name]).manifest.tensors['aux_hidden_states']['encoding']})"
        )
        for layer, errors in A.state_errors(datasets["ours"], datasets[name]).items():
            print(f"{name:12s}   {layer:6s} per-token relative error {_percentiles(errors)}")


def _sglang(A, verifier_dir, verifier, ours, work, opts, prompts) -> None:
    """Per seed: a drafter SGLang can run (no norm_before_residual), our loop's tau, SGLang's reported accept length."""
    for seed in opts.seeds:
        checkpoint = A.train_drafter(
            verifier_dir, ours, work / f"train-sglang-{seed}", seed=seed, epochs=opts.epochs, extra=("--no-norm-before-residual",)
        )
        score = A.evaluate(verifier, A.load_drafter(checkpoint), prompts, opts.k, opts.max_new)
        print(_table("ours/no-nbr", score) + f"   (drafter seed {seed}, --no-norm-before-residual, our loop)", flush=True)
        draft = A.sglang_draft_dir(checkpoint, verifier_dir, work / f"sglang-draft-{seed}")
        with A.SGLangEagle3Server(verifier_dir, draft, opts.k, work / f"sglang-eagle3-{seed}.log") as server:
            got = A.sglang_evaluate(server, verifier, prompts, opts.max_new)
        print(
            f"SGLang EAGLE3 spec_accept_length {got.accept_length:.2f} (completion tokens / verify passes, prefill token included; "
            f"per request {min(got.per_request):.2f}..{max(got.per_request):.2f}); same count as our tau {got.tau:.2f}; "
            f"{got.correct_drafts} drafts accepted in {got.verify_ct} verify passes; output identical to plain greedy: {got.exact}",
            flush=True,
        )


MAX_FALLBACKS = 2  # one-pass samples a one-pass build may capture by prefill instead (a repair that gave up) before this run fails


def captured_by(path: Path) -> dict[str, int]:
    """Samples per capture path, summed over the manifest's shards.

    A shard records ``captured_by`` only where its samples carried one-pass traces; a shard
    without it was captured by the prefill path alone, so its samples count as ``prefill``.
    """
    from hs_dataset.formats.reader import open_dataset

    counts: dict[str, int] = {}
    for shard in open_dataset(path).manifest.shards:
        for way, n in (shard.captured_by or {"prefill": shard.samples}).items():
            counts[way] = counts.get(way, 0) + n
    return counts


@dataclass
class Pairing:
    """Two builds of the same conversations, sample by sample (matched by sample id)."""

    same_tokens: list[str] = field(default_factory=list)  # input_ids and loss_mask equal
    other_tokens: list[str] = field(default_factory=list)  # regenerated differently: states not comparable
    unpaired: list[str] = field(default_factory=list)  # in one build only
    max_abs: dict[str, float] = field(default_factory=lambda: {"aux": 0.0, "final": 0.0})  # over same_tokens
    max_state: float = 0.0  # largest |state| of ``a`` there: the scale of max_abs


def pair(a: Path, b: Path) -> Pairing:
    """Compare ``b`` with ``a`` per sample id: equal tokens and mask, and then how far apart their states are."""
    from hs_dataset.formats.reader import open_dataset

    da, db = open_dataset(a), open_dataset(b)
    ia, ib = ({sid: i for i, sid in enumerate(d.sample_ids)} for d in (da, db))
    out = Pairing(unpaired=sorted(ia.keys() ^ ib.keys()))
    for sid in sorted(ia.keys() & ib.keys()):
        sa, sb = da[ia[sid]], db[ib[sid]]
        if not (sa["input_ids"].equal(sb["input_ids"]) and sa["loss_mask"].equal(sb["loss_mask"])):
            out.other_tokens.append(sid)
            continue
        out.same_tokens.append(sid)
        for name, key in (("aux", "aux_hidden_states"), ("final", "final_hidden_state")):
            x, y = sa[key].float(), sb[key].float()
            out.max_abs[name] = max(out.max_abs[name], float((x - y).abs().max()))
            out.max_state = max(out.max_state, float(x.abs().max()))
    return out


def _one_pass_datasets(A, verifier_dir: Path, work: Path, samples: int, summary: dict[str, str]) -> tuple[dict[str, Path], Pairing]:
    """The same prompts built twice against one regeneration server, once per capture path; checked, same sample order."""
    from _sglang_bench_util import stop_and_clean

    from hs_dataset.pipeline.build import build_dataset
    from tests.fixtures.sglang_server import start_server

    source = A.write_prompts(work / "prompts-7.jsonl", samples, seed=7)
    server = start_server(A.sglang_verifier_card(verifier_dir, source, "one_pass"), work, "regen-server", python=str(A.SGLANG_PYTHON))
    built: dict[str, Path] = {}
    try:
        if "--disable-radix-cache" in server.plan.argv:
            raise SystemExit("the regeneration server was planned without its prefix cache: one pass cannot run")
        plan = server.plan
        print(f"regeneration server: SGLang {plan.sglang_version} on CPU, mechanism {plan.mechanism}, float32, prefix cache on", flush=True)
        for capture in ("one_pass", "prefill"):
            t0 = time.perf_counter()
            report = build_dataset(A.sglang_verifier_card(verifier_dir, source, capture), work / capture, servers=[server.url])
            built[capture] = work / capture
            counts = captured_by(built[capture])
            print(
                f"{capture:8s} build {time.perf_counter() - t0:.0f} s: {report.samples_written} samples, "
                f"{report.regeneration['generated_tokens']} generated tokens, captured_by {counts}",
                flush=True,
            )
            summary[f"{capture}_build_captured_by"] = "/".join(f"{k}:{v}" for k, v in sorted(counts.items()))
    finally:
        stop_and_clean(server, set())
    one_pass, prefill = captured_by(built["one_pass"]), captured_by(built["prefill"])
    if prefill.get("one_pass", 0) or one_pass.get("prefill", 0) > MAX_FALLBACKS or not one_pass.get("one_pass"):
        raise SystemExit(
            f"capture paths not as asked: one-pass build {one_pass}, prefill build {prefill} (at most {MAX_FALLBACKS} fallbacks)"
        )
    got = pair(built["prefill"], built["one_pass"])
    print(
        f"same input_ids/loss_mask in both builds: {len(got.same_tokens)} samples; regenerated differently: "
        f"{len(got.other_tokens)} {got.other_tokens[:8]}; in one build only: {len(got.unpaired)} {got.unpaired[:8]}"
    )
    print(
        f"max abs state difference one_pass - prefill (float32, same-token samples): aux {got.max_abs['aux']:.2e}, "
        f"final {got.max_abs['final']:.2e} (largest |state| {got.max_state:.1f})"
    )
    summary.update(
        same_tokens=f"{len(got.same_tokens)}/{samples}",
        max_abs_aux=f"{got.max_abs['aux']:.2e}",
        max_abs_final=f"{got.max_abs['final']:.2e}",
    )
    from hs_dataset.formats.reader import open_dataset

    order = open_dataset(built["prefill"]).sample_ids
    if not got.unpaired and open_dataset(built["one_pass"]).sample_ids != order:
        # the trainer batches by index and builds store conversations as they finish: same order, same batches
        built["one_pass"] = A.write_encoded(built["one_pass"], work / "one_pass-ordered", "native", order=order)
        print("one-pass samples rewritten (native storage, states untouched) in the prefill build's order: same batches")
    return built, got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=8, help="drafter epochs (same batches for every variant)")
    parser.add_argument("--samples", type=int, default=192, help="training prompts")
    parser.add_argument("--heldout", type=int, default=24)
    parser.add_argument("-k", type=int, default=4, help="draft depth")
    parser.add_argument("--max-new", type=int, default=32)
    parser.add_argument("--variants", nargs="+", default=None, help="subset of: ours shift_aux shift_final postnorm")
    parser.add_argument("--sglang", action="store_true", help="also run SGLang's own EAGLE-3 with a drafter trained on our data")
    parser.add_argument(
        "--encoding",
        nargs="+",
        default=None,
        metavar="E",
        help="storage encodings to compare with bf16 (fp8 mxfp4 nf4); replaces the broken copies",
    )
    parser.add_argument(
        "--one-pass",
        action="store_true",
        help="one-pass against prefill capture of the same regenerated conversations (real CPU SGLang server); replaces the broken copies",
    )
    opts = parser.parse_args()
    if opts.one_pass and (opts.encoding or opts.sglang or opts.variants):
        parser.error("--one-pass compares its two builds only: not with --encoding, --sglang or --variants")

    import torch

    from tests.fixtures import acceptance as A
    from tests.fixtures.tiny_verifier import VERIFIER_AUX_LAYERS, build_tiny_verifier

    torch.set_num_threads(1)  # small ops: OpenMP threads on a shared 2-core VM mostly wait on each other
    started = time.perf_counter()
    verifier_dir = build_tiny_verifier()
    print(f"verifier {verifier_dir.name}: {(verifier_dir / 'training.json').read_text()}")
    work = A.scratch("bench-acceptance-")
    summary: dict[str, str] = {}  # one-pass figures for the last line
    paired = True  # same samples, same tokens, same order in every dataset: training targets comparable position by position
    if opts.one_pass:
        datasets, pairing = _one_pass_datasets(A, verifier_dir, work, opts.samples, summary)
        variants, against, paired = ["prefill", "one_pass"], {"one_pass": "prefill"}, not (pairing.other_tokens or pairing.unpaired)
    else:
        datasets = {"ours": A.build_ours(verifier_dir, work / "ours", opts.samples, seed=7)}
        against = dict.fromkeys(opts.encoding or [], "bf16")
        if opts.encoding:
            variants = ["ours", "bf16", *opts.encoding]
            for name in variants[1:]:
                datasets[name] = A.write_encoded(datasets["ours"], work / name, name)
            _encoding_report(A, datasets, opts.encoding)
        else:
            variants = [kind for kind in A.VARIANTS if opts.variants is None or kind in opts.variants]
            for kind in variants[1:] if variants[0] == "ours" else variants:
                datasets[kind] = A.write_broken(datasets["ours"], work / kind, kind)
    norm = A.Verifier(verifier_dir, VERIFIER_AUX_LAYERS).model.model.norm.weight.detach()
    print(
        f"verifier final-norm weight: |w| {norm.abs().min():.2f}..{norm.abs().max():.2f}, mean {norm.mean():.2f} +- {norm.std():.2f}, {int((norm < 0).sum())}/{norm.numel()} negative"
    )
    base = "prefill" if opts.one_pass else "ours"
    if paired:
        for kind in [k for k in datasets if k != base]:
            print(
                f"{kind:12s} training targets (trainer's verifier_lm_head(verifier_norm(final))) equal to {base}'s on {A.target_agreement(verifier_dir, datasets[base], datasets[kind]):.3f} of loss-masked positions"
            )
    print(f"work dir (datasets, drafter checkpoints): {work}")
    verifier = A.Verifier(verifier_dir, VERIFIER_AUX_LAYERS)
    prompts = A.heldout_prompts(opts.heldout, seed=99)
    taus: dict[str, list[float]] = {kind: [] for kind in variants}
    for seed in opts.seeds:
        print(f"--- drafter seed {seed}: {opts.epochs} epochs, k={opts.k}, {len(prompts)} held-out prompts")
        for kind in variants:
            data = datasets[kind]
            checkpoint = A.train_drafter(verifier_dir, data, work / f"train-{kind}-{seed}", seed=seed, epochs=opts.epochs)
            score = A.evaluate(verifier, A.load_drafter(checkpoint), prompts, opts.k, opts.max_new)
            taus[kind].append(score.tau)
            print(_table(kind, score), flush=True)
        for name, ref in against.items():
            print(f"seed {seed}: tau {name} {taus[name][-1]:.2f}  {ref} {taus[ref][-1]:.2f}  ratio {taus[name][-1] / taus[ref][-1]:.3f}")
    for kind, values in taus.items():
        spread = max(values) - min(values)
        print(
            f"{kind:12s} tau mean {statistics.mean(values):.2f} over seeds {opts.seeds} (spread {spread:.2f}): {' '.join(f'{v:.2f}' for v in values)}"
        )
    for name, ref in against.items():
        ratios = [v / b for v, b in zip(taus[name], taus[ref])]
        mean = statistics.mean(taus[name]) / statistics.mean(taus[ref])
        print(
            f"{name:12s} tau / {ref}'s tau per seed {' '.join(f'{r:.3f}' for r in ratios)} (min {min(ratios):.3f}); of the means {mean:.3f}"
        )
        if opts.one_pass:
            summary.update(ratio=f"{mean:.3f}", min_ratio=f"{min(ratios):.3f}", ratio_at_least_0_98=str(mean >= 0.98))
    if opts.sglang:
        _sglang(A, verifier_dir, verifier, datasets["ours"], work, opts, prompts)
    print(f"run time {time.perf_counter() - started:.0f} s")
    names = {"ours": "tau_ours", "shift_aux": "tau_shift_aux", "shift_final": "tau_shift_final", "postnorm": "tau_postnorm"}
    line = [f"{names.get(kind, 'tau_' + kind)}={statistics.mean(values):.2f}" for kind, values in taus.items()]
    print(" ".join(line + [f"{k}={v}" for k, v in summary.items()]))


if __name__ == "__main__":
    main()
