"""``hs-dataset build`` refuses options that cannot apply in one line naming the option, before any capture."""

from __future__ import annotations

import pytest

from hs_dataset.cli.main import main


def _error_line(capsys, argv: list[str]) -> str:
    try:
        status = main(argv)
    except SystemExit as exc:  # the parser's own usage errors exit through argparse
        status = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    return err[0]


def test_a_server_with_an_in_process_card_is_refused(capsys, tmp_path):
    line = _error_line(capsys, ["build", "--config", "tiny-deepseek-hf", "--out", str(tmp_path / "ds"), "--server", "http://h:1"])
    assert line.startswith("hs-dataset build: error: --server: config 'tiny-deepseek-hf'") and "backend.name: sglang" in line
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--num-samples", "-3"),
        ("--num-samples", "0"),
        ("--batch-size", "0"),
        ("--shard-bytes", "-1"),
        ("--world-size", "0"),
        ("--rank", "-1"),
        ("--max-length", "0"),
        ("--max-new-tokens", "-5"),
    ],
)
def test_negative_and_zero_numbers_are_refused_naming_the_option(capsys, tmp_path, flag, value):
    line = _error_line(capsys, ["build", "--config", "tiny-deepseek-hf", "--out", str(tmp_path / "ds"), flag, value])
    assert line.startswith(f"hs-dataset build: error: argument {flag}: must be ") and f"got {value}" in line
    assert "build_dataset()" not in line and not (tmp_path / "ds").exists()


def test_a_word_for_a_number_is_refused_naming_the_option(capsys, tmp_path):
    line = _error_line(capsys, ["build", "--config", "tiny-deepseek-hf", "--out", str(tmp_path / "ds"), "--num-samples", "ten"])
    assert "argument --num-samples: 'ten' is not a whole number" in line


@pytest.mark.parametrize(
    ("argv", "flag", "value"),
    [
        (["import", "specforge", "SRC", "OUT", "--shard-bytes"], "--shard-bytes", "0"),
        (["import", "specforge", "SRC", "OUT", "--max-length"], "--max-length", "-2"),
        (["import", "specforge", "SRC", "OUT", "--aux-layer-ids"], "--aux-layer-ids", "-1"),
        (["export", "speculators", "SRC", "OUT", "--aux-layer-ids"], "--aux-layer-ids", "-4"),
        (["push", "SRC", "org/name", "--stats-samples"], "--stats-samples", "0"),
        (["serve", "--config", "tiny-deepseek-sglang", "--port"], "--port", "0"),
        (["serve", "--config", "tiny-deepseek-sglang", "--port"], "--port", "70000"),
    ],
)
def test_every_commands_numbers_are_checked_by_the_parser(capsys, argv, flag, value):
    line = _error_line(capsys, [*argv, value])
    assert f"error: argument {flag}: must be " in line and f"got {value}" in line
