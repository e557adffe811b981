"""A server that comes back after a failure is read again: restarted with another model or version, it is taken out of rotation."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hs_dataset.capture.sglang.generate import SGLangGenerator
from hs_dataset.regenerate.generator import GenerationParams

HOOKS = [{"hook_factory": "hs_dataset.hooks:model_hook", "config": {"hf_aux_layer_ids": [2, 3, 4]}}]


def _start(port: int, info: dict, busy: int = 0) -> ThreadingHTTPServer:
    """An SGLang stand-in on ``port``: ``/server_info`` answers ``info`` (503 to its first ``busy`` reads), ``/generate`` three 7s."""
    busy_left = [busy]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if busy_left[0] > 0:
                busy_left[0] -= 1
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._answer(info)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self._answer({"output_ids": [7, 7, 7], "meta_info": {"finish_reason": {"type": "length"}}})

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def _stop(httpd: ThreadingHTTPServer) -> None:
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ORIGINAL = {"model_path": "/models/a", "version": "0.5.23", "forward_hooks": HOOKS}
PARAMS = GenerationParams(max_new_tokens=3)


def _fail_once_then_restart(port: int, restarted: dict, busy: int = 0) -> tuple[SGLangGenerator, list]:
    """A generator trusts the server, sees it die (one failed request), then meets it restarted with ``restarted``
    (whose ``/server_info`` answers 503 to its first ``busy`` reads)."""
    url = f"http://127.0.0.1:{port}"
    generator = SGLangGenerator([url], retries=1, cooldown_s=0.05, request_timeout_s=5.0)
    first = _start(port, ORIGINAL)
    results = [generator.generate([[1, 2]], PARAMS)[0]]
    _stop(first)
    results.append(generator.generate([[1, 2]], PARAMS)[0])
    second = _start(port, restarted, busy)
    try:
        results.append(generator.generate([[1, 2]], PARAMS)[0])
    finally:
        generator.close()
        _stop(second)
    return generator, results


@pytest.mark.parametrize(
    "restarted, change",
    [
        ({**ORIGINAL, "model_path": "/models/b"}, "model '/models/a' -> '/models/b'"),
        ({**ORIGINAL, "version": "0.5.14"}, "version '0.5.23' -> '0.5.14'"),
        (
            {**ORIGINAL, "forward_hooks": [{"hook_factory": "hs_dataset.hooks:model_hook", "config": {"hf_aux_layer_ids": [1, 5]}}]},
            "aux layers [2, 3, 4] -> [1, 5]",
        ),
    ],
    ids=["model", "version", "aux-layers"],
)
def test_a_server_restarted_as_another_is_refused_after_coming_back(port, restarted, change):
    generator, (ok, down, back) = _fail_once_then_restart(port, restarted)
    assert ok.finish == "length" and down.finish == "failed"
    expected = (
        f"SGLang server http://127.0.0.1:{port} came back from a failure as a different server ({change}): taken out of rotation "
        "for this run; restart it as it was (the same card and model), or start the run again"
    )
    assert back.finish == "failed" and back.error == expected
    assert generator.endpoints[0].retired == expected and not generator.endpoints[0].available(float("inf"))


def test_the_same_server_restarted_is_trusted_again(port):
    generator, (ok, down, back) = _fail_once_then_restart(port, dict(ORIGINAL))
    assert (ok.finish, down.finish, back.finish) == ("length", "failed", "length")
    ep = generator.endpoints[0]
    assert ep.retired is None and not ep.recheck


def test_a_server_too_busy_to_describe_itself_is_read_again_not_retired(port):
    """A 503 from /server_info says nothing about which server this is: it is asked again, not taken out of rotation."""
    generator, (ok, down, back) = _fail_once_then_restart(port, dict(ORIGINAL), busy=1)
    assert (ok.finish, down.finish, back.finish) == ("length", "failed", "length")
    ep = generator.endpoints[0]
    assert ep.retired is None and not ep.recheck
