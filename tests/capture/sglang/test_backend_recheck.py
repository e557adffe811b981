"""The capture client's recheck in ``_request``: a server back from a failure is read again before it captures.

Through the client's whole request path (``_capture_one`` -> ``_attempt`` -> ``_request``) against a
stand-in that dies and comes back on its port: back as another server (model, version or aux
layers changed), it is taken out of rotation with one line naming the URL and the change and no
capture request reaches it; back unchanged, it is trusted again and captures; a ``/server_info``
that answers 503 is read again later, and the server is not retired. The generator's side of the
same recheck is ``test_recheck.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from hs_dataset.capture.base import CaptureFailure, CaptureTarget
from hs_dataset.capture.sglang.backend import SGLangBackend
from hs_dataset.capture.sglang.recheck import identity_of
from hs_dataset.config import SGLangBackendSection
from hs_dataset.sample import CapturedSample, TokenizedSample
from tests.fixtures.ports import free_port
from tests.fixtures.sglang_standin import AUX, RESTARTS, StandIn, retired_line, server_info

ORIGINAL = server_info()
SECTION = SGLangBackendSection(
    name="sglang", retries=1, backoff_s=0.01, endpoint_cooldown_s=0.05, request_timeout_s=5.0, dump_timeout_s=10.0
)


def _sample(n: int) -> TokenizedSample:
    return TokenizedSample(f"s{n}", torch.tensor([11, 12, 13, n]), torch.tensor([False, True, True, True]))


def _client(url: str, staging: Path) -> SGLangBackend:
    """A client whose server passed the checks at start: what ``validate`` leaves (its description, trusted)."""
    backend = SGLangBackend(
        SECTION, CaptureTarget("/models/a", tuple(AUX), "bfloat16"), servers=[url], staging_dir=str(staging), probe=False
    )
    ep = backend.endpoints[0]
    ep.server_info = dict(ORIGINAL)
    ep.identity, ep.recheck = identity_of(ep.server_info), False
    return backend


def _capture(backend: SGLangBackend, n: int):
    return backend._ensure_loop().run(backend._capture_one(_sample(n)), timeout=60)


def _fail_then_restart(tmp_path: Path, restarted: dict, busy: int = 0) -> tuple[SGLangBackend, list, StandIn]:
    """The client captures on the server, sees it die (a failed sample), then meets it restarted as ``restarted``
    (whose ``/server_info`` answers 503 to its first ``busy`` reads); returns the client, the three results and
    the restarted stand-in."""
    port, staging = free_port(), tmp_path / "staging"
    staging.mkdir()
    backend = _client(f"http://127.0.0.1:{port}", staging)
    first = StandIn(port, ORIGINAL, staging=staging)
    try:
        results = [_capture(backend, 1)]
    finally:
        first.stop()
    results.append(_capture(backend, 2))
    second = StandIn(port, restarted, busy=busy, staging=staging)
    try:
        results.append(_capture(backend, 3))
    finally:
        backend.close()
        second.stop()
    return backend, results, second


@pytest.mark.parametrize("restarted, change", list(RESTARTS.values()), ids=list(RESTARTS))
def test_a_server_back_as_another_is_taken_out_of_rotation_with_one_line(tmp_path, caplog, restarted, change):
    caplog.set_level(logging.ERROR, logger="hs_dataset.capture.sglang.recheck")
    backend, (ok, down, back), second = _fail_then_restart(tmp_path, restarted)
    assert isinstance(ok, CapturedSample) and isinstance(down, CaptureFailure)
    expected = retired_line(backend.endpoints[0].url, change)
    assert back == CaptureFailure("s3", expected)
    assert [r.getMessage() for r in caplog.records] == [expected]  # said once, in one line
    ep = backend.endpoints[0]
    assert ep.retired == expected and not ep.available(float("inf"))
    assert second.posts == 0, "a capture request reached the changed server"
    assert backend.stats["endpoint_errors"] >= 2  # the failure and the refusal of the changed server


def test_a_server_back_unchanged_is_trusted_again(tmp_path):
    backend, (ok, down, back), second = _fail_then_restart(tmp_path, dict(ORIGINAL))
    assert isinstance(ok, CapturedSample) and isinstance(down, CaptureFailure)
    assert isinstance(back, CapturedSample) and back.sample_id == "s3" and back.aux_hidden_states.shape == (4, len(AUX), 8)
    ep = backend.endpoints[0]
    assert ep.retired is None and not ep.recheck and second.gets == 1 and second.posts == 1


def test_a_server_info_that_answers_503_is_read_again_later_not_retired(tmp_path):
    """A 503 from /server_info says nothing about which server this is: the sample waits and it is asked again."""
    backend, (ok, down, back), second = _fail_then_restart(tmp_path, dict(ORIGINAL), busy=1)
    assert isinstance(ok, CapturedSample) and isinstance(down, CaptureFailure)
    assert isinstance(back, CapturedSample) and back.sample_id == "s3"
    ep = backend.endpoints[0]
    assert ep.retired is None and not ep.recheck
    assert second.gets == 2 and second.posts == 1  # the 503, then the description that let the request through
