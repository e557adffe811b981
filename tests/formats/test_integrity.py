"""Corruption that verify and the reader must catch, and bad input that must be refused clearly."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
import torch

from hs_dataset import open_dataset
from hs_dataset.cli.main import main as cli_main
from hs_dataset.errors import (
    DiskFullError,
    DuplicateSampleError,
    ForeignDatasetError,
    FormatError,
    IntegrityError,
    NonFiniteStateError,
    SampleError,
    UnsupportedFormatError,
)
from hs_dataset.formats import FORMAT_VERSION, ShardWriter
from hs_dataset.formats.hashing import file_digests, sha256_file
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.sample import CapturedSample
from tests.fixtures.samples import make_metadata, make_sample


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "ds"
    with ShardWriter(root, make_metadata(), shard_bytes=4_000) as writer:
        writer.add_many(make_sample(f"s{i:03d}", 10 + i) for i in range(12))
    return root


def _shards(root):
    return json.loads((root / "manifest.json").read_text())["shards"]


def test_clean_dataset_verifies_via_cli(dataset, capsys):
    assert cli_main(["verify", str(dataset)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"verified 12 samples, {sum(10 + i for i in range(12))} tokens, {len(_shards(dataset))} shards"


def test_flipped_byte_is_caught(dataset, capsys):
    shard = dataset / _shards(dataset)[1]["file"]
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x01
    shard.write_bytes(bytes(data))
    assert cli_main(["verify", str(dataset)]) == 1
    err = capsys.readouterr().err
    assert shard.name in err and "blake3" in err and "corrupted shard" in err
    with pytest.raises(IntegrityError, match="blake3 .* != manifest"):
        ds = open_dataset(dataset, verify_hashes=True)
        for _ in ds:
            pass


def test_truncated_shard_is_caught_by_verify_and_reader(dataset):
    shard = dataset / _shards(dataset)[0]["file"]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 17)
    result = verify_dataset(dataset)
    assert not result.ok and shard.name in result.problems[0]
    with pytest.raises(IntegrityError, match="truncated"):
        open_dataset(dataset)[0]


def test_missing_shard_is_caught(dataset):
    shard = dataset / _shards(dataset)[-1]["file"]
    shard.unlink()
    result = verify_dataset(dataset)
    assert not result.ok and "missing" in result.problems[0] and shard.name in result.problems[0]


def test_edited_manifest_is_caught(dataset):
    manifest = json.loads((dataset / "manifest.json").read_text())
    manifest["shards"][0]["tokens"] += 1
    (dataset / "manifest.json").write_text(json.dumps(manifest))
    result = verify_dataset(dataset)
    assert not result.ok and manifest["shards"][0]["file"] in result.problems[0]


def test_nan_written_behind_the_writers_back_is_caught(dataset):
    """verify scans values too: a NaN patched into a shard (with a matching hash) names its sample."""
    from hs_dataset.formats.manifest import Manifest
    from hs_dataset.formats.reader import ShardReader

    manifest = Manifest.load(dataset)
    record = manifest.shards[0]
    path = dataset / record.file
    reader = ShardReader(path, manifest=manifest)
    spec = reader.specs["final_hidden_state"]
    begin, _ = reader.token_range(1)
    pos = reader._data_start + spec.begin + begin * 16 * 2
    del reader
    data = bytearray(path.read_bytes())
    data[pos : pos + 2] = torch.tensor([float("nan")], dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()
    path.write_bytes(bytes(data))
    raw = json.loads((dataset / "manifest.json").read_text())
    raw["shards"][0]["blake3"] = _blake3(path)
    (dataset / "manifest.json").write_text(json.dumps(raw))
    result = verify_dataset(dataset)
    assert not result.ok and "NaN" in result.problems[0] and reader_sample_id(dataset, 0, 1) in result.problems[0]


def reader_sample_id(root, shard, index):
    return open_dataset(root).shard(shard).sample_ids[index]


def _blake3(path):
    with open(path, "rb") as f:
        return file_digests(f, ("blake3",))["blake3"]


def _as_format_1(root):
    """Rewrite a dataset's manifest as hs_dataset 0.1 wrote it: format_version 1, one sha256 per shard, no blake3."""
    raw = json.loads((root / "manifest.json").read_text())
    raw["format_version"] = 1
    for record in raw["shards"]:
        del record["blake3"]
        record["sha256"] = sha256_file(root / record["file"])
    (root / "manifest.json").write_text(json.dumps(raw, indent=1))
    return raw


