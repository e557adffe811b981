"""The one vocabulary check of token ids (issue 47): wherever ids enter, an id outside [0, vocab_size) is one line.

Proved here: the check names the file, the sample, the field, the id and the bound (the
manifest's vocab_size, or the largest vocabulary a model may have when none is recorded);
every other path where ids enter (``/generate`` answers, pre-tokenized and rendered source rows,
the in-process capture) uses the same comparison and words; a re-hashed shard holding 10**12 or
-7 fails ``verify`` and is not exported; a specforge
file holding 10**12 is not imported; an edited regeneration record holding 10**12 is
refused when a build resumes from it, naming the file and the line.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from hs_dataset.errors import FormatError, HsDatasetError
from hs_dataset.formats.hashing import sha256_file
from hs_dataset.formats.metadata import DatasetMetadata
from hs_dataset.formats.regenerated import RegeneratedStore, read_regenerated
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.formats.vocabulary import MAX_VOCAB_SIZE, Outside, check_token_ids, outside_vocabulary, vocab_size_of
from tests.fixtures.damage import rewrite_shard
from tests.fixtures.samples import regenerated_record
from tests.fixtures.untrusted_dataset import build, split_header


@pytest.mark.parametrize("ids", [[1, 2, 1000], torch.tensor([1, 2, 1000]), torch.tensor([1, 2, 1000], dtype=torch.int32)])
def test_an_id_outside_the_vocabulary_is_one_line_naming_it_and_the_bound(ids):
    check_token_ids([0, 999], 1000, where="f", sample="s", fix="fix it")
    with pytest.raises(FormatError) as caught:
        check_token_ids(ids, 1000, where="data.bin", sample="s7", fix="fix it")
    assert str(caught.value) == "data.bin: sample 's7': input_ids[2] = 1000 is outside the vocabulary [0, 1000); fix it"


def test_without_a_recorded_vocabulary_ids_are_bounded_by_the_largest_a_model_may_have():
    check_token_ids([MAX_VOCAB_SIZE - 1], None, where="f", sample="s", fix="x")
    with pytest.raises(FormatError, match=r"input_ids\[0\] = -7 is outside the vocabulary \[0, 16777216\) \(no vocab_size known"):
        check_token_ids([-7], None, where="f", sample="s", fix="x")
    assert vocab_size_of(DatasetMetadata(vocab_size=32000)) == 32000
    assert vocab_size_of(DatasetMetadata.from_json({"tokenizer": {"vocab_size": 100}}, "m")) == 100
    assert vocab_size_of(DatasetMetadata()) is None


def test_every_path_where_ids_enter_uses_the_one_check_and_its_wording():
    """The /generate answer check, the pre-tokenized and rendered source checks and the in-process capture share the
    comparison, the bound and the words of verify, imports and regeneration records (formats/vocabulary.py)."""
    import numpy as np

    from hs_dataset.capture.sglang.generate import _bad_ids, parse_output
    from hs_dataset.regenerate.generator import GenerationParams
    from hs_dataset.sources.pretokenized import read_pretokenized
    from hs_dataset.sources.report import MalformedRowError

    assert outside_vocabulary([1, 1000, -1, 2], 1000) == Outside(2, 1, 1000)
    assert outside_vocabulary(np.array([5, 7], dtype=np.uint64), 6) == Outside(1, 1, 7)
    assert outside_vocabulary([], 6) is None and outside_vocabulary([0, 5], 6) is None
    assert _bad_ids([5, 999], 1000) is None
    assert _bad_ids([5, 1000], 1000) == "output_ids[1] = 1000 is outside the vocabulary [0, 1000)"
    assert _bad_ids([MAX_VOCAB_SIZE], None) == (
        f"output_ids[0] = {MAX_VOCAB_SIZE} is outside the vocabulary [0, {MAX_VOCAB_SIZE}) (no vocab_size known: the largest a model may have)"
    )
    assert _bad_ids([2**70], None) is not None  # never stored: it would not fit an int64 tensor either
    failed = parse_output({"output_ids": [3, 1000, 1001]}, GenerationParams(max_new_tokens=4), 1000)
    assert failed.finish == "failed"
    assert (
        failed.error == "the server's answer is not token ids: output_ids[1] = 1000 is outside the vocabulary [0, 1000) (2 ids outside it)"
    )
    with pytest.raises(MalformedRowError) as caught:
        read_pretokenized({"input_ids": [1, 10, 11]}, vocab_size=10)
    assert str(caught.value) == "input_ids[1] = 10 is outside the vocabulary [0, 10) (2 ids outside it)"


def test_rendered_rows_and_the_in_process_capture_use_the_one_check(tiny_model_dir, hf_backend):
    """Ids a tokenizer renders past the model's embedding, and a sample the HF capture is handed with such ids."""
    from transformers import AutoTokenizer

    from hs_dataset.sources.iterate import SampleRules, load_samples

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)
    rows = [{"id": "a", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "fine"}]}]
    samples, report = load_samples(rows, tok, SampleRules(max_length=64, vocab_size=5))
    assert samples == [] and len(report.issues) == 1
    reason = report.issues[0].reason
    assert reason.startswith("input_ids[0] = ") and "is outside the vocabulary [0, 5) (" in reason
    assert reason.endswith("of the model: the tokenizer has more tokens than the model embeds; use the model's own tokenizer")
    from hs_dataset.capture.base import CaptureFailure
    from hs_dataset.sample import TokenizedSample

    vocab = hf_backend.info().vocab_size
    far = TokenizedSample("far", torch.tensor([1, vocab, -3]), torch.tensor([True, True, True]))
    [result] = hf_backend.capture_batch([far])
    assert result == CaptureFailure("far", f"input_ids[1] = {vocab} is outside the vocabulary [0, {vocab}) (2 ids outside it) of the model")


