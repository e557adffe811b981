"""Untrusted input the SGLang client reads from the staging directory: the hooks' status files and the dumps.

Each case plants one hostile file (or sample) where the client reads, and asserts a
one-line refusal or correct handling, a time bound (HANG:), a memory bound measured in a
child process (MEMORY:), that nothing outside was changed (ESCAPE:) and that nothing was
lost (LOST:). Assertion tags: tests/fixtures/tally.py. Temporary files, non-finite server samples
and 4-bit exports are in tests/formats/ and tests/interop/; docs/LIMITS.md lists them all.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import threading
import time
from pathlib import Path

import pytest
import torch

from hs_dataset.capture.base import CaptureFailure
from hs_dataset.capture.sglang.diagnose import NO_REPORT_S, diagnose, read_report
from hs_dataset.capture.sglang.dumps import ExpectedDump, Refusal, await_dump, check_dump
from hs_dataset.capture.sglang.validate import hooks_see_rids, legacy_hook_config
from hs_dataset.sample import CapturedSample, TokenizedSample
from hs_dataset.server_patch.contract.dump import DUMP_FORMAT, DUMP_SUFFIX, DUMP_VERSION, REFUSED_SUFFIX
from hs_dataset.server_patch.contract.spares import SPARE_DIR
from hs_dataset.server_patch.contract.status import STATUS_FORMAT, STATUS_VERSION, status_name, write_status
from tests.fixtures.assertions import one_line
from tests.fixtures.child_memory import run_child

URL, RID = "http://127.0.0.1:9", "hs-run4-1-7"
K, H = 3, 64
WAIT_BOUND_S = 10.0  # what any one planted file may cost a reader


def in_thread(fn, timeout: float = WAIT_BOUND_S):
    """``fn()`` in a daemon thread; HANG when it is not back within ``timeout`` (a blocked open cannot be interrupted)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            box["error"] = exc

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"HANG: still blocked after {timeout:.0f} s"
    if "error" in box:
        raise box["error"]
    return box["value"], time.monotonic() - start


