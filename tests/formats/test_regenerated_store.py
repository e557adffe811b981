"""The regenerated-conversations store: records read back by id from their line, a torn last line cut, nothing else cut."""

from __future__ import annotations

import pytest

from hs_dataset.errors import FormatError
from hs_dataset.formats import regenerated
from hs_dataset.formats.regenerated import RegeneratedStore


def record(sid: str, n: int = 3) -> dict:
    return {
        "sample_id": sid,
        "row_index": 0,
        "turns": [{"prompt_tokens": 1, "token_ids": [5] * n, "finish": "length", "empty": False, "error": ""}],
        "messages": [],
        "tools": None,
        "input_ids": [1] + [5] * n,
        "loss_spans": [[1, 1 + n]],
        "supervised_turns": [True],
        "dropped": None,
    }


def test_records_are_read_back_by_id_after_reopening(tmp_path):
    store = RegeneratedStore(tmp_path)
    store.append_chunk([record("a"), record("b", 5)])
    store.append_chunk([record("c")])
    again = RegeneratedStore(tmp_path)
    assert len(again) == 3 and "b" in again and "z" not in again
    assert again.get("b") == record("b", 5) and again.get("c") == record("c") and again.get("z") is None
    assert again.records == {"a": record("a"), "b": record("b", 5), "c": record("c")}
    again.append_chunk([record("d")])  # appends after the lines it found
    assert RegeneratedStore(tmp_path).get("d") == record("d") and again.get("a") == record("a")


def test_a_torn_last_line_is_cut_and_its_records_are_not_stored(tmp_path):
    RegeneratedStore(tmp_path).append_chunk([record("a")])
    whole = (tmp_path / "regenerated.jsonl").read_bytes()
    with open(tmp_path / "regenerated.jsonl", "ab") as f:
        f.write(b'{"records":[{"sample_id":"b","tu')
    store = RegeneratedStore(tmp_path)
    assert "b" not in store and store.get("a") == record("a")
    assert (tmp_path / "regenerated.jsonl").read_bytes() == whole


def test_an_overlong_line_before_others_is_damage_not_a_torn_tail(tmp_path, monkeypatch):
    store = RegeneratedStore(tmp_path)
    store.append_chunk([record("big", 400)])
    store.append_chunk([record("after")])
    size = (tmp_path / "regenerated.jsonl").stat().st_size
    monkeypatch.setattr(regenerated, "MAX_CHUNK_BYTES", 1000)
    with pytest.raises(FormatError, match="line 1 is longer than 1000 bytes"):
        RegeneratedStore(tmp_path)
    assert (tmp_path / "regenerated.jsonl").stat().st_size == size, "stored records were cut"
