"""Fault injection against a REAL SGLang server (tiny DeepseekV3, float32, CPU).

Same environment rules as tests/capture/sglang/test_server.py (whose helpers are reused):
needs ``.sglang-venv``; skipped with a message when it is missing, a failure under CI.
Two server starts in all (~30-75 s each on 2 cores): the first server is frozen
(SIGSTOP) and then killed (SIGKILL of its whole process group) in the middle of a
build; the restarted one serves the rest of the module.

* server frozen then killed mid-build and restarted on the same port and staging
  directory: in-flight requests time out, the client retries with back-off, the run
  ends with every sample stored or reported; the rerun resumes (skips what is stored);
  planted dumps for the rerun's next request ids -- one truncated, one holding another
  prompt -- are refused, never stored; a last rerun completes. Every stored sample's
  input_ids/loss_mask equal the source's and its states equal an independent HF forward
  (float32); the crashed run's staging leftovers are swept and the client cleans its own.
* one endpoint hangs (a proxy that stops answering mid-run) while another works: the
  run completes through the healthy one; an endpoint that hangs from the start is
  refused at validation, by name, in bounded time.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from hs_dataset import open_dataset
from hs_dataset.formats.manifest import Manifest
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.pipeline.build import build_dataset
from tests.fixtures.ports import free_port as _free_port
from tests.fixtures.sglang_server import AUX, SERVER_PYTHON, hf_reference, rel, require_sglang_env as _require_env, staged_files

pytestmark = pytest.mark.sglang

TOL = 1e-6  # relative error vs an independent float32 HF forward
ORPHAN_TTL_S = 12.0  # the restarted server sweeps staging files older than this (default 1 h)
CLIENT = {"concurrency": 4, "request_timeout_s": 5.0, "dump_timeout_s": 10.0, "retries": 6, "backoff_s": 0.5, "endpoint_cooldown_s": 0.5}


# `card` and `tiny_model` are the session fixtures of tests/sglang_server_util.py (via conftest.py)


@pytest.fixture(scope="module")
def hf_model(tiny_model):
    from transformers import AutoModelForCausalLM

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 OpenMP threads next to a running server on 2 cores: very slow
    yield AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, local_files_only=True).eval()
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def source_samples(card, tiny_model):
    """The bundled conversations tokenized exactly as the build does: sample id -> (input_ids, loss_mask)."""
    from transformers import AutoTokenizer

    from hs_dataset.sources import SampleRules, bundled_conversations_path, iter_samples

    tok = AutoTokenizer.from_pretrained(tiny_model, local_files_only=True)
    cfg = json.loads((Path(tiny_model) / "config.json").read_text())
    samples = list(
        iter_samples(
            bundled_conversations_path(), tok, SampleRules(max_length=card.max_length, overflow=card.overflow, vocab_size=cfg["vocab_size"])
        )
    )
    return samples


def _plan(card, port: int, staging: Path):
    from hs_dataset.capture.serve.plan import plan_server

    staging_cfg = card.sglang.staging.model_dump()
    staging_cfg["orphan_ttl_s"] = ORPHAN_TTL_S
    plan = plan_server(card, port=port, staging_dir=str(staging), python=str(SERVER_PYTHON), sglang_overrides={"staging": staging_cfg})
    plan.env["HS_CAPTURE_SWEEP_INTERVAL_S"] = "1"
    return plan


def _launch(card, port: int, root: Path, name: str):
    from hs_dataset.capture.serve import launch

    t0 = time.monotonic()
    server = launch(_plan(card, port, root / "stage"), log_path=str(root / f"{name}.log"), timeout=300)
    print(f"[{name}] healthy after {time.monotonic() - t0:.1f} s at {server.url}")
    return server


@pytest.fixture(scope="module")
def box(card, tmp_path_factory):
    """The current server of this module (test 1 kills it and puts the restarted one here)."""
    _require_env()
    root = tmp_path_factory.mktemp("sglang-faults")
    port = _free_port()
    state = {"root": root, "port": port, "server": _launch(card, port, root, "first")}
    yield state
    state["server"].stop(timeout=5)


def _server(box, card):
    if not box["server"].alive():  # an earlier test died between the kill and the restart
        box["server"] = _launch(card, box["port"], box["root"], "again")
    return box["server"]


def _backend(card, urls, *, run_id=None, **kw):
    """A client of ``urls`` with the CLIENT settings (``kw`` overrides keys of the card's backend section)."""
    from hs_dataset.capture.base import CaptureTarget
    from hs_dataset.capture.sglang.backend import SGLangBackend

    section = card.with_overrides(backend={**CLIENT, **kw}).backend
    return SGLangBackend(section, CaptureTarget.from_card(card), servers=urls, run_id=run_id)


def _stored(out: Path) -> int:
    try:
        return Manifest.load(out).num_samples
    except Exception:
        return 0


def _run_in_thread(fn):
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def _dump_bytes(rid: str, ids: torch.Tensor, hidden: int = 64) -> bytes:
    from safetensors.torch import save

    t = ids.shape[0]
    meta = {
        "format": "hs_dataset.dump",
        "version": "1",
        "rid": rid,
        "hf_aux_layer_ids": json.dumps(AUX),
        "final_state": "pre_norm",
        "sglang_version": "0.5.23",
        "dtype": "float32",
    }
    return save(
        {"input_ids": ids, "aux_hidden_states": torch.zeros(t, len(AUX), hidden), "final_hidden_state": torch.zeros(t, hidden)},
        metadata=meta,
    )


def _check_against_source_and_hf(out: Path, source_samples, hf_model) -> float:
    by_id = {s.sample_id: s for s in source_samples}
    ds = open_dataset(out)
    worst = 0.0
    for item in ds:
        src = by_id[item["sample_id"]]
        assert torch.equal(item["input_ids"], src.input_ids), item["sample_id"]
        assert torch.equal(item["loss_mask"], src.loss_mask), item["sample_id"]
        ref_aux, ref_final = hf_reference(hf_model, src.input_ids)
        for k in range(len(AUX)):
            worst = max(worst, rel(item["aux_hidden_states"][:, k], ref_aux[:, k]))
        worst = max(worst, rel(item["final_hidden_state"], ref_final))
    return worst


# ---------------------------------------------------------------------------- server death
def test_server_frozen_killed_and_restarted_mid_build(card, box, source_samples, hf_model, tmp_path):
    server = box["server"]
    staging = Path(server.staging_dir)
    out = tmp_path / "ds"
    first_n = 30
    be1 = _backend(card, [server.url])
    thread, run1 = _run_in_thread(lambda: build_dataset(card, out, backend=be1, num_samples=first_n, batch_size=4, shard_bytes=100_000))

    deadline = time.monotonic() + 240
    while _stored(out) < 6 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert thread.is_alive(), f"the first run ended before the fault ({run1})"
    stored_at_fault = _stored(out)
    os.killpg(server.proc.pid, signal.SIGSTOP)  # the server hangs: in-flight requests time out
    time.sleep(CLIENT["request_timeout_s"] + 1.5)
    os.killpg(server.proc.pid, signal.SIGKILL)  # ... then dies, its whole process group
    server.proc.wait(timeout=30)
    at_death = sorted(os.listdir(staging))
    old = time.time() - 10 * ORPHAN_TTL_S  # what an earlier crashed run left: a partial write and unclaimed files
    planted_old = [".tmp-hs-deadrun-1-9.safetensors.4242.0", "hs-deadrun-2-9.safetensors", "hs-deadrun-3-9.refused.json"]
    for name in planted_old:
        (staging / name).write_bytes(b"left by a crashed run")
        os.utime(staging / name, (old, old))
    t_kill = time.monotonic()
    box["server"] = server = _launch(card, box["port"], box["root"], "restarted")
    restart_s = time.monotonic() - t_kill
    thread.join(timeout=600)
    assert not thread.is_alive(), "the first run hung after the server came back"
    be1.close()
    assert "error" not in run1, f"the first run raised instead of reporting: {run1.get('error')!r}"
    rep1 = run1["value"]
    stats1 = dict(be1.stats)
    print(
        f"run 1: {stored_at_fault} stored at the fault, restart took {restart_s:.0f} s; written {rep1.samples_written}, "
        f"failed {len(rep1.capture_failures)}; client stats {stats1}; staging at death {at_death}"
    )
    assert rep1.samples_written + len(rep1.capture_failures) == first_n  # every sample stored or reported
    assert stats1["retries"] >= 1 and stats1["endpoint_errors"] >= 1, stats1
    assert verify_dataset(out).ok

    # the rerun resumes; the next two request ids it will use are pre-planted with bad dumps
    stored = set(open_dataset(out).sample_ids)
    missing = [s for s in source_samples if s.sample_id not in stored]
    assert len(missing) >= 2
    m1, m2 = missing[0], missing[1]
    run_id = "rerun1"  # rids: hs-rerun1-<seq>-<T>; seq 1 is the validation probe, then samples in source order
    partial = _dump_bytes(f"hs-{run_id}-2-{m1.num_tokens}", m1.input_ids)
    (staging / f"hs-{run_id}-2-{m1.num_tokens}.safetensors").write_bytes(partial[: len(partial) // 2])
    other_prompt = torch.randint(10, 1000, (m2.num_tokens,))
    (staging / f"hs-{run_id}-3-{m2.num_tokens}.safetensors").write_bytes(_dump_bytes(f"hs-{run_id}-3-{m2.num_tokens}", other_prompt))
    be2 = _backend(card, [server.url], run_id=run_id)
    try:
        rep2 = build_dataset(card, out, backend=be2, batch_size=4, shard_bytes=100_000)
    finally:
        be2.close()
    failed2 = {f["sample_id"]: f["reason"] for f in rep2.capture_failures}
    print(f"run 2: skipped {rep2.skipped_existing}, written {rep2.samples_written}, failed {failed2}")
    assert rep2.skipped_existing == len(stored)
    assert rep2.samples_written + len(failed2) == len(missing)
    assert "unreadable dump" in failed2.get(m1.sample_id, ""), failed2
    assert "token ids differ" in failed2.get(m2.sample_id, ""), failed2
    assert not (staging / f"hs-{run_id}-2-{m1.num_tokens}.safetensors").exists()

    be3 = _backend(card, [server.url])
    try:
        rep3 = build_dataset(card, out, backend=be3, batch_size=4, shard_bytes=100_000)
    finally:
        be3.close()
    assert not rep3.capture_failures and rep3.samples_written == len(failed2)

    result = verify_dataset(out)
    assert result.ok, result.problems
    ids = open_dataset(out).sample_ids
    assert len(ids) == len(set(ids)) == len(source_samples)
    worst = _check_against_source_and_hf(out, source_samples, hf_model)
    print(f"all {len(ids)} stored samples match the source tokens; worst relative error vs HF {worst:.2e}")
    assert worst <= TOL, worst

    deadline = time.monotonic() + 3 * ORPHAN_TTL_S
    while staged_files(staging) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert staged_files(staging) == [], f"staging leftovers never cleaned: {staged_files(staging)}"
    assert "swept" in Path(server.log_path).read_text()


# ---------------------------------------------------------------------------- a hanging endpoint
class HangingProxy:
    """TCP proxy to a server; from the ``hang_at``-th ``POST /generate`` on it accepts and forwards nothing."""

    def __init__(self, target_port: int, hang_at: int | None) -> None:
        self.target_port = target_port
        self.hang_at = hang_at
        self.generates = 0
        self.hanging = threading.Event()
        if hang_at == 0:
            self.hanging.set()
        self.closed = threading.Event()
        self.held: list[socket.socket] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            if self.hanging.is_set():
                self.held.append(conn)  # accepted, never answered
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                conn.close()
                continue
            self.held += [conn, upstream]
            threading.Thread(target=self._pipe, args=(conn, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, conn, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, client_side: bool) -> None:
        src.settimeout(None)
        try:
            while not self.closed.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if client_side and self.hang_at and b"POST /generate" in data:
                    with self._lock:
                        self.generates += 1
                        if self.generates >= self.hang_at:
                            self.hanging.set()
                while self.hanging.is_set() and not self.closed.is_set():
                    time.sleep(0.05)  # stalled: nothing goes through any more
                if self.closed.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.closed.set()
        for s in [self.sock, *self.held]:
            try:
                s.close()
            except OSError:
                pass


def test_hanging_endpoint_mid_run_the_healthy_one_finishes(card, box, source_samples, hf_model, tmp_path):
    server = _server(box, card)
    port = int(server.url.rsplit(":", 1)[1])
    proxy = HangingProxy(port, hang_at=4)  # the probe, two samples, then it stops answering
    out = tmp_path / "ds"
    n = 16
    be = _backend(card, [proxy.url, server.url], retries=4)
    try:
        t0 = time.monotonic()
        report = build_dataset(card, out, backend=be, num_samples=n, batch_size=4, shard_bytes=100_000)
        took = time.monotonic() - t0
    finally:
        be.close()
        proxy.close()
    stats = dict(be.stats)
    served = {e.url: e.served for e in be.endpoints}
    print(f"hanging endpoint: {n} samples in {took:.1f} s; served {served}; stats {stats}")
    assert proxy.hanging.is_set(), "the proxy never hung: the test did not exercise the fault"
    assert report.samples_written == n and not report.capture_failures, report.capture_failures
    assert stats["endpoint_errors"] >= 1
    assert served[server.url] >= n - 2
    assert verify_dataset(out).ok
    assert _check_against_source_and_hf(out, source_samples, hf_model) <= TOL
    deadline = time.monotonic() + 5
    while staged_files(server.staging_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert staged_files(server.staging_dir) == []  # nothing of this run left behind (spares are reusable memory)


def test_endpoint_hanging_from_the_start_is_refused_by_name_in_bounded_time(card, box, tmp_path):
    """Validation checks every server: one that accepts and never answers is named, not waited on forever."""
    from hs_dataset.errors import ServerValidationError

    server = _server(box, card)
    proxy = HangingProxy(int(server.url.rsplit(":", 1)[1]), hang_at=0)
    be = _backend(card, [server.url, proxy.url])
    try:
        t0 = time.monotonic()
        with pytest.raises(ServerValidationError) as info:
            be.validate()
        took = time.monotonic() - t0
    finally:
        be.close()
        proxy.close()
    assert proxy.url in str(info.value) and server.url not in str(info.value), str(info.value)
    assert took < 30, took