def unblock_fifo(path: Path) -> None:
    """Open a planted FIFO for writing without blocking, so a reader stuck on it (a regression) is released."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


# ---------------------------------------------------------------------------- status files

STATUS_OK = {
    "counted_at": 1.0,
    "rid_prefix": "hs-",
    "facts": {"forward_batch_rids": True},
    "counts": {"extend_passes": 1},
    "recent_foreign": [],
    "recent_dumps": [],
    "last_error": None,
}
STATUS_CASES = {  # field -> a value of the wrong type, and the words the skip reason must hold
    "counted_at soon": ("counted_at", "soon", "field counted_at is a str"),
    "counted_at list": ("counted_at", [1, 2], "field counted_at is a list"),
    "counted_at NaN": ("counted_at", float("nan"), "field counted_at is NaN"),
    "counts a list": ("counts", [1, 2], "field counts is a list"),
    "counts of strings": ("counts", {"extend_passes": "3"}, "counts.extend_passes"),
    "counts negative": ("counts", {"extend_passes": -4}, "counts.extend_passes"),
    "recent_foreign a string": ("recent_foreign", "hs-run4-1-7", "field recent_foreign is a str"),
    "recent_dumps an int": ("recent_dumps", 5, "field recent_dumps is a int"),
    "recent_dumps of ints": ("recent_dumps", [1, 2], "recent_dumps must be a list"),
    "facts a list": ("facts", ["forward_batch_rids"], "field facts is a list"),
    "rid_prefix an int": ("rid_prefix", 7, "field rid_prefix is a int"),
    "last_error a dict": ("last_error", {"x": 1}, "field last_error is a dict"),
    "hf_aux_layer_ids strings": ("hf_aux_layer_ids", ["2", "3"], "hf_aux_layer_ids must be a list of integers"),
    "content_keys a string": ("content_keys", "yes", "field content_keys is a str"),
    "pid a float": ("pid", 1.5, "field pid is a float"),
}


def plant_status(stage: Path, payload: dict, writer: str = "dp0") -> Path:
    body = {"format": STATUS_FORMAT, "version": STATUS_VERSION, "writer": writer, "updated": time.time(), **payload}
    path = stage / status_name(writer)
    path.write_text(json.dumps(body))
    return path


@pytest.mark.parametrize("name", list(STATUS_CASES))
def test_status_field_of_the_wrong_type_is_skipped_and_named(tmp_path, name):
    field, value, reason = STATUS_CASES[name]
    path = plant_status(tmp_path, {**STATUS_OK, field: value})
    report = read_report(str(tmp_path))  # was a traceback (float("soon"), list.items(), dict(list))
    assert report.writers == 0, f"SILENT: a status with {field}={value!r} was taken as the hooks' report"
    assert report.skipped and str(path) in report.skipped[0] and reason in report.skipped[0], report.skipped
    assert legacy_hook_config(str(tmp_path)) is None and hooks_see_rids(URL, str(tmp_path), {}) is True
    why = diagnose(URL, str(tmp_path), RID, RID, report, report, answered_at=0.0, late_s=NO_REPORT_S + 1)
    assert why is not None and reason in one_line(ValueError(why)), why


def test_good_status_beside_a_bad_one_is_still_read(tmp_path):
    plant_status(tmp_path, {**STATUS_OK, "counted_at": "soon"}, writer="dp1")
    write_status(str(tmp_path), "dp0", {**STATUS_OK, "counts": {"extend_passes": 3}})
    report = read_report(str(tmp_path))
    assert report.writers == 1 and report.count("extend_passes") == 3 and len(report.skipped) == 1


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory", "oversized"])
def test_status_that_is_not_a_small_regular_file_is_skipped_at_once(tmp_path, kind):
    path = tmp_path / status_name("dp0")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.json"
    outside.write_text(json.dumps({"format": STATUS_FORMAT, "version": STATUS_VERSION, **STATUS_OK}))
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        path.symlink_to(outside)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text(json.dumps({**STATUS_OK, "pad": "x" * 100_000}))
    try:
        report, elapsed = in_thread(lambda: read_report(str(tmp_path)))  # a FIFO held readers 167 s, then a bare TimeoutError
    finally:
        if kind == "fifo":
            unblock_fifo(path)
    assert elapsed < 2, f"HANG: {elapsed:.1f} s to skip one status file"
    assert report.writers == 0 and report.skipped and str(path) in report.skipped[0], f"SILENT: {report}"


# ---------------------------------------------------------------------------- dumps and refusal markers


def the_sample(tokens: int = 7) -> TokenizedSample:
    ids = torch.arange(10, 10 + tokens)
    return TokenizedSample("s0", ids, torch.ones(tokens, dtype=torch.bool))


EXPECTED = ExpectedDump(aux_layer_ids=(2, 3, 4), dtype=torch.bfloat16, hidden_size=H)
PROBE = ExpectedDump(aux_layer_ids=(2, 3, 4), dtype=None, hidden_size=None)  # the probe: the server's width not known yet


def dump_meta(key: str = RID) -> dict:
    return {
        "format": DUMP_FORMAT,
        "version": DUMP_VERSION,
        "rid": key,
        "final_state": "pre_norm",
        "hf_aux_layer_ids": json.dumps([2, 3, 4]),
        "sglang_version": "0.5.23",
        "dtype": "bfloat16",
    }


def write_dump(path: Path, shapes: dict[str, tuple[str, list[int]]], *, sparse: bool = True, meta: dict | None = None) -> int:
    """A dump whose header declares ``shapes`` (dtype code, shape), its data section a hole of that size; returns its size."""
    sizes = {"I64": 8, "BF16": 2, "F32": 4, "U8": 1}
    header, offset = {"__metadata__": meta or dump_meta()}, 0
    for name, (dtype, shape) in shapes.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset) if sparse else f.write(b"\0" * offset)
    return 8 + len(text) + offset


def run_await(stage: Path, expected: ExpectedDump = EXPECTED, timeout_s: float = 60.0):
    return in_thread(lambda: asyncio.run(await_dump(str(stage), RID, the_sample(), expected, timeout_s)))


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink to a dump outside"])
def test_what_sits_at_an_awaited_dump_name_is_refused_at_once(tmp_path, kind):
    path = tmp_path / (RID + DUMP_SUFFIX)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.safetensors"
    size = write_dump(
        outside, {"input_ids": ("I64", [7]), "aux_hidden_states": ("BF16", [7, 3, H]), "final_hidden_state": ("BF16", [7, H])}
    )
    before = outside.read_bytes()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(outside)
    try:
        result, elapsed = run_await(tmp_path)  # a FIFO here hung the client (the blocking open never returned)
    finally:
        if kind == "fifo":
            unblock_fifo(path)
    assert elapsed < 5, f"HANG: {elapsed:.1f} s for a {kind} at the dump name"
    assert isinstance(result, CaptureFailure) and "\n" not in result.reason, f"SILENT: {result!r}"
    assert "regular file" in result.reason or "cannot be opened" in result.reason, result.reason
    assert outside.read_bytes() == before and outside.stat().st_size == size, "ESCAPE: the file behind the link was changed"
    pool = tmp_path / SPARE_DIR
    assert not pool.exists() or not os.listdir(pool), "ESCAPE: a planted file went into the server's spare pool"


@pytest.mark.parametrize("kind", ["fifo", "directory", "oversized", "not an object"])
def test_what_sits_at_a_refusal_name_is_a_refusal_at_once(tmp_path, kind):
    path = tmp_path / (RID + REFUSED_SUFFIX)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "oversized":
        path.write_text(json.dumps({"reason": "x" * 200_000}))
    else:
        path.write_text("[1, 2, 3]")
    try:
        result, elapsed = run_await(tmp_path)
    finally:
        if kind == "fifo":
            unblock_fifo(path)
    assert elapsed < 5, f"HANG: {elapsed:.1f} s for a {kind} at the refusal name"
    assert isinstance(result, Refusal) and "\n" not in result.reason and len(result.reason) <= 1000, f"SILENT: {result!r}"


HUGE = {  # headers that pass the parser (the data section is there, as a hole) but declare more than the request holds
    "aux 2 GiB wide": (
        {"input_ids": ("I64", [7]), "aux_hidden_states": ("BF16", [7, 3, 51_130_564]), "final_hidden_state": ("BF16", [7, 51_130_564])},
        "hidden size 51130564",
    ),
    "final 2 GiB wide": (
        {"input_ids": ("I64", [7]), "aux_hidden_states": ("BF16", [7, 3, 64]), "final_hidden_state": ("BF16", [7, 153_391_690])},
        "final_hidden_state shape",
    ),
    "2 GiB extra tensor": (
        {
            "input_ids": ("I64", [7]),
            "aux_hidden_states": ("BF16", [7, 3, 64]),
            "final_hidden_state": ("BF16", [7, 64]),
            "padding": ("U8", [1 << 31]),
        },
        "no use for: padding",
    ),
    "2 GiB of tokens": (
        {"input_ids": ("I64", [1 << 28]), "aux_hidden_states": ("BF16", [7, 3, 64]), "final_hidden_state": ("BF16", [7, 64])},
        "token ids differ",
    ),
}


@pytest.mark.parametrize("name", list(HUGE))
def test_sparse_dump_declaring_gigabytes_is_refused_from_its_header(tmp_path, name):
    shapes, words = HUGE[name]
    path = tmp_path / (RID + DUMP_SUFFIX)
    size = write_dump(path, shapes)
    assert size > 1 << 31
    for expected in (EXPECTED, PROBE):
        result, elapsed = in_thread(lambda expected=expected: check_dump(str(path), RID, the_sample(), expected))
        assert isinstance(result, CaptureFailure) and "\n" not in result.reason, f"SILENT: {result!r}"
        assert words in result.reason, result.reason
        assert elapsed < 2, f"HANG: {elapsed:.1f} s to refuse a header"


def test_sparse_2gib_dump_memory_is_bounded_in_a_child(tmp_path):
    """The planted 2 GiB sparse dump cost 4.4 GB when its data was read before its shapes were checked."""
    path = tmp_path / (RID + DUMP_SUFFIX)
    write_dump(path, HUGE["aux 2 GiB wide"][0])
    code = f"""
