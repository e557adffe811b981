"""The one schema of a regenerated record: what to_json writes passes the read-back check and reads back equal."""

from __future__ import annotations

import pytest

from hs_dataset.errors import FormatError
from hs_dataset.formats.regenerated_record import ConversationRecord, TurnOutcome, check_record


def conversation(*turns: TurnOutcome) -> ConversationRecord:
    return ConversationRecord(
        sample_id="s1",
        row_index=3,
        turns=list(turns),
        messages=[{"role": "user", "content": "hi"}],
        tools=None,
        input_ids=[1, 2, 3, 4],
        loss_spans=[[2, 4]],
        supervised_turns=[True] * len(turns),
    )


def test_a_written_record_passes_the_check_and_reads_back_equal():
    record = conversation(TurnOutcome(2, [3, 4], "stop", False, ""), TurnOutcome.template_refused("the template refused"))
    stored = record.to_json()
    assert check_record(stored, "f.jsonl", "line 1 records[0]") == "s1"
    assert ConversationRecord.from_json(stored) == record
    assert list(stored["turns"][0]) == ["prompt_tokens", "token_ids", "finish", "empty", "error"]
    assert list(stored["turns"][1]) == ["finish", "empty", "token_ids", "error", "prompt_tokens"]  # a refused turn: finish first


def test_a_damaged_record_names_the_file_and_the_field():
    stored = conversation(TurnOutcome(2, [3, 4], "stop", False, "")).to_json()
    stored["turns"][0]["finish"] = "done"
    with pytest.raises(FormatError, match=r"f.jsonl: line 1 records\[0\].turns\[0\].finish is 'done'"):
        check_record(stored, "f.jsonl", "line 1 records[0]")
