"""The manifest's ``build`` record: written running then finished by the writer, read back checked, and what it makes readers say."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hs_dataset.errors import FormatError
from hs_dataset.formats import ShardWriter
from hs_dataset.formats.build_state import (
    FINISHED,
    RUNNING,
    BuildState,
    merged_build,
    progress_phrase,
    resume_hint,
    unfinished_line,
)
from hs_dataset.formats.manifest import MANIFEST_NAME, Manifest
from hs_dataset.formats.merge import merge_datasets
from hs_dataset.formats.verify import verify_dataset
from tests.fixtures.paths import FIXTURES
from tests.fixtures.samples import make_metadata, make_sample

COMMAND = "hs-dataset build --config tiny-deepseek-hf --out out/x"


def _raw_build(root: Path) -> dict | None:
    return json.loads((root / MANIFEST_NAME).read_text()).get("build")


def _running(expected: int | None = 10) -> BuildState:
    return BuildState(RUNNING, expected, COMMAND, os.getcwd())


def _dataset(root: Path, n: int, build: BuildState | None, *, finish: bool = False, first: int = 0) -> Path:
    with ShardWriter(root, make_metadata(), shard_bytes=1, build=build) as writer:  # one sample per shard
        writer.add_many([make_sample(f"s{i}", 4 + i % 3) for i in range(first, first + n)])
        if finish:
            assert build is not None
            writer.finish_build(build)
    return root


def test_writer_records_running_then_finished_with_every_sample_listed(tmp_path):
    root = tmp_path / "ds"
    with ShardWriter(root, make_metadata(), shard_bytes=10**6) as writer:  # one shard, still buffered when finish_build is called
        writer.record_build(_running(3))
        assert _raw_build(root) == {"state": RUNNING, "samples_expected": 3, "command": COMMAND, "cwd": os.getcwd()}
        writer.add_many([make_sample(f"s{i}", 5) for i in range(3)])
        writer.finish_build(_running(3))
        manifest = Manifest.load(root)
        assert manifest.build == BuildState(FINISHED, 3, COMMAND, os.getcwd()) and not manifest.unfinished
        assert manifest.num_samples == 3  # finished is written only once the last shard is listed
    assert Manifest.load(root).build is not None and Manifest.load(root).build.finished


def test_the_first_manifest_already_records_the_build(tmp_path):
    root = tmp_path / "ds"
    with ShardWriter(root, make_metadata(), build=_running(5)):
        assert _raw_build(root) == _running(5).to_json()  # no kill finds the dataset without it


def test_a_build_left_running_is_unfinished_and_a_resume_records_its_own_run(tmp_path):
    root = _dataset(tmp_path / "ds", 2, _running(5))
    manifest = Manifest.load(root)
    assert manifest.unfinished and manifest.build == _running(5)
    with ShardWriter(root, make_metadata(), shard_bytes=1) as writer:  # a writer that does not record a build keeps the record
        writer.add_many([make_sample("s9", 4)])
    assert Manifest.load(root).build == _running(5)
    with ShardWriter(root, make_metadata(), build=_running(8)):  # a resumed build: its own expected total and command
        assert Manifest.load(root).build == _running(8)


def test_a_dataset_without_the_record_stays_without_it(tmp_path):
    root = _dataset(tmp_path / "ds", 2, None)
    assert _raw_build(root) is None
    manifest = Manifest.load(root)
    assert manifest.build is None and not manifest.unfinished
    before = (root / MANIFEST_NAME).read_bytes()
    manifest.save(root)
    assert (root / MANIFEST_NAME).read_bytes() == before  # no "build": null appears on a rewrite


@pytest.mark.parametrize("layout", ["native", "fp8"])
def test_old_layout_datasets_count_as_finished(tmp_path, layout):
    root = tmp_path / layout
    shutil.copytree(FIXTURES / "old_layout" / layout, root)
    manifest = Manifest.load(root)
    assert manifest.build is None and not manifest.unfinished
    result = verify_dataset(root)
    assert result.ok and result.finished and result.build is None


@pytest.mark.parametrize(
    "raw",
    [
        {"state": "done"},
        "running",
        {"state": RUNNING, "samples_expected": -1},
        {"state": RUNNING, "samples_expected": True},
        {"state": RUNNING, "command": ["hs-dataset"]},
        {"state": RUNNING, "command": "a\nb"},
        {"state": RUNNING, "cwd": 3},
    ],
)
def test_a_malformed_record_is_refused_in_one_line_naming_the_field(tmp_path, raw):
    root = _dataset(tmp_path / "ds", 1, None)
    data = json.loads((root / MANIFEST_NAME).read_text())
    (root / MANIFEST_NAME).write_text(json.dumps({**data, "build": raw}))
    with pytest.raises(FormatError, match=r"build\.\w+ must .*; restore the manifest") as err:
        Manifest.load(root)
    assert "\n" not in str(err.value)


def test_verify_counts_leftovers_of_an_unfinished_build_apart_from_problems(tmp_path):
    root = _dataset(tmp_path / "ds", 2, _running(4))
    stray = root / "shard-000099.safetensors"
    shutil.copy(root / "shard-000000.safetensors", stray)  # a shard in flight when the build was killed
    result = verify_dataset(root)
    assert result.ok and not result.finished and result.samples == 2
    assert len(result.leftovers) == 1 and "not listed in the manifest" in result.leftovers[0]
    with ShardWriter(tmp_path / "done", make_metadata(), shard_bytes=1) as writer:
        writer.record_build(_running(1))
        writer.add(make_sample("a", 4))
        writer.finish_build(_running(1))
    shutil.copy(stray, tmp_path / "done" / stray.name)
    finished = verify_dataset(tmp_path / "done")
    assert not finished.ok and finished.finished and not finished.leftovers  # beside a finished dataset it is a problem


def test_progress_and_the_first_line():
    assert progress_phrase(413, 1000) == "413 of 1000 samples stored"
    assert progress_phrase(413, None) == "413 samples stored (total unknown)"
    line = unfinished_line("out/x", 3, _running(10))
    assert line == f"unfinished build: 3 of 10 samples stored in out/x; re-run the same command to resume: {COMMAND}"
    assert unfinished_line("out/x", 3, _running(10).as_finished()) is None
    assert unfinished_line("out/x", 3, None) is None


def test_the_resume_hint_changes_directory_only_where_needed(tmp_path):
    here = _running()
    assert resume_hint(here) == COMMAND
    elsewhere = BuildState(RUNNING, 1, COMMAND, str(tmp_path / "some where"))
    assert resume_hint(elsewhere) == f"cd '{tmp_path / 'some where'}' && {COMMAND}"
    assert "merge again" in resume_hint(BuildState(RUNNING))


def test_merged_record():
    done, running = BuildState(FINISHED, 4, COMMAND), BuildState(RUNNING, 6, COMMAND)
    assert merged_build([None, None]) is None
    assert merged_build([done, done]) == BuildState(FINISHED, 8)
    assert merged_build([done, running]) == BuildState(RUNNING, 10)
    assert merged_build([done, None]) == BuildState(FINISHED, None)  # an unrecorded part: its total is unknown


def test_merging_an_unfinished_part_keeps_the_merge_unfinished(tmp_path):
    a = _dataset(tmp_path / "a", 2, _running(2), finish=True)
    b = _dataset(tmp_path / "b", 1, _running(3), first=10)
    merged = merge_datasets([a, b], tmp_path / "m", allow_incomplete=True)  # refused without it (tests/cli/test_unfinished.py)
    assert merged.build == BuildState(RUNNING, 5) and Manifest.load(tmp_path / "m").unfinished
