"""What a build records to be resumed (its command) and what it says when stopped (N of M, the command)."""

from __future__ import annotations

import os
from pathlib import Path

from hs_dataset.config import load_card
from hs_dataset.config.run import BuildOptions, parse_options
from hs_dataset.formats import ShardWriter
from hs_dataset.pipeline.resume import build_command, interrupted_message, running_state
from tests.fixtures.samples import make_metadata, make_sample


def _options(**values) -> BuildOptions:
    return parse_options(BuildOptions, "test", values)


def test_the_cli_command_is_recorded_as_given():
    card = load_card("tiny-deepseek-hf")
    given = "hs-dataset build --config tiny-deepseek-hf --out 'out/with space' --num-samples 4"
    assert build_command(card, "out/with space", _options(command=given)) == given


def test_a_python_build_records_an_equivalent_command():
    card = load_card("tiny-deepseek-hf")
    opts = _options(source="rows.jsonl", num_samples=7, rank=1, world_size=2)
    command = build_command(card, "out/r1", opts)
    assert command.startswith("hs-dataset build --config ")
    assert command.endswith("--out out/r1 --source rows.jsonl --num-samples 7 --rank 1 --world-size 2")
    assert card.name in command or card.source_path in command


def test_the_running_state_records_the_total_and_where_it_ran():
    state = running_state(load_card("tiny-deepseek-hf"), "out/x", _options(command="hs-dataset build --out out/x"), 12)
    assert (state.state, state.samples_expected, state.command, state.cwd) == ("running", 12, "hs-dataset build --out out/x", os.getcwd())


def test_the_interrupt_message_reads_the_manifest(tmp_path: Path):
    root = tmp_path / "ds"
    assert interrupted_message(root) == "interrupted before the dataset recorded its build; re-run the same command to resume"
    with ShardWriter(root, make_metadata(), shard_bytes=1) as writer:
        writer.record_build(running_state(load_card("tiny-deepseek-hf"), root, _options(command="hs-dataset build --out ds"), 5))
        writer.add_many([make_sample(f"s{i}", 4) for i in range(2)])
    assert interrupted_message(root) == "interrupted: 2 of 5 samples stored; re-run the same command to resume: hs-dataset build --out ds"