def test_new_shards_are_recorded_with_blake3_in_format_2(dataset):
    raw = json.loads((dataset / "manifest.json").read_text())
    assert raw["format_version"] == FORMAT_VERSION == 2
    for record in raw["shards"]:
        assert "sha256" not in record and record["blake3"] == _blake3(dataset / record["file"])


def test_format_1_dataset_reads_and_verifies(dataset, capsys):
    _as_format_1(dataset)
    assert verify_dataset(dataset).ok
    assert len(list(open_dataset(dataset, verify_hashes=True))) == 12
    assert cli_main(["verify", str(dataset)]) == 0
    shard = dataset / _shards(dataset)[1]["file"]
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x01
    shard.write_bytes(bytes(data))
    problems = verify_dataset(dataset).problems
    assert len(problems) == 1 and shard.name in problems[0] and "sha256" in problems[0]
    with pytest.raises(IntegrityError, match="sha256 .* != manifest"):
        list(open_dataset(dataset, verify_hashes=True))


def test_format_1_dataset_resumes_into_format_2_keeping_its_sha256(dataset):
    old = _as_format_1(dataset)["shards"]
    with ShardWriter(dataset, make_metadata(), shard_bytes=4_000) as writer:
        writer.add_many(make_sample(f"s{i:03d}", 10 + i) for i in range(20))
    raw = json.loads((dataset / "manifest.json").read_text())
    assert raw["format_version"] == 2 and raw["shards"][: len(old)] == old  # old records untouched
    assert all("blake3" in r and "sha256" not in r for r in raw["shards"][len(old) :])
    result = verify_dataset(dataset)
    assert result.ok and result.samples == 20
    assert [r.hash_algorithm for r in open_dataset(dataset).manifest.shards] == ["sha256"] * len(old) + ["blake3"] * (
        len(raw["shards"]) - len(old)
    )


def test_merge_carries_both_hash_kinds(dataset, tmp_path):
    from hs_dataset.formats.merge import merge_datasets

    other = tmp_path / "other"
    with ShardWriter(other, make_metadata(), shard_bytes=4_000) as writer:
        writer.add_many(make_sample(f"t{i:03d}", 5 + i) for i in range(6))
    _as_format_1(dataset)
    merged = merge_datasets([dataset, other], tmp_path / "merged")
    assert merged.format_version == 2
    assert {r.hash_algorithm for r in merged.shards} == {"sha256", "blake3"}
    assert verify_dataset(tmp_path / "merged").ok


def test_hashing_works_in_a_forked_child(dataset):
    """DataLoader and datasets workers fork after the parent wrote and hashed shards: their hash checks must not hang."""
    import multiprocessing

    assert verify_dataset(dataset).ok  # the parent hashes first
    child = multiprocessing.get_context("fork").Process(target=_verify_or_fail, args=(dataset,))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        pytest.fail("hashing deadlocked in a forked child")
    assert child.exitcode == 0


