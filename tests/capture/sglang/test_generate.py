"""Generation on SGLang servers: requests in flight sized from what the servers report, and failover off a dead or hung one.

The ``/server_info`` shapes are the ones the releases' code builds (read in
``.sglang-venv`` and its overlays): 0.5.23 and 0.5.14 report the scheduler's own limit per
data-parallel rank (``internal_states[i].effective_max_running_requests_per_dp``) and
``memory_usage.token_capacity``; 0.5.5 only the settings (``max_running_requests``, null
unless set) and the KV capacity. The 0.5.23 figures are those of the CPU test server.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hs_dataset.capture.sglang.capacity import DEFAULT_IN_FLIGHT, MAX_IN_FLIGHT, in_flight, server_slots
from hs_dataset.capture.sglang.generate import SGLangGenerator
from hs_dataset.regenerate.generator import GenerationParams

CPU_0_5_23 = {  # the CPU test server of tests/fixtures/sglang_server.py, as it answers /server_info
    "version": "0.5.23",
    "max_running_requests": None,
    "max_total_num_tokens": 4096,
    "internal_states": [
        {"effective_max_running_requests_per_dp": 2048, "max_running_requests": None, "memory_usage": {"token_capacity": 4096}}
    ],
}
OLD_0_5_5 = {
    "version": "0.5.5",
    "max_total_num_tokens": 300_000,
    "internal_states": [{"max_running_requests": None, "memory_usage": {"token_capacity": 300_000}}],
}
DP2_0_5_14 = {
    "version": "0.5.14",
    "max_total_num_tokens": 500_000,
    "internal_states": [{"effective_max_running_requests_per_dp": 96, "memory_usage": {"token_capacity": 500_000}}] * 2,
}


def test_each_release_s_fields_give_the_bound():
    assert server_slots(CPU_0_5_23, 6) == (682, "max running requests 2048, KV cache 4096 tokens / 6 new tokens a request")
    assert server_slots(CPU_0_5_23, 512)[0] == 8  # the KV cache is the limit
    assert server_slots(OLD_0_5_5, 1024)[0] == 292  # no running limit reported: the KV cache alone
    assert server_slots({**OLD_0_5_5, "max_running_requests": 128}, 1024)[0] == 128  # the operator's setting
    assert server_slots(DP2_0_5_14, 512)[0] == 192  # two data-parallel ranks, 96 each
    assert server_slots(OLD_0_5_5, 16384)[0] == 73  # an answer reserves at most 4096 KV tokens, as SGLang estimates it
    assert "clipped" in server_slots(OLD_0_5_5, 16384)[1]
    assert server_slots({"version": "0.5.23"}, 512) == (None, "reports no limits")
    assert server_slots({"internal_states": "garbage", "max_total_num_tokens": True}, 512)[0] is None


def test_the_run_s_bound_sums_servers_and_the_card_caps_it():
    assert in_flight([DP2_0_5_14, DP2_0_5_14], 512, None).requests == 384
    sized = in_flight([DP2_0_5_14, DP2_0_5_14], 512, 100)
    assert sized.requests == 100 and "regenerate.concurrency" in sized.source and "384" in sized.source
    assert in_flight([CPU_0_5_23], 512, 64).requests == 8  # the card is an upper bound, not a demand
    assert in_flight([CPU_0_5_23], 1, None).requests == MAX_IN_FLIGHT
    assert in_flight([{}], 512, None).requests == DEFAULT_IN_FLIGHT
    assert in_flight([{}], 512, 40).requests == 40
    assert in_flight([DP2_0_5_14, {}], 512, None).requests == 192 + DEFAULT_IN_FLIGHT


# ---------------------------------------------------------------------------- failover
class _Handler(BaseHTTPRequestHandler):
    delay_s = 0.0

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(self.delay_s)
        n = body["sampling_params"]["max_new_tokens"]
        answer = json.dumps({"output_ids": [7] * n, "meta_info": {"finish_reason": {"type": "length"}}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


def _serve(delay_s: float):
    handler = type("Handler", (_Handler,), {"delay_s": delay_s})
    server_class = type("Server", (ThreadingHTTPServer,), {"request_queue_size": 128})  # all requests connect at once
    httpd = server_class(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture
def healthy():
    httpd, url = _serve(0.0)
    yield url
    httpd.shutdown()


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens


@pytest.mark.parametrize("bad", ["dead", "hung"])
def test_a_dead_or_hung_server_s_requests_move_to_the_others(healthy, bad):
    hung = _serve(30.0) if bad == "hung" else None
    urls = [hung[1] if hung else _dead_url(), healthy]
    generator = SGLangGenerator(urls, concurrency=8, request_timeout_s=1.0, retries=0, cooldown_s=60.0)
    t0 = time.monotonic()
    try:
        futures = [generator.submit([1, 2, 3], GenerationParams(max_new_tokens=3)) for _ in range(24)]
        results = [f.result(timeout=30) for f in futures]
    finally:
        generator.close()
        if hung:
            hung[0].shutdown()
    elapsed = time.monotonic() - t0
    assert all(r.finish == "length" and r.token_ids == [7, 7, 7] for r in results), [r.error for r in results if r.error][:3]
    bad_ep, good_ep = generator.endpoints
    assert bad_ep.failures >= 1 and bad_ep.down_until > time.monotonic() and good_ep.failures == 0
    assert elapsed < 10, f"{bad} server stalled the run for {elapsed:.1f} s"
