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
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
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
    opts = parser.parse_args()

    import torch

    from tests.fixtures import acceptance as A
    from tests.fixtures.tiny_verifier import VERIFIER_AUX_LAYERS, build_tiny_verifier

    torch.set_num_threads(1)  # small ops: OpenMP threads on a shared 2-core VM mostly wait on each other
    started = time.perf_counter()
    verifier_dir = build_tiny_verifier()
    print(f"verifier {verifier_dir.name}: {(verifier_dir / 'training.json').read_text()}")
    work = A.scratch("bench-acceptance-")
    datasets = {"ours": A.build_ours(verifier_dir, work / "ours", opts.samples, seed=7)}
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
    for kind in [k for k in datasets if k != "ours"]:
        print(
            f"{kind:12s} training targets (trainer's verifier_lm_head(verifier_norm(final))) equal to ours' on {A.target_agreement(verifier_dir, datasets['ours'], datasets[kind]):.3f} of loss-masked positions"
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
    for kind, values in taus.items():
        spread = max(values) - min(values)
        print(
            f"{kind:12s} tau mean {statistics.mean(values):.2f} over seeds {opts.seeds} (spread {spread:.2f}): {' '.join(f'{v:.2f}' for v in values)}"
        )
    for name in opts.encoding or []:
        ratios = [v / b for v, b in zip(taus[name], taus["bf16"])]
        print(f"{name:12s} tau / bf16's tau per seed {' '.join(f'{r:.3f}' for r in ratios)} (min {min(ratios):.3f})")
    if opts.sglang:
        _sglang(A, verifier_dir, verifier, datasets["ours"], work, opts, prompts)
    print(f"run time {time.perf_counter() - started:.0f} s")
    names = {"ours": "tau_ours", "shift_aux": "tau_shift_aux", "shift_final": "tau_shift_final", "postnorm": "tau_postnorm"}
    print(" ".join(f"{names.get(kind, 'tau_' + kind)}={statistics.mean(values):.2f}" for kind, values in taus.items()))


if __name__ == "__main__":
    main()