def _verify_or_fail(root):
    os._exit(0 if verify_dataset(root).ok and len(list(open_dataset(root, verify_hashes=True))) == 12 else 1)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda raw: raw["shards"][0].pop("blake3"), r"shards\[0\] records no hash \(format 2 needs blake3 or sha256\)"),
        (lambda raw: raw["shards"][0].update(blake3="../../etc"), r"shards\[0\]\.blake3 .* is not a blake3 hex digest"),
        # format 1 knows only sha256: a blake3-only record there is a hash no format-1 reader would check
        (lambda raw: raw.update(format_version=1), r"shards\[0\] records no hash \(format 1 needs sha256\)"),
    ],
)
def test_manifest_hash_fields_are_checked(dataset, edit, match):
    raw = json.loads((dataset / "manifest.json").read_text())
    edit(raw)
    (dataset / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(FormatError, match=match):
        open_dataset(dataset)


def test_shard_from_another_dataset_is_caught(dataset, tmp_path):
    other = tmp_path / "other"
    with ShardWriter(other, make_metadata(), shard_bytes=4_000) as writer:
        writer.add_many(make_sample(f"s{i:03d}", 10 + i) for i in range(12))
    name = _shards(dataset)[0]["file"]
    shutil.copyfile(other / name, dataset / name)
    result = verify_dataset(dataset, check_hashes=False)
    assert not result.ok and "another dataset" in " ".join(result.problems)


def test_newer_format_version_is_refused(dataset):
    raw = json.loads((dataset / "manifest.json").read_text())
    raw["format_version"] = 99
    (dataset / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedFormatError, match="upgrade hs_dataset"):
        open_dataset(dataset)
    assert not verify_dataset(dataset).ok


def test_unknown_encoding_is_refused(dataset):
    raw = json.loads((dataset / "manifest.json").read_text())
    raw["tensors"]["aux_hidden_states"]["encoding"] = "int4_magic"
    (dataset / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedFormatError, match="int4_magic"):
        open_dataset(dataset)


def test_not_a_dataset(tmp_path):
    with pytest.raises(FormatError, match="not an hs_dataset"):
        open_dataset(tmp_path)


# ---------------------------------------------------------------- bad input at write time
@pytest.mark.parametrize(
    "mutate, match",
    [
        (
            lambda s: CapturedSample(s.sample_id, s.input_ids[:0], s.loss_mask[:0], s.aux_hidden_states[:0], s.final_hidden_state[:0]),
            "empty sample",
        ),
        (
            lambda s: CapturedSample(s.sample_id, s.input_ids, s.loss_mask, s.aux_hidden_states[:, :2], s.final_hidden_state),
            "aux_hidden_states shape",
        ),
        (
            lambda s: CapturedSample(s.sample_id, s.input_ids, s.loss_mask, s.aux_hidden_states, s.final_hidden_state[:-1]),
            "final_hidden_state shape",
        ),
        (lambda s: CapturedSample(s.sample_id, s.input_ids, s.loss_mask, s.aux_hidden_states.float(), s.final_hidden_state), "dtype"),
        (lambda s: CapturedSample(s.sample_id, s.input_ids.float(), s.loss_mask, s.aux_hidden_states, s.final_hidden_state), "int64"),
        (lambda s: CapturedSample(s.sample_id, s.input_ids, s.loss_mask[:-1], s.aux_hidden_states, s.final_hidden_state), "loss_mask"),
        (lambda s: CapturedSample("", s.input_ids, s.loss_mask, s.aux_hidden_states, s.final_hidden_state), "sample id"),
    ],
)
def test_bad_samples_are_refused_and_nothing_is_lost(tmp_path, mutate, match):
    with ShardWriter(tmp_path, make_metadata()) as writer:
        writer.add(make_sample("good-1", 5))
        with pytest.raises(SampleError, match=match):
            writer.add(mutate(make_sample("bad", 6)))
        writer.add(make_sample("good-2", 5))
    assert open_dataset(tmp_path).sample_ids == ["good-1", "good-2"]


def test_nonfinite_states_are_quarantined_with_a_report(tmp_path):
    bad = make_sample("nan-sample", 6)
    bad.final_hidden_state[3, 2] = float("inf")
    with ShardWriter(tmp_path, make_metadata()) as writer:
        writer.add(make_sample("ok", 4))
        assert writer.add(bad) is False
    report = writer.report
    assert report.quarantined == [{"sample_id": "nan-sample", "reason": "final_hidden_state has NaN/inf at 1 token(s), first at token 3"}]
    ds = open_dataset(tmp_path)
    assert ds.sample_ids == ["ok"] and ds.manifest.quarantine == report.quarantined
    # a resumed run does not retry it silently: it stays reported
    with ShardWriter(tmp_path, make_metadata()) as writer:
        assert writer.contains("nan-sample")


def test_nonfinite_states_can_be_refused(tmp_path):
    bad = make_sample("nan-sample", 6)
    bad.aux_hidden_states[0, 1, 0] = float("nan")
    with (
        ShardWriter(tmp_path, make_metadata(), nonfinite="refuse") as writer,
        pytest.raises(NonFiniteStateError, match="nan-sample.*aux_hidden_states.*token 0"),
    ):
        writer.add(bad)


def test_duplicate_id_in_one_run_is_refused(tmp_path):
    with ShardWriter(tmp_path, make_metadata()) as writer:
        writer.add(make_sample("a", 3))
        with pytest.raises(DuplicateSampleError, match="'a'"):
            writer.add(make_sample("a", 3))


def test_foreign_directories_are_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("not a dataset")
    with pytest.raises(ForeignDatasetError, match="not empty"):
        ShardWriter(tmp_path, make_metadata())
    other = tmp_path / "ds"
    with ShardWriter(other, make_metadata()) as writer:
        writer.add(make_sample("a", 3))
    with pytest.raises(ForeignDatasetError, match="different dataset"):
        ShardWriter(other, make_metadata(aux_layer_ids=[1, 2, 3]))


def test_second_writer_on_the_same_directory_is_refused(tmp_path):
    with ShardWriter(tmp_path, make_metadata()), pytest.raises(ForeignDatasetError, match="another process"):
        ShardWriter(tmp_path, make_metadata())


def test_disk_full_discards_partial_shard_and_keeps_manifest_valid(tmp_path, monkeypatch):
    import hs_dataset.formats.shard_file as shard_file

    with ShardWriter(tmp_path, make_metadata(), shard_bytes=2_000) as writer:
        writer.add_many(make_sample(f"pre-{i}", 8) for i in range(6))
    before = open_dataset(tmp_path).sample_ids
    real_write = shard_file.write_all
    calls = {"n": 0}

    def failing_write(fd, view):
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(fd, view)

    monkeypatch.setattr(shard_file, "write_all", failing_write)
    writer = ShardWriter(tmp_path, make_metadata(), shard_bytes=2_000)
    with pytest.raises(DiskFullError, match="resume"):
        for i in range(20):
            writer.add(make_sample(f"post-{i}", 8))
        writer.close()
    writer.abort()
    assert verify_dataset(tmp_path).ok
    assert open_dataset(tmp_path).sample_ids == before
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".hs-tmp-")]
    monkeypatch.setattr(shard_file, "write_all", real_write)
    with ShardWriter(tmp_path, make_metadata(), shard_bytes=2_000) as writer:
        for i in range(20):
            writer.add(make_sample(f"post-{i}", 8))
    assert len(open_dataset(tmp_path)) == 26 and verify_dataset(tmp_path).ok


