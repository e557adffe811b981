"""Route finding for one-pass capture (issue 45), on a GPU host: are decode-step states read from SGLang's decode
CUDA graphs the states of the tokens they claim to be?

Starts SGLang through ``one_pass_probe/hs_one_pass_probe.py`` (hooks registered before graph capture, rows read
after each replay), generates answers for prompts of several lengths with decode CUDA graphs on, then prefills
each stored sequence (prompt + answer but its last token) as a reference. For every aux layer and the pre-norm
final state it prints the median and max relative error of the decode rows against that prefill, beside the same
rows against the neighbouring layer and against the neighbouring position (a row put in the wrong place shows
there), and how many rows came from graph replays.

    python scripts/gpu/one_pass_probe.py --model DIR --out DIR [--requests 24] [--aux 2,4,6]
    python scripts/gpu/one_pass_probe.py --cpu 0.5.19 --out DIR --aux 2,3,4   # a CPU server (eager decode, float32)

``--cpu VERSION`` runs the tiny DeepseekV3 of ``tiny-deepseek-sglang`` on that release's CPU server
(``make sglang-env sglang-overlays``; the base env's own release is 0.5.23, whose decoder layers return no residual,
so its layer rows are not complete states): there is no CUDA graph on a CPU server, so it checks the launcher and
the row bookkeeping, not the graph recording.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import glob
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


LAUNCH = ["-c", "import hs_one_pass_probe as p; p.main()"]


def gpu_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    argv = [
        sys.executable,
        *LAUNCH,
        "--model-path",
        str(args.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        "--dtype",
        "bfloat16",
        "--skip-tokenizer-init",
        "--attention-backend",
        "triton",
        "--sampling-backend",
        "pytorch",
        "--grammar-backend",
        "none",
        "--mem-fraction-static",
        "0.5",
        "--disable-radix-cache",
        "--disable-prefill-cuda-graph",
        "--max-running-requests",
        "64",
        "--cuda-graph-max-bs",
        str(args.graph_max_bs),
        *args.server_arg,
    ]
    if not list(args.model.glob("*.safetensors")):
        argv += ["--load-format", "dummy"]  # no weights: a speed rehearsal's model (its layers barely change the state)
    return argv, {}


def cpu_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """``hs-dataset serve``'s own plan for the tiny CPU card, started through the probe with only the MLA hook."""
    sys.path.insert(0, str(HERE.parents[1]))
    from hs_dataset.capture.serve import plan_server
    from hs_dataset.config import load_card

    python = str(HERE.parents[1] / ".sglang-venv" / "bin" / f"python-{args.cpu}")
    plan = plan_server(load_card("tiny-deepseek-sglang"), port=args.port, staging_dir=str(args.out / "stage"), python=python)
    argv = list(plan.argv)
    assert argv[:2] == ["-m", "sglang.launch_server"], argv[:2]
    i = argv.index("--forward-hooks")
    argv[i + 1] = json.dumps([s for s in json.loads(argv[i + 1]) if s["name"] == "hs_cpu_mla"])
    return [plan.python, *LAUNCH, *argv[2:], *args.server_arg], dict(plan.env)


def start_server(args: argparse.Namespace, dumps: Path) -> subprocess.Popen:
    argv, extra_env = cpu_command(args) if args.cpu else gpu_command(args)
    env = dict(os.environ, **extra_env, HS_PROBE_OUT=str(dumps), HS_PROBE_AUX=args.aux, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE / "one_pass_probe"), env.get("PYTHONPATH", "")])
    log = open(args.out / "server.log", "w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{args.port}"
    t0 = time.time()
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}); see {args.out / 'server.log'}")
        try:
            urllib.request.urlopen(url + "/health", timeout=5)
            print(f"server healthy after {time.time() - t0:.0f} s", flush=True)
            return proc
        except Exception:
            time.sleep(2)


