"""A late dump is explained from the hooks' status files, and only from counters taken after the answer."""

from __future__ import annotations

import json
import os
import time

import pytest

from hs_dataset.capture.sglang.diagnose import NO_REPORT_S, diagnose, read_report
from hs_dataset.server_patch.contract.status import MAX_STATUS_BYTES, read_statuses, status_name, write_status

URL, RID = "http://127.0.0.1:9", "hs-run1-7-12"


def _status(stage, *, passes: int, foreign=(), dumps=(), errors: int = 0, counted_at: float | None = None, writer: str = "dp0", **facts):
    write_status(
        str(stage),
        writer,
        {
            "counted_at": time.time() if counted_at is None else counted_at,
            "rid_prefix": "hs-",
            "facts": facts,
            "counts": {"extend_passes": passes, "hook_errors": errors},
            "recent_foreign": list(foreign),
            "recent_dumps": list(dumps),
            "last_error": "ValueError: boom" if errors else None,
        },
    )


def _why(stage, before, *, answered_at: float, late_s: float = 5.0, key: str = RID):
    return diagnose(URL, str(stage), key, RID, before, read_report(str(stage)), answered_at=answered_at, late_s=late_s)


def test_no_status_file_is_a_cause_only_after_a_long_wait(tmp_path):
    before = read_report(str(tmp_path))
    assert _why(tmp_path, before, answered_at=time.time(), late_s=NO_REPORT_S - 1) is None
    why = _why(tmp_path, before, answered_at=time.time(), late_s=NO_REPORT_S + 1)
    assert "no capture hook reports" in why and str(tmp_path) in why and "hs-dataset serve" in why


def test_no_prefill_pass_since_the_request_names_the_prefill_graph(tmp_path):
    _status(tmp_path, passes=4)
    before = read_report(str(tmp_path))
    answered = time.time()
    _status(tmp_path, passes=4, counted_at=answered + 0.1)
    why = _why(tmp_path, before, answered_at=answered)
    assert "prefill CUDA graph" in why and "--disable-prefill-cuda-graph" in why


def test_counters_older_than_the_answer_prove_nothing_until_they_stay_old(tmp_path):
    """A status writer running late (a loaded machine) must not be taken for a missing pass; one that never reports
    again (a dead server's file, another server's dir) is the hooks not running there."""
    answered = time.time()
    _status(tmp_path, passes=4, counted_at=answered - 1)
    before = read_report(str(tmp_path))
    assert _why(tmp_path, before, answered_at=answered) is None
    why = _why(tmp_path, before, answered_at=answered, late_s=NO_REPORT_S + 1)
    assert "no capture hook has reported for" in why and str(tmp_path) in why


def test_a_pass_seen_means_wait_for_the_dump(tmp_path):
    _status(tmp_path, passes=4)
    before = read_report(str(tmp_path))
    answered = time.time()
    _status(tmp_path, passes=5, counted_at=answered + 0.1)
    assert _why(tmp_path, before, answered_at=answered) is None


def test_a_request_skipped_as_foreign_names_the_prefix(tmp_path):
    _status(tmp_path, passes=1)
    before = read_report(str(tmp_path))
    answered = time.time()
    _status(tmp_path, passes=2, foreign=[RID], counted_at=answered + 0.1)
    why = _why(tmp_path, before, answered_at=answered)
    assert "skipped request" in why and "'hs-'" in why


def test_unusable_passes_are_named_even_without_our_rid(tmp_path):
    """A graph replay may hand the hooks a pass without rids: no refusal names the request, the status still does."""
    write_status(str(tmp_path), "dp0", {"counted_at": time.time(), "counts": {"extend_passes": 1, "unusable_passes": 0}})
    before = read_report(str(tmp_path))
    answered = time.time()
    write_status(
        str(tmp_path),
        "dp0",
        {
            "counted_at": answered + 0.1,
            "counts": {"extend_passes": 2, "unusable_passes": 1},
            "last_unusable": "the final-norm hook did not fire in this pass (prefill CUDA graph replay)",
        },
    )
    why = _why(tmp_path, before, answered_at=answered)
    assert "unusable" in why and "prefill CUDA graph replay" in why


def test_a_hook_error_is_named(tmp_path):
    _status(tmp_path, passes=1)
    before = read_report(str(tmp_path))
    answered = time.time()
    _status(tmp_path, passes=2, errors=1, counted_at=answered + 0.1)
    assert "ValueError: boom" in _why(tmp_path, before, answered_at=answered)


def test_reports_of_several_writers_are_summed_and_the_facts_read(tmp_path):
    _status(tmp_path, passes=2, writer="dp0", forward_batch_rids=True)
    _status(tmp_path, passes=3, writer="dp1", forward_batch_rids=True)
    report = read_report(str(tmp_path))
    assert report.writers == 2 and report.count("extend_passes") == 5 and report.facts["forward_batch_rids"] is True


def test_hostile_status_files_are_skipped(tmp_path):
    (tmp_path / status_name("dp0")).write_bytes(b"x" * (MAX_STATUS_BYTES + 10))
    (tmp_path / status_name("dp1")).write_text(json.dumps({"format": "something else", "version": 1}))
    (tmp_path / status_name("dp2")).write_text("{not json")
    os.symlink("/etc/passwd", tmp_path / status_name("dp3"))
    assert read_statuses(str(tmp_path)) == []
    with pytest.raises(ValueError):
        status_name("../dp0")