def _scans(monkeypatch, chunk):
    """Both implementations of the test, run on the host: the one used there, and the one used off it."""
    from hs_dataset.formats import encoding

    def in_pieces(state):
        monkeypatch.setattr(encoding, "_CHECK_CHUNK", chunk)
        return encoding._scan_finite_in_pieces(state, encoding._NONFINITE_BITS[state.dtype])

    return {"host": encoding._scan_finite, "in pieces": in_pieces}


@pytest.mark.parametrize("chunk", [1 << 18, 1000])  # the off-host test in one piece, and in many
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])
def test_fast_finite_check_agrees_with_isfinite(dtype, chunk, monkeypatch):
    """The exponent-bits test used by the writer and verify must match torch.isfinite exactly."""
    from hs_dataset.formats.encoding import all_finite

    g = torch.Generator().manual_seed(0)
    scale = 1e3 if dtype != torch.float8_e4m3fn else 1e2
    base = (torch.randn(600, 7, generator=g) * scale).to(dtype)
    big = torch.finfo(dtype).max
    extremes = base.clone()
    extremes[0, 0], extremes[1, 1], extremes[2, 2] = big, -big, -0.0
    strided = extremes.t()  # not contiguous: read through its strides, never copied
    for name, scan in {"all_finite": all_finite, **_scans(monkeypatch, chunk)}.items():
        assert scan(base) and scan(extremes) and scan(strided) and scan(base[:0]), name
        for bad in (float("nan"), float("inf"), float("-inf"), -float("nan")):
            for where in ((0, 0), (599, 6), (300, 3)):  # first, last, and inside a later piece of the off-host scan
                x = base.clone()
                x[where] = bad
                if torch.isfinite(x.float()).all():  # e4m3fn has no inf: torch stores a finite value for it
                    assert dtype == torch.float8_e4m3fn and abs(bad) == float("inf") and scan(x), (name, bad)
                    continue
                assert scan(x) is False, (name, bad, where)
                assert scan(x.t()) is False, (name, bad, where)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])