def _set_first_id(value: int):
    """A shard mutation: the first token id of the shard becomes ``value`` (int64, little-endian)."""

    def mutate(data: bytes) -> bytes:
        header, body = split_header(data)
        start = header["input_ids"]["data_offsets"][0]
        assert header["input_ids"]["dtype"] == "I64"
        head = len(data) - len(body)
        return data[: head + start] + struct.pack("<q", value) + data[head + start + 8 :]

    return mutate


@pytest.mark.parametrize("value", [10**12, -7])
def test_a_rehashed_shard_with_an_out_of_vocabulary_id_fails_verify_and_is_not_exported(tmp_path, value):
    from hs_dataset.interop import export_speculators

    root = build(tmp_path / "ds")
    rewrite_shard(root, 0, _set_first_id(value))
    problems = verify_dataset(root).problems
    shard = json.loads((root / "manifest.json").read_text())["shards"][0]["file"]
    assert problems == [
        f"{root / shard}: sample 's0': input_ids[0] = {value} is outside the vocabulary [0, 16777216) "
        "(no vocab_size known: the largest a model may have); the shard was altered after capture: restore it from the build or rebuild it"
    ]
    with pytest.raises(FormatError, match=rf"sample 's0': input_ids\[0\] = {value} is outside"):
        export_speculators(root, tmp_path / "exp")


def test_import_specforge_refuses_a_file_with_an_out_of_vocabulary_id(tmp_path):
    from hs_dataset.interop import ImportSettings, export_specforge, import_specforge

    exported = tmp_path / "sf"
    export_specforge(build(tmp_path / "src"), exported)
    victim = next(exported.rglob("data_1.ckpt"))
    data = torch.load(victim, weights_only=True)
    data["input_ids"][0] = 10**12
    torch.save(data, victim)
    with pytest.raises(HsDatasetError) as caught:
        import_specforge(exported, tmp_path / "in", ImportSettings(config="unit-test"))
    message = str(caught.value)
    assert "\n" not in message and "data_1.ckpt" in message
    assert "input_ids[0] = 1000000000000 is outside the vocabulary [0, 16777216)" in message


def test_an_edited_regeneration_record_is_refused_on_resume_naming_the_file_and_line(tmp_path):
    good = regenerated_record()
    bad = {**good, "sample_id": "b", "input_ids": [1, 2, 10**12, 6]}
    path = Path(tmp_path) / "regenerated.jsonl"
    path.write_text(json.dumps({"records": [good]}) + "\n" + json.dumps({"records": [bad]}) + "\n")
    with pytest.raises(FormatError) as caught:
        RegeneratedStore(tmp_path)
    assert str(caught.value).startswith(
        f"{path}: line 2 records[0]: sample 'b': input_ids[2] = 1000000000000 is outside the vocabulary [0, 16777216)"
    )
    turned = {**good, "sample_id": "c", "turns": [{**good["turns"][0], "token_ids": [-7, 6]}]}
    path.write_text(json.dumps({"records": [turned]}) + "\n")
    with pytest.raises(FormatError, match=r"line 1 records\[0\]: sample 'c': turns\[0\]\.token_ids\[0\] = -7 is outside"):
        RegeneratedStore(tmp_path)


def test_a_store_or_a_finished_file_read_with_the_models_vocabulary_refuses_an_id_just_above_it(tmp_path):
    """A resuming build opens the store, and verify reads a finished file, with the vocabulary the manifest records: an id
    of vocab_size + 1 is refused, not only 10**12."""
    record = regenerated_record(input_ids=[1, 2, 5, 1001])
    path = Path(tmp_path) / "regenerated.jsonl"
    path.write_text(json.dumps({"records": [record]}) + "\n")
    assert "a" in RegeneratedStore(tmp_path)  # no model known: only the ceiling applies
    with pytest.raises(FormatError) as caught:
        RegeneratedStore(tmp_path, vocab_size=1000)
    assert str(caught.value).startswith(f"{path}: line 1 records[0]: sample 'a': input_ids[3] = 1001 is outside the vocabulary [0, 1000);")
    digest = sha256_file(path)
    assert "a" in read_regenerated(path, what="m", sha256=digest)  # a tool without the model: the ceiling only
    with pytest.raises(FormatError, match=r"sample 'a': input_ids\[3\] = 1001 is outside the vocabulary \[0, 1000\);"):
        read_regenerated(path, what="m", sha256=digest, vocab_size=1000)  # verify: the manifest's vocabulary
