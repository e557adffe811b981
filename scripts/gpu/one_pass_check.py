"""One-pass capture through ``hs-dataset serve`` (issue 45): are the generated tokens' states, read from the server's
decode CUDA graphs, the states an ordinary prefill capture of the same sequence stores?

Starts ``hs-dataset serve`` (which starts SGLang through ``python -m hs_dataset.server_patch.launch``) with the
Kimi-shaped random DeepseekV3 of ``check_server.py``, decode CUDA graphs on, and reads the hooks' ``decode_capture``
fact (the client's :func:`~hs_dataset.capture.sglang.validate.one_pass_support`). Then it generates answers for
one-pass request ids (several at once, prompts of several lengths), reads their pieces, and prefills each stored
sequence (prompt + answer but its last token, whose state decoding never computes) as an ordinary capture request
(a ``{rid}.safetensors`` dump). For every aux layer and the pre-norm final state it prints the median and max
relative error of the pieces' rows against that dump, beside the same rows against the neighbouring layer, the
neighbouring position and, for the final state, the post-norm final (a row of the wrong layer, position or
convention shows there), checks each row's token id, and prints how many decode rows came from graph replays
(the status file's counts).

Then, with the server stopped, every one-pass row (prompt and generated) against transformers' float32 forward of
its stored sequence on the same device (issue 45's "GPU bf16" bar, ``check_server.py``'s comparison): per kind and
layer the per-token relative error median / p99 / max, beside transformers' own capture-dtype (bf16) error on the
same rows, the neighbouring layers and, for the pre-norm final, the post-norm final.

    python scripts/gpu/one_pass_check.py --out DIR                        # cuda, bf16, decode CUDA graphs on
    python scripts/gpu/one_pass_check.py --out DIR --device cpu --dtype float32 --python .sglang-venv/bin/python-0.5.19

Exit status 0 only if every row is there with its token id, the neighbours are at least 10x further than the
claimed rows (median), and against transformers each layer's median is within ``--slack`` (check_server's 1.5) x
transformers' own capture-dtype median (float32: check_server's FLOAT32_LIMIT, 1e-6) with the neighbouring layers
and the post-norm final at least 10x further (check_server's judge, on the median).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import random
import sys
import time
import urllib.request
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import check_server  # noqa: E402  (scripts/gpu: the model, the card and the server start of the GPU check)

from hs_dataset.capture.sglang.diagnose import read_report  # noqa: E402
from hs_dataset.capture.sglang.validate import one_pass_support  # noqa: E402
from hs_dataset.server_patch.contract.dump import piece_number  # noqa: E402
from hs_dataset.server_patch.contract.rid import make_one_pass_rid, make_rid  # noqa: E402

RUN = "op1"
NEIGHBOUR_FACTOR = 10.0


def post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def load(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def generate(url: str, n: int, vocab: int, tokens: int, seed: int) -> list[dict]:
    """``n`` one-pass generations, all in flight at once (decode batches of many requests, shrinking as they end)."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        prompt = [rng.randrange(100, vocab) for _ in range(rng.choice([5, 19, 64, 150, 333]))]
        new = rng.randrange(tokens // 2, tokens + 1)  # different lengths: requests leave the batch at different steps
        rid = make_one_pass_rid(RUN, i, len(prompt))
        jobs.append({"rid": rid, "input_ids": prompt, "sampling_params": {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}})
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(lambda j: post(url + "/generate", j), jobs))
    return [{"rid": j["rid"], "seq": i, "prompt": j["input_ids"], "answer": a["output_ids"]} for i, (j, a) in enumerate(zip(jobs, answers))]