def test_every_bit_pattern_is_judged_as_isfinite_judges_it(dtype, monkeypatch):
    """Exhaustive for the 8- and 16-bit dtypes (every bit pattern), and float32's boundary patterns."""
    width = torch.empty((), dtype=dtype).element_size() * 8
    if width <= 16:
        patterns = torch.arange(-(1 << (width - 1)), 1 << (width - 1), dtype=torch.int32)
    else:
        edges = [0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FFFFFFF, 0x00000000, 0x00000001]
        patterns = torch.tensor([e for v in edges for e in (v, v - (1 << 31))], dtype=torch.int64)
    signed = {8: torch.int8, 16: torch.int16, 32: torch.int32}[width]
    values = patterns.to(signed).view(dtype)
    finite = torch.isfinite(values.float())
    good = values[finite]
    for name, scan in _scans(monkeypatch, 1 << 18).items():
        assert scan(good), name  # every finite pattern at once
        for i in (~finite).nonzero().flatten():  # every non-finite pattern, alone among finite ones
            one_bad = torch.cat([good[:100], values[i : i + 1], good[100:200]])
            assert not scan(one_bad), (name, hex(int(patterns[i])))


def test_a_finite_answer_is_remembered_only_while_the_tensor_is_unchanged(tmp_path):
    """A check made on the client's loader thread spares the writer a second scan, never a NaN written since."""
    from hs_dataset.formats import encoding
    from hs_dataset.formats.encoding import all_finite

    scans = []
    real_scan = encoding._scan_finite

    def counted(state):
        scans.append(state.shape)
        return real_scan(state)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(encoding, "_scan_finite", counted)
        x = torch.randn(64, 3, 32).to(torch.bfloat16)
        assert all_finite(x) and all_finite(x) and len(scans) == 1  # the second answer was remembered
        x[5, 1, 7] = float("nan")  # an in-place write moves the version counter
        assert not all_finite(x) and len(scans) == 2
        x[5, 1, 7] = 0.0
        view = x[:10]  # another tensor object over the same memory: checked on its own
        assert all_finite(view) and len(scans) == 3  # another object: scanned on its own
        x.view(torch.int16)[0, 0, 0] = 0x7FC0  # NaN bits through an integer view: shares the version counter
        assert not all_finite(view) and not all_finite(x)
        bad = torch.randn(64, 3, 32).to(torch.bfloat16)
        bad[0, 0, 0] = float("inf")
        assert not all_finite(bad) and not all_finite(bad)  # a False answer is never remembered: scanned each time
        with torch.inference_mode():
            made = torch.zeros(4, 8)
        before = len(scans)
        assert all_finite(made) and all_finite(made) and len(scans) == before + 2  # no version counter: scanned each time
        del x, view, bad
        import gc

        gc.collect()
        assert not [k for k, (ref, _) in encoding._FOUND_FINITE.items() if ref() is None]  # entries go with their tensors
    # the writer still quarantines what the client found non-finite, and what turned non-finite after its check
    found_bad = make_sample("found-bad", 8, k=2, h=64)
    found_bad.aux_hidden_states[3, 1, 5] = float("nan")
    assert not all_finite(found_bad.aux_hidden_states)
    turned_bad = make_sample("turned-bad", 8, k=2, h=64)
    assert all_finite(turned_bad.final_hidden_state)
    turned_bad.final_hidden_state[2, 9] = float("-inf")
    writer = ShardWriter(tmp_path / "ds", make_metadata(k=2, h=64))
    assert writer.add(found_bad) is False and writer.add(turned_bad) is False
    writer.close()
    assert [q["sample_id"] for q in writer.report.quarantined] == ["found-bad", "turned-bad"]


