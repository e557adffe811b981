"""The chart script's parsers on the real results files, checked against lines of those files, and the drawing itself.

A results file whose format changes must fail here rather than leave a chart in docs/BENCHMARKS.md silently
short of a run: each test names the line it expects to have been read.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.fixtures.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from charts import (
    RESULTS,
    draw_all,
    parse_encodings,
    parse_one_pass,
    parse_regenerate,
    parse_release_checks,
    version_matrix,
)


def _has_line(name: str, text: str) -> bool:
    """Whether the results file still holds this line, so each expected value is tied to the text it came from."""
    return any(text in line for line in (RESULTS / name).read_text().splitlines())


def test_encodings_are_read_from_their_bytes_and_tau_lines() -> None:
    assert _has_line("bench_acceptance_encodings.txt", "nf4          state bytes per token 288 = 0.281 of bf16's 1024 (encoding nf4_g32)")
    assert _has_line("bench_acceptance_encodings.txt", "mxfp4        tau / bf16's tau per seed 0.982 0.977 (min 0.977)")
    run = parse_encodings(RESULTS / "bench_acceptance_encodings.txt")
    by_name = {enc.name: enc for enc in run.encodings}
    assert run.date == "2026-12-01" and list(by_name) == ["bf16", "fp8", "mxfp4", "nf4"]
    assert (by_name["nf4"].bytes_per_token, by_name["nf4"].bytes_ratio, by_name["nf4"].codec) == (288, 0.281, "nf4_g32")
    assert by_name["mxfp4"].tau_ratios == (0.982, 0.977) and by_name["fp8"].tau_ratios == (1.012, 1.0)
    assert by_name["bf16"].tau_ratios == (1.0, 1.0)  # the baseline, one per seed of its 'tau mean' line
    assert by_name["mxfp4"].error_medians == (0.1138, 0.1132, 0.1125, 0.1112)


def test_release_checks_read_every_table_with_its_date_and_release() -> None:
    assert _has_line("check_server_gpu.txt", "aux hidden_states[2]          0.0877     0.317      0.0878     0.328      1.46     0.666")
    nf4, bf16 = parse_release_checks(RESULTS / "check_server_gpu.txt")
    assert (nf4.release, nf4.device, nf4.date) == ("0.5.14", "H200", "2026-12-01") and "nf4_g32" in nf4.what
    assert nf4.medians[0] == 0.0877 and nf4.maxima[0] == 0.317 and nf4.transformers_bf16_medians[0] == 0.0878
    assert nf4.neighbour_medians[0] == 0.666  # the nearer of previous (1.46) and next (0.666) layer
    assert bf16.maxima == (0.306, 0.293, 0.269, 0.246) and "bf16" in bf16.what
    first, rerun = parse_release_checks(RESULTS / "check_server_gpu_0.5.16.txt")
    assert (first.date, rerun.date, rerun.release) == ("2026-12-01", "2026-12-02", "0.5.16")
    (kimi,) = parse_release_checks(RESULTS / "check_server_gpu_kimi_0.5.17.txt")
    assert (kimi.release, kimi.date, kimi.medians[-1]) == ("0.5.17", "2026-12-02 04:42", 0.0114) and "Kimi" in kimi.what


def test_one_pass_files_read_the_generated_rows_only() -> None:
    assert _has_line(
        "one_pass_probe_cpu_0.5.19.txt", "   decode-eager       aux4 vs same             : median 4.45e-07  max 8.02e-07  (250 rows)"
    )
    probe = parse_one_pass(RESULTS / "one_pass_probe_cpu_0.5.19.txt")
    assert (probe.release, probe.device, probe.date) == ("0.5.19", "CPU", "2026-12-06")
    assert probe.medians == (3.27e-07, 3.93e-07, 4.45e-07, 4.63e-07) and probe.maxima[2] == 8.02e-07
    assert _has_line("one_pass_check_gpu_0.5.16.txt", "generated  final vs same             : median 8.97e-03  max 1.85e-01  (737 rows)")
    check = parse_one_pass(RESULTS / "one_pass_check_gpu_0.5.16.txt")
    assert (check.release, check.device, check.date) == ("0.5.16", "H100", "2026-12-06 19:28")
    assert check.medians[-1] == 8.97e-03 and check.reference == "prefill on the same server"
    gpu = parse_one_pass(RESULTS / "one_pass_probe_gpu_0.5.17.txt")
    assert gpu.maxima[0] == 3.08e-01  # decode-replay's 0.308 over decode-eager's 0.253
    assert gpu.release == "0.5.17" and gpu.device == "H100"


def test_version_matrix_holds_every_checked_file() -> None:
    sources = {check.source for check in version_matrix(RESULTS)}
    on_disk = {p.name for p in RESULTS.glob("check_server_gpu*.txt")} | {p.name for p in RESULTS.glob("one_pass_*.txt")}
    assert sources == on_disk


def test_regenerate_runs_are_read_with_date_device_and_summary() -> None:
    assert _has_line(
        "bench_regenerate_cpu.txt",
        "best of 3: generation tok/s new 190.0, old 112.2, client 137.3; wall s new 19.1, old 30.8, client 23.8 + prefill 1.4",
    )
    cpu = parse_regenerate(RESULTS / "bench_regenerate_cpu.txt")
    assert len(cpu) == 10 and {run.device for run in cpu} == {"CPU"}
    assert [(run.date, run.summary) for run in cpu[-2:]] == [("2026-12-07 05:46", None), ("2026-12-07 06:48", None)]  # turn-order client
    last = cpu[-3]
    assert last.date == "2026-12-02 01:31" and last.summary is not None
    assert (last.summary.new_tok_s, last.summary.old_tok_s, last.summary.client_tok_s) == (190.0, 112.2, 137.3)
    assert (last.summary.new_wall_s, last.summary.client_wall_s, last.summary.prefill_wall_s) == (19.1, 23.8, 1.4)
    assert (last.summary.end_to_end, last.summary.generation_ratio, last.summary.generation_median) == (0.76, 1.38, 0.98)
    assert cpu[0].summary is not None and cpu[0].summary.generation_median is None  # 22:36 recorded no per-round figures

    assert _has_line("bench_regenerate_gpu.txt", "(b) end to end, build / (client generation + prefill): 1.09x")
    gpu = parse_regenerate(RESULTS / "bench_regenerate_gpu.txt")
    assert [(run.date, run.device) for run in gpu] == [
        ("2026-12-02 01:11", "H200"),
        ("2026-12-02 01:20", "H200"),  # 'the same, one round with --isolate': the machine of the run before
        ("2026-12-02 03:58", "H200"),
        ("2026-12-06 21:02", "H100"),
        ("2026-12-07 04:51", "H100"),
        ("2026-12-07 12:33", "H100"),
        ("2026-12-07 12:40", "H100"),  # 'the same warm H100': the machine of the run before
        ("2026-12-07 16:21", "H100"),
        ("2026-12-07 23:36", "H100"),
        ("2026-12-08 00:16", "H100"),  # e0ad9c2 (the device slot store), reverted on main after this run
    ]
    assert gpu[2].summary is not None and (gpu[2].summary.end_to_end, gpu[2].summary.old_tok_s) == (1.09, None)
    assert gpu[3].summary is None  # ran out of its device call in round 3: no summary lines
    assert gpu[4].summary is None  # against the turn-order client: no (a)/(b) lines for this chart


def test_runs_against_the_turn_order_client_are_read_from_their_last_line() -> None:
    assert _has_line("bench_regenerate_gpu.txt", "wall_ratio=1.089 extra_prefill_pct=0.34 build_tok_s=5689.7 turn_order_tok_s=6025.6")
    assert _has_line("bench_regenerate_gpu.txt", "wall_ratio=1.145 extra_prefill_pct=0.34 build_tok_s=5797.9 turn_order_tok_s=6431.8")
    assert _has_line("bench_regenerate_cpu.txt", "wall_ratio=0.935 extra_prefill_pct=4.75 build_tok_s=94.7 turn_order_tok_s=86.0")
    gpu = parse_regenerate(RESULTS / "bench_regenerate_gpu.txt")
    read = [(run.date, run.turn_order.wall_ratio) for run in gpu if run.turn_order]
    assert read == [
        ("2026-12-07 04:51", 1.31),
        ("2026-12-07 12:33", 1.156),
        ("2026-12-07 12:40", 1.157),
        ("2026-12-07 16:21", 1.089),
        ("2026-12-07 23:36", 1.145),
        ("2026-12-08 00:16", 1.208),
    ]
    last = gpu[-1].turn_order
    assert last is not None and (last.extra_prefill_pct, last.build_tok_s, last.turn_order_tok_s) == (0.34, 5403.5, 6325.9)
    assert gpu[3].turn_order is None  # 2026-12-06 21:02 ran out of its device call before its last line
    cpu = parse_regenerate(RESULTS / "bench_regenerate_cpu.txt")
    assert [run.date for run in cpu if run.turn_order] == ["2026-12-07 05:46", "2026-12-07 06:48"]


def test_drawing_writes_small_non_empty_pngs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    paths = draw_all(RESULTS, tmp_path)
    assert [p.name for p in paths] == ["encodings_tau.png", "version_matrix.png", "regenerate_vs_client.png", "one_pass_vs_turn_order.png"]
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG") and 5_000 < len(data) < 200_000