def prefill_references(url: str, runs: list[dict], staging: Path) -> None:
    """An ordinary capture request of each stored sequence (prompt + answer but its last token): its dump is the reference."""
    for r in runs:
        ids = r["prompt"] + r["answer"][:-1]
        r["ref_rid"] = make_rid(RUN, 1000 + r["seq"], len(ids))
        post(url + "/generate", {"rid": r["ref_rid"], "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all((staging / f"{r['ref_rid']}.safetensors").is_file() for r in runs):
        time.sleep(0.5)


def pieces(staging: Path, rid: str) -> dict[int, tuple[int, torch.Tensor, torch.Tensor]]:
    """{position: (token id, aux [K, H], final [H])} over every piece of ``rid``."""
    rows = {}
    for name in sorted(os.listdir(staging)):
        if piece_number(rid, name) is None:
            continue
        t = load(staging / name)
        for j, pos in enumerate(t["positions"].tolist()):
            rows[pos] = (int(t["input_ids"][j]), t["aux_hidden_states"][j].float(), t["final_hidden_state"][j].float())
    return rows


def wait_for_pieces(staging: Path, runs: list[dict], timeout: float = 60) -> None:
    """Until every request's computed positions are in its pieces (the collector writes a finished request's rows off the forward thread)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(len(pieces(staging, r["rid"])) >= len(r["prompt"]) + len(r["answer"]) - 1 for r in runs):
            return
        time.sleep(1)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def compare(runs: list[dict], staging: Path, names: list[str], norm_weight: torch.Tensor, eps: float) -> tuple[list[str], bool]:
    errs: dict[tuple[str, str, str], list[float]] = collections.defaultdict(list)
    missing = wrong_ids = extra = 0
    for r in runs:
        mine, ref = pieces(staging, r["rid"]), load(staging / f"{r['ref_rid']}.safetensors")
        seq = r["prompt"] + r["answer"][:-1]  # the positions the server computed for this generation
        extra += sum(1 for p in mine if p >= len(seq))
        aux, final = ref["aux_hidden_states"].float(), ref["final_hidden_state"].float()
        post_norm = rms_norm(final, norm_weight, eps)
        for pos, token in enumerate(seq):
            if pos not in mine:
                missing += 1
                continue
            got_id, got_aux, got_final = mine[pos]
            wrong_ids += got_id != token
            kind = "prompt" if pos < len(r["prompt"]) else "generated"
            got = [*got_aux, got_final]
            want = [*aux[pos], final[pos]]
            for k, name in enumerate(names):
                errs[(kind, name, "same")].append(rel(got[k], want[k]))
                if k + 1 < len(names) - 1:
                    errs[(kind, name, "next layer")].append(rel(got[k], want[k + 1]))
                elif k > 0:
                    errs[(kind, name, "previous layer")].append(rel(got[k], want[k - 1]))
                if pos > 0:
                    errs[(kind, name, "previous position")].append(rel(got[k], ([*aux[pos - 1], final[pos - 1]])[k]))
            errs[(kind, names[-1], "post-norm final")].append(rel(got_final, post_norm[pos]))
    lines = [f"rows missing: {missing}; token ids wrong: {wrong_ids}; rows past the last computed position: {extra}"]
    ok = missing == 0 and wrong_ids == 0
    for (kind, name, against), values in sorted(errs.items()):
        t = torch.tensor(values)
        lines.append(f"{kind:>9} {name:>6} vs {against:<17}: median {t.median():.2e}  max {t.max():.2e}  ({len(values)} rows)")
    for (kind, name, against), values in sorted(errs.items()):
        if against == "same":
            continue
        same = float(torch.tensor(errs[(kind, name, "same")]).median())
        if not float(torch.tensor(values).median()) > NEIGHBOUR_FACTOR * same:
            ok = False
            lines.append(f"FAIL {kind} {name}: the {against} is not {NEIGHBOUR_FACTOR:g}x further than the claimed row")
    return lines, ok


def compare_transformers(runs: list[dict], staging: Path, model_dir: Path, device: str, dtype: str) -> dict[str, dict]:
    """Every one-pass row against transformers' float32 forward of its stored sequence (prompt + answer but its last
    token) on ``device``, per kind (prompt, generated) and layer: check_server's per-token errors, beside transformers'
    own ``dtype`` error on the same rows, the neighbouring layers and, for the final state, the post-norm final.
    The two models load once; one sequence's states are on the device at a time."""
    fp32, low = check_server.load_transformers(model_dir, device, dtype)
    errs = {"prompt": check_server.new_errors(), "generated": check_server.new_errors()}
    for r in runs:
        mine = pieces(staging, r["rid"])
        seq = r["prompt"] + r["answer"][:-1]
        refs = check_server.references(fp32, low, torch.tensor(seq, device=device))
        for kind, positions in (("prompt", range(len(r["prompt"]))), ("generated", range(len(r["prompt"]), len(seq)))):
            have = [pos for pos in positions if pos in mine]  # a missing row is counted by compare()
            if not have:
                continue
            aux = torch.stack([mine[pos][1] for pos in have]).to(device)
            final = torch.stack([mine[pos][2] for pos in have]).to(device)
            check_server.add_errors(errs[kind], refs, aux, final, rows=torch.tensor(have, device=device))
        del refs
    del fp32, low
    return {
        kind: {
            "rows": sum(len(t) for t in e[check_server.LAYERS[0]]["server"]),
            "layers": {n: check_server._summary(v) for n, v in e.items()},
        }
        for kind, e in errs.items()
        if e[check_server.LAYERS[0]]["server"]
    }


def transformers_lines(result: dict[str, dict], device: str, dtype: str, slack: float) -> tuple[list[str], bool]:
    """The table of :func:`compare_transformers` and check_server's judge of each kind: every layer's median within
    ``slack`` x transformers' own ``dtype`` median (float32: check_server's FLOAT32_LIMIT), neighbours 10x further."""
    lines = [
        f"every one-pass row against transformers float32 of its stored sequence ({device}): per-token relative error "
        f"median / p99 / max; hf-low: transformers' own {dtype} on the same rows; limit: the median allowed "
        f"({slack:g} x hf-low median, at least {check_server.FLOAT32_LIMIT:g}); prev / next: the neighbouring layers' "
        "medians (final: the last layer's input / the post-norm final)",
        f"{'kind':9} {'layer':21} {'rows':>5} {'server med':>10} {'p99':>8} {'max':>8} {'hf-low med':>10} {'p99':>8} "
        f"{'max':>8} {'limit':>8} {'prev med':>8} {'next med':>8}",
    ]
    ok = True
    for kind, part in result.items():
        for name, s in part["layers"].items():
            server, low = s["server"], s["hf_low"]
            lines.append(
                f"{kind:9} {name:21} {part['rows']:5d} {server['median']:10.3g} {server['p99']:8.3g} {server['max']:8.3g} "
                f"{low['median']:10.3g} {low['p99']:8.3g} {low['max']:8.3g} {check_server.error_limit(low['median'], slack):8.3g} "
                f"{s['prev']['median']:8.3g} {s['next']['median']:8.3g}"
            )
        for problem in check_server.judge(part, slack, NEIGHBOUR_FACTOR, stats=("median",)):
            ok = False
            lines.append(f"FAIL {kind} rows against transformers: {problem}")
    if not result:
        ok = False
        lines.append("FAIL: no one-pass rows to compare with transformers")
    return lines, ok


def set_mem_fraction(card: Path, fraction: float) -> None:
    """The card's ``--mem-fraction-static`` replaced (the GPU check's CPU value leaves this model no KV cache)."""
    import yaml

    raw = yaml.safe_load(card.read_text())
    server_args = raw["sglang"]["args"]
    server_args[server_args.index("--mem-fraction-static") + 1] = str(fraction)
    card.write_text(yaml.safe_dump(raw, sort_keys=False))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--python", default=sys.executable, help="the server's Python (default: this one)")
    p.add_argument("--port", type=int, default=31100)
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--tokens", type=int, default=64, help="most new tokens per request (each asks for tokens/2 .. tokens)")
    p.add_argument("--server-arg", action="append", default=[], help="extra SGLang argument (repeatable)")
    p.add_argument("--mem-fraction", type=float, help="the server's --mem-fraction-static instead of the GPU check's")
    p.add_argument("--slack", type=float, default=check_server.SLACK, help="the rows' median may be this many x transformers' own")
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = check_server.build_model(Path(os.environ.get("HS_GPU_MODEL_DIR", "/tmp/hs-one-pass-model")), args.dtype)
    config = json.loads((model / "config.json").read_text())
    staging = Path("/dev/shm") / f"hs-one-pass-check-{args.port}"
    card_args = argparse.Namespace(
        server_arg=args.server_arg, model="deepseek", device=args.device, dtype=args.dtype, concurrency=args.requests,
        storage="native", python=args.python, chunk=256,
    )  # fmt: skip
    card = check_server.write_card(out / "one-pass-check.yaml", model, card_args, args.port, staging)
    if args.mem_fraction is not None:
        set_mem_fraction(card, args.mem_fraction)
    url = f"http://127.0.0.1:{args.port}"
    t0 = time.monotonic()
    server = check_server.serve(card, out / "server.log", url, 900)
    header = [f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {' '.join(sys.argv)}"]
    try:
        info = json.loads(urllib.request.urlopen(url + "/server_info", timeout=30).read())
        header.append(
            f"server: hs-dataset serve, SGLang {info.get('version', '?')}, {args.device} {args.dtype}; up in {time.monotonic() - t0:.0f} s"
        )
        argv = (out / "server.log").read_text(errors="replace")
        header.append("started through hs_dataset.server_patch.launch: " + str("hs_dataset.server_patch.launch" in argv))
        support = one_pass_support(str(staging))
        header.append(f"decode_capture: {support.fact!r} -> one pass {'works' if support.works else 'refused: ' + str(support.reason)}")
        t0 = time.monotonic()
        runs = generate(url, args.requests, int(config["vocab_size"]), args.tokens, seed=0)
        header.append(f"generation: {args.requests} one-pass requests at once in {time.monotonic() - t0:.1f} s")
        wait_for_pieces(staging, runs)
        prefill_references(url, runs, staging)
        counts = read_report(str(staging)).counts
    finally:
        check_server.stop(server)
    header.append(
        f"requests {len(runs)}, prompt lengths {sorted({len(r['prompt']) for r in runs})}, "
        f"answer lengths {sorted({len(r['answer']) for r in runs})}"
    )
    header.append(
        "status counts: "
        + ", ".join(
            f"{k} {counts.get(k, 0)}" for k in ("decode_passes", "graph_decode_passes", "graph_decode_rows", "refused", "hook_errors")
        )
    )
    from safetensors import safe_open

    with safe_open(str(next(model.glob("*.safetensors"))), "pt") as f:
        norm_weight = f.get_tensor("model.norm.weight").float()
    names = [f"aux{a}" for a in check_server.AUX] + ["final"]
    lines, ok = compare(runs, staging, names, norm_weight, float(config.get("rms_norm_eps", 1e-6)))
    t0 = time.monotonic()
    hf = compare_transformers(runs, staging, model, args.device, args.dtype)
    hf_lines, hf_ok = transformers_lines(hf, args.device, args.dtype, args.slack)
    lines += hf_lines + [f"transformers comparison in {time.monotonic() - t0:.0f} s"]
    ok = ok and hf_ok and support.works and counts.get("refused", 0) == 0
    text = "\n".join(header + lines + ["PASS" if ok else "FAIL"])
    print(text)
    (out / "one_pass_check.txt").write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