import torch
from hs_dataset.capture.sglang.dumps import ExpectedDump, check_dump
from hs_dataset.sample import TokenizedSample
sample = TokenizedSample("s0", torch.arange(10, 17), torch.ones(7, dtype=torch.bool))
BASE = _rss('VmRSS:')
result = check_dump({str(path)!r}, {RID!r}, sample, ExpectedDump((2, 3, 4), None, None))
RESULT = {{"reason": getattr(result, "reason", "")}}
"""
    result, _elapsed = run_child(code)
    assert "hidden size 51130564, over the largest" in result["reason"], result
    assert result["growth_mb"] < 300, f"MEMORY: +{result['growth_mb']:.0f} MB for a 2 GiB sparse dump (bound 300 MB)"


def test_dump_header_over_its_bound_is_refused_unread(tmp_path):
    path = tmp_path / (RID + DUMP_SUFFIX)
    meta = {**dump_meta(), "pad": "x" * (2 << 20)}
    write_dump(
        path, {"input_ids": ("I64", [7]), "aux_hidden_states": ("BF16", [7, 3, H]), "final_hidden_state": ("BF16", [7, H])}, meta=meta
    )
    result = check_dump(str(path), RID, the_sample(), EXPECTED)
    assert isinstance(result, CaptureFailure) and "bound" in result.reason, f"SILENT: {result!r}"


def test_a_good_dump_still_reads(tmp_path):
    from safetensors.torch import save_file

    ids = torch.arange(10, 17)
    tensors = {"input_ids": ids, "aux_hidden_states": torch.randn(7, 3, H).bfloat16(), "final_hidden_state": torch.randn(7, H).bfloat16()}
    save_file(tensors, str(tmp_path / (RID + DUMP_SUFFIX)), metadata=dump_meta())
    for expected in (EXPECTED, PROBE):
        result = check_dump(str(tmp_path / (RID + DUMP_SUFFIX)), RID, the_sample(), expected)
        assert isinstance(result, CapturedSample), result
        assert torch.equal(result.aux_hidden_states, tensors["aux_hidden_states"]), "SILENT: the states changed on the way"
