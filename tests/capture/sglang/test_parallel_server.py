"""Capture under tensor parallelism and DP attention, on the REAL SGLang 0.5.23 CPU server.

Two topologies of the tiny DeepseekV3 (float32, ``chunked_prefill_size: 64``, which SGLang
splits over the DP groups: 32-token chunks under DP attention), one
server each, shared by that topology's tests (a module-scoped, parametrized fixture:
pytest finishes one topology, stops its server, then starts the next):

* ``tp2``: ``tp: 2`` -- two ranks joined by gloo; attention-TP rank 0 writes, rank 1 must not;
* ``dp2-attn``: ``--dp-size 2 --enable-dp-attention`` with ``tp: 2`` -- two DP groups of one
  rank each, both writing; the groups carry different requests, padded to a common size.

``hs-dataset serve``'s plan gives each rank its own core (``SGLANG_CPU_OMP_THREADS_BIND``).
The DP server also needs ``tests/sglang_cpu_shim`` (a test-only ``sitecustomize``: SGLang's
CPU padding path calls a method only its AMX attention backend defines), put on that
server's ``PYTHONPATH`` here and nowhere else.

Every stored state is compared with an independent transformers forward of the same
weights (relative error <= 1e-6); ``-s`` prints the worst errors quoted in the README.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hs_dataset.capture.base import CaptureFailure
from hs_dataset.sample import CapturedSample
from tests.fixtures.paths import SHIMS
from tests.fixtures.ports import free_port as _free_port
from tests.fixtures.sglang_client import backend, make_samples, post, staged
from tests.fixtures.sglang_server import AUX, SERVER_PYTHON, hf_reference, rel, remove_dumps, require_sglang_env as _require_env

pytestmark = pytest.mark.sglang

CHUNK = 64
LIMIT = 1e-6
SHIM = SHIMS / "sglang_cpu_shim"
TOPOLOGIES = {
    "tp2": {"tp": 2, "args": [], "writers": 1, "shim": False},
    "dp2-attn": {"tp": 2, "args": ["--dp-size", "2", "--enable-dp-attention"], "writers": 2, "shim": True},
}
# very different lengths in flight together: 1 token next to 300 (5 chunks of 64)
LENGTHS = [300, 1, 200, 5, 130, 9, 65, 37, 250, 12]


def _card(name: str):
    from hs_dataset.config import load_card

    base = load_card("tiny-deepseek-sglang")
    topo = TOPOLOGIES[name]
    return base.with_overrides(sglang={"tp": topo["tp"], "chunked_prefill_size": CHUNK, "args": [*base.sglang.args, *topo["args"]]})


@pytest.fixture(scope="module", params=list(TOPOLOGIES))
def parallel_server(request, tmp_path_factory):
    """One real server per topology: (name, card, server)."""
    from hs_dataset.capture.serve import launch, plan_server

    _require_env()
    name = request.param
    card = _card(name)
    root = tmp_path_factory.mktemp(name)
    plan = plan_server(card, port=_free_port(), staging_dir=str(root / "stage"), python=str(SERVER_PYTHON))
    if TOPOLOGIES[name]["shim"]:
        plan.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM), plan.env.get("PYTHONPATH", "")) if p)
    t0 = time.monotonic()
    server = launch(plan, log_path=str(root / "server.log"), timeout=300)
    print(f"\n[{name}] healthy after {time.monotonic() - t0:.1f} s; {plan.env.get('SGLANG_CPU_OMP_THREADS_BIND')=}")
    yield name, card, server
    server.stop(timeout=5)


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    from hs_dataset.demo.tiny_model import build_tiny_deepseek

    return AutoModelForCausalLM.from_pretrained(str(build_tiny_deepseek()), dtype=torch.float32, local_files_only=True).eval()


def _worst(hf_model, ids: torch.Tensor, aux: torch.Tensor, final: torch.Tensor) -> tuple[float, float]:
    """(worst aux layer, final) relative error of one sample against transformers."""
    ref_aux, ref_final = hf_reference(hf_model, ids)
    return max(rel(aux[:, k], ref_aux[:, k]) for k in range(len(AUX))), rel(final, ref_final)


def _log(server) -> str:
    return Path(server.log_path).read_text(errors="replace")


def test_each_rank_has_its_own_cores_and_the_right_ranks_write(parallel_server):
    name, _card, server = parallel_server
    bind = server.plan.env["SGLANG_CPU_OMP_THREADS_BIND"].split("|")
    assert len(bind) == 2 and not set(bind[0].split(",")) & set(bind[1].split(",")), bind
    log = _log(server)
    writers = len(re.findall(r"this rank writes dumps", log))
    silent = len(re.findall(r"not writing \(another rank of this group does\)", log))
    assert (writers, silent) == ((1, 1) if name == "tp2" else (2, 0)), (writers, silent)
    if name == "dp2-attn":
        assert re.search(r"DP rank 0 .*this rank writes", log) and re.search(r"DP rank 1 .*this rank writes", log)


def test_concurrent_capture_matches_hf_forward(parallel_server, hf_model):
    name, card, server = parallel_server
    samples = make_samples(len(LENGTHS), LENGTHS, seed=11)
    be = backend(card, server, concurrency=len(samples))
    try:
        t0 = time.monotonic()
        results = list(be.capture_stream(samples, batch_size=len(samples)))
        took = time.monotonic() - t0
    finally:
        be.close()
    assert not [r for r in results if isinstance(r, CaptureFailure)], results
    by_id = {r.sample_id: r for r in results}
    assert sorted(by_id) == sorted(s.sample_id for s in samples)
    worst_aux = worst_final = 0.0
    for s in samples:
        r = by_id[s.sample_id]
        assert isinstance(r, CapturedSample) and torch.equal(r.input_ids, s.input_ids)
        a, f = _worst(hf_model, s.input_ids, r.aux_hidden_states, r.final_hidden_state)
        assert a <= LIMIT and f <= LIMIT, (s.sample_id, s.num_tokens, a, f)
        worst_aux, worst_final = max(worst_aux, a), max(worst_final, f)
    print(
        f"[{name}] {len(samples)} samples ({min(LENGTHS)}-{max(LENGTHS)} tokens) in {took:.2f} s; "
        f"worst relative error vs HF: aux {worst_aux:.2g}, pre-norm final {worst_final:.2g}"
    )
    time.sleep(1.0)  # a second rank writing the same request would show up here
    assert staged(server) == []
    assert "hook failed" not in _log(server)
    if name == "dp2-attn":
        _assert_uneven_dp_batches(_log(server))


def _assert_uneven_dp_batches(log: str) -> None:
    """The two DP groups prefilled different requests (different counts of sequences and tokens)."""
    passes = {rank: [] for rank in ("0", "1")}
    for rank, seqs, tokens in re.findall(r"DP(\d) TP\d\] Prefill batch, #new-seq: (\d+), #new-token: (\d+)", log):
        passes[rank].append((int(seqs), int(tokens)))
    print(f"prefill passes (#seq, #token) per DP group: {passes}")
    assert passes["0"] and passes["1"] and sorted(passes["0"]) != sorted(passes["1"]), passes


def _wait_for(server, names: set[str], timeout: float = 60.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not names <= set(staged(server)):
        time.sleep(0.05)
    time.sleep(1.0)  # late duplicates or strays from another rank
    return staged(server)


def test_one_dump_per_request_from_uneven_batches(parallel_server, hf_model):
    """Six prompts of 1-300 tokens in one call: exactly six dumps, each exact; under DP both groups wrote."""
    name, _card, server = parallel_server
    g = torch.Generator().manual_seed(23)
    ids = [torch.randint(10, 129000, (t,), generator=g).tolist() for t in (300, 1, 130, 7, 65, 2)]
    rids = [f"hs-par{i}-{i}-{len(x)}" for i, x in enumerate(ids)]
    post(server.url, {"rid": rids, "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}, timeout=120)
    want = {r + ".safetensors" for r in rids}
    try:
        assert set(_wait_for(server, want)) == want
        ranks, worst = [], (0.0, 0.0)
        for rid, x in zip(rids, ids):
            with safe_open(os.path.join(server.staging_dir, rid + ".safetensors"), "pt") as f:
                meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
            assert meta["rid"] == rid and t["input_ids"].tolist() == x
            ranks.append(meta["attn_dp_rank"])
            a, fin = _worst(hf_model, torch.tensor(x), t["aux_hidden_states"], t["final_hidden_state"])
            assert a <= LIMIT and fin <= LIMIT, (rid, a, fin)
            worst = (max(worst[0], a), max(worst[1], fin))
        print(f"[{name}] one batched call, dumps per DP rank {sorted(ranks)}; worst aux {worst[0]:.2g}, final {worst[1]:.2g}")
        assert set(ranks) == ({"0"} if name == "tp2" else {"0", "1"}), ranks
    finally:
        remove_dumps(server.staging_dir, rids)


def test_layer_hooks_under_tp_are_refused_before_start(tmp_path):
    """The real 0.5.23 env: forcing layer_hooks with tp 2 names the un-reduced partial sum and aux_return."""
    from hs_dataset.capture.serve import ServeError, plan_server

    _require_env()
    with pytest.raises(ServeError, match=r"tp 2.*OwedOutput.*un-reduced partial sum.*'aux_return'") as err:
        plan_server(
            _card("tp2"), python=str(SERVER_PYTHON), staging_dir=str(tmp_path / "st"), sglang_overrides={"mechanism": "layer_hooks"}
        )
    assert "CUDA graph" not in str(err.value)
    print(f"layer_hooks under tp 2 refused: {err.value}")
