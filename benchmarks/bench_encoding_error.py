"""Per-token relative error of each state encoding on outlier-heavy synthetic states (and a dataset's, if given).

    python benchmarks/bench_encoding_error.py [--hidden 7168] [--tokens 4096] [--dataset DIR]

Synthetic states, per kind (bf16, ``[tokens, hidden]``):

* ``gaussian``: N(0, 1) values, per-token magnitudes log-normal over ~3 decades;
* ``heavy_tail``: Student-t (3 degrees of freedom) values, so single values reach ~30 sigma;
* ``massive``: Gaussian plus the "massive activations" of LLM residual streams: 4 fixed
  channels at 100-1000x the rest (and a random 0.1% of values at 20x);

``--dataset DIR`` adds the states of a stored dataset (each aux layer and the final
state), e.g. the tiny verifier's from ``bench_acceptance.py``'s work dir. For each
encoding: median / p90 / p99 / max of ``|x' - x| / |x|`` over tokens, and the stored
bytes per value.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENCODINGS = ("fp8_e4m3_per_token", "mxfp4_e2m1_g32", "nf4_g32")


def synthetic(kind: str, tokens: int, hidden: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    magnitude = torch.exp(torch.randn(tokens, 1, generator=g) * 1.2)
    if kind == "heavy_tail":  # Student-t (3 dof): a normal over sqrt(chi-square(3) / 3), all from the one generator
        chi2 = torch.randn(3, tokens, hidden, generator=g).square_().sum(0)
        x = torch.randn(tokens, hidden, generator=g) / torch.sqrt(chi2 / 3)
    else:
        x = torch.randn(tokens, hidden, generator=g)
    if kind == "massive":
        channels = torch.randperm(hidden, generator=g)[:4]
        x[:, channels] *= torch.tensor([100.0, 300.0, 600.0, 1000.0])
        spikes = torch.rand(tokens, hidden, generator=g) < 1e-3
        x[spikes] *= 20.0
    return (x * magnitude).to(torch.bfloat16)


def relative_errors(x, name: str):
    from hs_dataset.codecs.registry import get_encoding
    from hs_dataset.formats.encoding import decode_state, encode_state

    encoding = get_encoding(name)
    y = decode_state(*encode_state(x, encoding), encoding).float()
    x = x.float()
    return (y - x).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-30)


def summary(errors) -> str:
    import torch

    q = torch.quantile(errors.flatten().float(), torch.tensor([0.5, 0.9, 0.99]))
    return f"median {q[0]:.4f}  p90 {q[1]:.4f}  p99 {q[2]:.4f}  max {errors.max():.4f}"


def dataset_states(root: str):
    """(name, [tokens, H] states) for each aux layer and the final state of a stored dataset."""
    import torch

    from hs_dataset.formats.reader import open_dataset

    data = open_dataset(root)
    aux = torch.cat([s["aux_hidden_states"] for s in data])
    final = torch.cat([s["final_hidden_state"] for s in data])
    return [(f"dataset aux{j}", aux[:, j]) for j in range(aux.shape[1])] + [("dataset final", final)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--dataset", default=None, help="also measure a stored dataset's states")
    opts = parser.parse_args()

    from hs_dataset.codecs.registry import get_encoding

    cases = [(kind, synthetic(kind, opts.tokens, opts.hidden)) for kind in ("gaussian", "heavy_tail", "massive")]
    if opts.dataset:
        cases += dataset_states(opts.dataset)
    for name in ENCODINGS:
        encoding = get_encoding(name)
        ratio = encoding.row_bytes(opts.hidden) / get_encoding("bf16").row_bytes(opts.hidden)
        print(
            f"{name}: {8 * encoding.row_bytes(opts.hidden) / opts.hidden:.3f} bits per value = {ratio:.3f} of bf16 (hidden {opts.hidden})"
        )
        for case, states in cases:
            print(f"  {case:15s} per-token relative error {summary(relative_errors(states, name))}")


if __name__ == "__main__":
    main()