class _StalledManifest:
    """The publisher's manifest writes wait at a gate until the test opens it (as an fsync can wait on a journal commit)."""

    def __init__(self, monkeypatch) -> None:
        import threading

        import hs_dataset.formats.atomic as atomic_module

        self.gate, self.waiting, self.writes = threading.Event(), threading.Event(), []
        real_write = atomic_module.atomic_write_chunks

        def slow_write(final, chunks, **kw):
            if final.name == "manifest.json" and threading.current_thread().name.startswith("hs-shard-publisher"):
                self.writes.append(final)
                self.waiting.set()
                assert self.gate.wait(30)
            return real_write(final, chunks, **kw)

        monkeypatch.setattr(atomic_module, "atomic_write_chunks", slow_write)


def _stored_ids(root) -> list[str]:
    result = verify_dataset(root)
    assert result.ok, result.problems
    return sorted(s["sample_id"] for s in open_dataset(root))


def test_adding_never_waits_behind_a_slow_manifest_write(tmp_path, monkeypatch):
    """A manifest fsync can wait on the journal flushing every shard in flight; add() goes on meanwhile."""
    import threading

    stalled = _StalledManifest(monkeypatch)
    samples = [make_sample(f"s{i}", 40, k=2, h=64) for i in range(12)]
    writer = ShardWriter(tmp_path / "ds", make_metadata(k=2, h=64), shard_bytes=20_000, writer_threads=3)
    writer.add(samples[0])
    writer.add(samples[1])  # fills the first shard: a writer thread writes it, then the publisher stalls on the manifest
    assert stalled.waiting.wait(30)
    done = threading.Event()
    threading.Thread(target=lambda: ([writer.add(s) for s in samples[2:5]], done.set()), daemon=True).start()
    assert done.wait(10), "add() waited for the manifest write"
    stalled.gate.set()
    writer.close()
    assert _stored_ids(tmp_path / "ds") == sorted(s.sample_id for s in samples[:5])


def test_shards_are_written_while_the_manifest_write_waits_and_listed_together(tmp_path, monkeypatch):
    """One writer thread: its next shard goes to disk while the last listing's fsyncs wait; one manifest write lists the rest."""
    stalled = _StalledManifest(monkeypatch)
    samples = [make_sample(f"s{i}", 40, k=2, h=64) for i in range(8)]
    writer = ShardWriter(tmp_path / "ds", make_metadata(k=2, h=64), shard_bytes=20_000, writer_threads=1)
    writer.add(samples[0])
    writer.add(samples[1])  # the first shard: written, then its listing stalls
    assert stalled.waiting.wait(30)
    for s in samples[2:8]:  # three more shards through the one writer thread while the listing waits
        writer.add(s)
    writer.flush()
    writer._flusher.wait_written()
    on_disk = sorted(p.name for p in (tmp_path / "ds").glob("*.safetensors") if not p.name.startswith("."))
    assert len(on_disk) == 4, on_disk  # all written, though only the first listing has started
    assert not writer.contains("nope") and all(writer.contains(s.sample_id) for s in samples)  # pending: never taken twice
    stalled.gate.set()
    writer.close()
    assert len(stalled.writes) == 2  # the first shard's listing, then one for the three written meanwhile
    assert writer.report.shards_written == 4 and writer.report.written == 8
    assert _stored_ids(tmp_path / "ds") == sorted(s.sample_id for s in samples)


def test_an_older_manifest_state_never_overwrites_a_newer_one(tmp_path):
    """Writer threads encode the manifest under the lock and write it after: the latest state wins whatever the order."""
    import json

    writer = ShardWriter(tmp_path / "ds", make_metadata(k=2, h=64))
    older, newer = writer._session.numbered_state(), writer._session.numbered_state()
    newer = (newer[0], newer[1].replace(b'"created_by"', b'"created_by_newer"', 1))
    writer._session.save_manifest(*newer)
    writer._session.save_manifest(*older)
    assert "created_by_newer" in json.loads((tmp_path / "ds" / "manifest.json").read_text())
    writer.close()
