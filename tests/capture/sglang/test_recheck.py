"""A server that comes back after a failure is read again: restarted with another model or version, it is taken out of rotation.

The generator's side; the capture client's is ``test_backend_recheck.py`` (both share ``recheck.py`` and the stand-in).
"""

from __future__ import annotations

import pytest

from hs_dataset.capture.sglang.generate import SGLangGenerator
from hs_dataset.regenerate.generator import GenerationParams
from tests.fixtures.ports import free_port
from tests.fixtures.sglang_standin import RESTARTS, StandIn, retired_line, server_info


@pytest.fixture
def port() -> int:
    return free_port()


ORIGINAL = server_info()
PARAMS = GenerationParams(max_new_tokens=3)


def _fail_once_then_restart(port: int, restarted: dict, busy: int = 0) -> tuple[SGLangGenerator, list]:
    """A generator trusts the server, sees it die (one failed request), then meets it restarted with ``restarted``
    (whose ``/server_info`` answers 503 to its first ``busy`` reads)."""
    url = f"http://127.0.0.1:{port}"
    generator = SGLangGenerator([url], retries=1, cooldown_s=0.05, request_timeout_s=5.0)
    first = StandIn(port, ORIGINAL)
    results = [generator.generate([[1, 2]], PARAMS)[0]]
    first.stop()
    results.append(generator.generate([[1, 2]], PARAMS)[0])
    second = StandIn(port, restarted, busy=busy)
    try:
        results.append(generator.generate([[1, 2]], PARAMS)[0])
    finally:
        generator.close()
        second.stop()
    return generator, results


@pytest.mark.parametrize("restarted, change", list(RESTARTS.values()), ids=list(RESTARTS))
def test_a_server_restarted_as_another_is_refused_after_coming_back(port, restarted, change):
    generator, (ok, down, back) = _fail_once_then_restart(port, restarted)
    assert ok.finish == "length" and down.finish == "failed"
    expected = retired_line(f"http://127.0.0.1:{port}", change)
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
