"""The seeds' job projection: exact bytes from the codecs, the measured ratio read from the results, hours that add up."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.fixtures.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from project_seeds_job import Job, card_states, hours, measured_one_pass_ratio, token_bytes


def test_a_kimi_token_stores_four_bf16_rows_and_the_seeds_bf16_total_is_their_924_gib() -> None:
    assert card_states() == 4  # aux [2, 30, 58] and the pre-norm final
    assert token_bytes("bf16", 4) == 4 * 7168 * 2 + 9
    assert round(Job().tokens * token_bytes("bf16", 4) / 2**30) == 924  # the reported run: 17.3M tokens, 924 GB
    assert token_bytes("nf4_g32", 4) < token_bytes("fp8_e4m3_per_token", 4) < token_bytes("bf16", 4)


def test_the_ratio_is_the_last_one_in_the_results_with_the_date_before_it(tmp_path: Path) -> None:
    results = tmp_path / "gpu.txt"
    results.write_text("# 2026-12-06 21:02 UTC, a run\nwall_ratio=1.500 x=1\n\n# 2026-12-07 12:40 UTC, the next\nwall_ratio=1.157 x=2\n")
    assert measured_one_pass_ratio(results) == (1.157, "2026-12-07 12:40")
    results.write_text("nothing measured\n")
    with pytest.raises(SystemExit, match="no 'wall_ratio=' line"):
        measured_one_pass_ratio(results)


def test_hours_add_generation_the_ratio_and_a_second_prefill() -> None:
    job = Job(samples=100, tokens=200_000, answer_tokens_per_sample=1_500)  # 150k answer, 50k prompt tokens
    h = hours(job, decode_tok_s=1_000, prefill_tok_s=10_000, one_pass_ratio=1.2)
    generation_s = 150_000 / 1_000 + 50_000 / 10_000
    assert h["generation alone"] == pytest.approx(generation_s / 3600)
    assert h["one pass"] == pytest.approx(1.2 * generation_s / 3600)
    assert h["prefill capture"] == pytest.approx((generation_s + 200_000 / 10_000) / 3600)