def generate(url: str, n: int, vocab: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        prompt = [rng.randrange(100, vocab) for _ in range(rng.choice([7, 33, 120, 301, 517]))]
        jobs.append(
            {
                "rid": f"gen-{i}",
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": rng.choice([5, 17, 40, 96]), "temperature": 0, "ignore_eos": True},
            }
        )
    with concurrent.futures.ThreadPoolExecutor(n) as pool:  # all in flight: decode batches of many requests
        answers = list(pool.map(lambda j: post(url + "/generate", j), jobs))
    return [{"rid": j["rid"], "prompt": j["input_ids"], "answer": a["output_ids"]} for j, a in zip(jobs, answers)]


def reference(url: str, runs: list[dict]) -> None:
    for r in runs:  # one at a time: eager prefills of the stored sequence but its last token
        ids = r["prompt"] + r["answer"][:-1]
        post(url + "/generate", {"rid": "ref-" + r["rid"], "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})


def rows_by_rid(dumps: Path) -> tuple[dict, collections.Counter]:
    """{rid: {position: (states [K+1, H], how)}} over every saved pass; the count of rows by mode and how."""
    rows: dict = collections.defaultdict(dict)
    seen = collections.Counter()
    for f in sorted(glob.glob(str(dumps / "*.pt"))):
        rec = torch.load(f, weights_only=True)
        start = 0
        for rid, n in zip(rec["rids"], rec["lens"]):
            for j in range(start, start + n):
                pos = int(rec["positions"][j])
                if pos in rows[rid]:
                    seen["repeated"] += 1
                rows[rid][pos] = (rec["states"][j].float(), rec["how"])
                seen[f"{rec['mode']}/{rec['how']}"] += 1
            start += n
    return rows, seen


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def compare(runs: list[dict], rows: dict, names: list[str]) -> tuple[list[str], bool]:
    errs = collections.defaultdict(list)
    missing = extra = 0
    for r in runs:
        mine, ref = rows.get(r["rid"], {}), rows.get("ref-" + r["rid"], {})
        length = len(r["prompt"]) + len(r["answer"]) - 1  # positions whose states the server computed for this answer
        extra += sum(1 for p in mine if p >= length)
        for pos in range(length):
            if pos not in mine or pos not in ref:
                missing += 1
                continue
            (got, how), (want, _) = mine[pos], ref[pos]
            kind = "prompt" if pos < len(r["prompt"]) else f"decode-{how}"
            for k, name in enumerate(names):
                errs[(kind, name, "same")].append(rel(got[k], want[k]))
                if k + 1 < len(names):
                    errs[(kind, name, "next layer")].append(rel(got[k], want[k + 1]))
                if pos - 1 in ref:
                    errs[(kind, name, "previous position")].append(rel(got[k], ref[pos - 1][0][k]))
    lines = [f"rows missing: {missing}; rows past the answer's last computed position (a finished request's extra step): {extra}"]
    ok = missing == 0
    for (kind, name, against), values in sorted(errs.items()):
        t = torch.tensor(values)
        lines.append(f"{kind:>15} {name:>10} vs {against:<17}: median {t.median():.2e}  max {t.max():.2e}  ({len(values)} rows)")
    for kind in sorted({k for k, _, _ in errs}):
        for name in names:
            same = float(torch.tensor(errs[(kind, name, "same")]).median())
            for against in ("previous position", "next layer"):  # a misplaced row is far closer to where it belongs
                if errs[(kind, name, against)] and not float(torch.tensor(errs[(kind, name, against)]).median()) > max(10 * same, 1e-3):
                    ok = False
                    lines.append(f"FAIL {kind} {name}: the {against} is not 10x further than the claimed row")
    return lines, ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="the model folder (GPU); --cpu serves the tiny CPU card's model")
    p.add_argument("--cpu", metavar="VERSION", help="run on this machine's CPU server of that SGLang release")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--aux", default="2,4,6", help="HF hidden_states ids of the aux layers")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--port", type=int, default=30000)
    p.add_argument(
        "--graph-max-bs",
        type=int,
        default=16,
        help="largest decode batch a CUDA graph covers: larger batches decode eagerly (both paths are checked)",
    )
    p.add_argument("--server-arg", action="append", default=[])
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dumps = args.out / "dumps"
    dumps.mkdir(exist_ok=True)
    if not args.cpu and args.model is None:
        p.error("--model is required unless --cpu is given")
    for old in dumps.glob("*.pt"):
        old.unlink()
    vocab = 1000 if args.cpu else json.loads((args.model / "config.json").read_text())["vocab_size"]
    proc = start_server(args, dumps)
    try:
        url = f"http://127.0.0.1:{args.port}"
        info = json.loads(urllib.request.urlopen(url + "/server_info", timeout=30).read())
        served = f"SGLang {info.get('version', '?')} (its /server_info)"
        runs = generate(url, args.requests, vocab, seed=0)
        reference(url, runs)
        time.sleep(1)
    finally:
        proc.terminate()
        proc.wait(60)
    rows, seen = rows_by_rid(dumps)
    names = [f"aux{a}" for a in args.aux.split(",")] + ["final"]
    lines, ok = compare(runs, rows, names)
    lines.insert(0, f"rows by mode/how: {dict(seen)}")
    lines.insert(
        1,
        f"requests {len(runs)}, prompt lengths {sorted({len(r['prompt']) for r in runs})}, "
        f"answer lengths {sorted({len(r['answer']) for r in runs})}",
    )
    where = f"CPU server, SGLang {args.cpu}" if args.cpu else "GPU server"
    lines.insert(0, f"{where}, {served}; {time.strftime('%Y-%m-%d')}; {' '.join(sys.argv)}")
    text = "\n".join(lines + ["PASS" if ok else "FAIL"])
    print(text)
    (args.out / "one_pass_probe.txt").write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
