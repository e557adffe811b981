"""The one export loop (``interop/exporting.py``) with a stand-in trainer, and the per-trainer export settings.

The stand-in writes each sample's token ids to ``samples/s_{idx}.bin``: what the loop
itself does -- resume, atomic files, stale files, the record, hook failures -- is
tested apart from any trainer's layout (``tests/interop/test_exports.py`` reads the
real layouts with the trainers' own readers).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hs_dataset.formats.writer import ShardWriter
from hs_dataset.interop import EXPORT_RECORD_NAME, ExportSettings, read_export_record
from hs_dataset.interop.common import ExportReport
from hs_dataset.interop.exporting import (
    ExportHookError,
    ExportPlan,
    TrainerExporter,
    run_export,
)
from tests.fixtures.samples import child_env, make_metadata, make_sample

LENGTHS = (7, 12, 5, 9, 11)


class TokenFiles(TrainerExporter):
    """A stand-in trainer: one file of int64 token ids per sample, and an index of the sample ids at the end."""

    target = "tokenfiles"
    sample_glob = "samples/s_*.bin"
    sample_prefix, sample_suffix = "s_", ".bin"

    def plan(self) -> ExportPlan:
        return ExportPlan(resume_key={"target": self.target, "source_dataset_id": self.ds.manifest.dataset_id}, layers={"ids": []})

    def describe(self, report: ExportReport) -> None:
        report.notes.append("token ids only")

    def sample_path(self, idx: int) -> Path:
        return self.dest / "samples" / f"s_{idx}.bin"

    def is_complete(self, path: Path, sample: dict[str, Any]) -> bool:
        return path.read_bytes() == self._bytes(sample)

    def encode(self, sample: dict[str, Any]) -> list[bytes]:
        return [self._bytes(sample)]

    def finish(self, record: dict[str, Any]) -> None:
        record["finished_by"] = self.target

    @staticmethod
    def _bytes(sample: dict[str, Any]) -> bytes:
        return sample["input_ids"].to(torch.int64).numpy().tobytes()


class BrokenEncode(TokenFiles):
    def encode(self, sample: dict[str, Any]) -> list[bytes]:
        raise KeyError("aux_hidden_states")


def export_tokens(src: str, dest: str) -> ExportReport:
    """Called in a child process too (the kill test)."""
    return run_export(TokenFiles, src, dest, ExportSettings())


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    with ShardWriter(root, make_metadata(k=3, h=16, num_hidden_layers=6), shard_bytes=1500) as writer:
        for i, t in enumerate(LENGTHS):
            writer.add(make_sample(f"s{i}", t))
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "samples").iterdir())}


def test_the_loop_writes_every_sample_then_the_complete_record(src: Path, tmp_path: Path) -> None:
    report = export_tokens(str(src), str(tmp_path / "out"))
    assert (report.samples, report.tokens, report.files_written, report.files_skipped, report.resumed) == (5, sum(LENGTHS), 5, 0, False)
    assert report.notes == ["token ids only"]
    record = read_export_record(tmp_path / "out")
    assert record is not None and record["status"] == "complete" and record["finished_by"] == "tokenfiles"
    assert record["samples"] == 5 and record["tokens"] == sum(LENGTHS) and record["layers"] == {"ids": []}


def test_a_kill_mid_file_resumes_keeping_the_complete_files(src: Path, tmp_path: Path) -> None:
    clean = tmp_path / "clean"
    export_tokens(str(src), str(clean))
    dest = tmp_path / "out"
    env = {**child_env(), "HS_DATASET_CRASH_AT": "export.mid_file:3"}  # SIGKILL half-way through the third file
    code = f"from tests.interop.test_exporting import export_tokens; export_tokens({str(src)!r}, {str(dest)!r})"
    child = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr
    assert read_export_record(dest)["status"] == "in_progress"
    assert sorted(p.name for p in (dest / "samples").iterdir() if not p.name.startswith(".")) == ["s_0.bin", "s_1.bin"]

    report = export_tokens(str(src), str(dest))
    assert report.resumed and (report.files_skipped, report.files_written, report.files_rewritten) == (2, 3, 0)
    assert _files(dest) == _files(clean)  # and no temp file is left
    assert read_export_record(dest)["status"] == "complete"


def test_an_invalid_file_is_rewritten_and_files_past_the_source_removed(src: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    export_tokens(str(src), str(dest))
    (dest / "samples" / "s_1.bin").write_bytes(b"truncated")
    (dest / "samples" / "s_9.bin").write_bytes(b"from a larger export")
    report = export_tokens(str(src), str(dest))
    assert (report.files_skipped, report.files_rewritten, report.files_written) == (4, 1, 1)
    assert sorted((dest / "samples").iterdir()) == [dest / "samples" / f"s_{i}.bin" for i in range(5)]


def test_a_hook_failure_is_one_named_error(src: Path, tmp_path: Path) -> None:
    with pytest.raises(
        ExportHookError, match=r"the tokenfiles exporter's encode hook failed on sample 0 \(s0\): KeyError: 'aux_hidden_states'"
    ) as caught:
        run_export(BrokenEncode, src, tmp_path / "out", ExportSettings())
    assert isinstance(caught.value.__cause__, KeyError)
    assert read_export_record(tmp_path / "out")["status"] == "in_progress"  # a rerun resumes


def test_a_refusal_in_a_hook_passes_as_it_is(src: Path, tmp_path: Path) -> None:
    from hs_dataset.interop import ExportMismatchError

    class Refusing(TokenFiles):
        def plan(self) -> ExportPlan:
            raise ExportMismatchError("the data cannot mean what tokenfiles expects")

    with pytest.raises(ExportMismatchError, match="cannot mean"):
        run_export(Refusing, src, tmp_path / "out", ExportSettings())
    assert not (tmp_path / "out").exists()  # refused before anything is written


# ---------------------------------------------------------------------------- per-trainer settings
def test_each_trainer_has_its_own_settings_in_the_registry() -> None:
    from hs_dataset.interop.specforge.settings import SpecForgeExportSettings
    from hs_dataset.interop.speculators.settings import SpeculatorsExportSettings
    from hs_dataset.interop.trainers import TRAINERS

    assert TRAINERS["speculators"].export_settings is SpeculatorsExportSettings
    assert TRAINERS["specforge"].export_settings is SpecForgeExportSettings
    assert all(issubclass(t.export_settings, ExportSettings) for t in TRAINERS.values())


def test_settings_refuse_other_trainers_fields_and_bad_values() -> None:
    from hs_dataset.errors import UsageError
    from hs_dataset.interop.specforge.settings import SpecForgeExportSettings
    from hs_dataset.interop.speculators.settings import SpeculatorsExportSettings

    with pytest.raises(TypeError, match="group_size"):
        SpeculatorsExportSettings(group_size=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="token_freq"):
        SpecForgeExportSettings(token_freq=False)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="keep_dtype"):
        ExportSettings(keep_dtype=True)  # type: ignore[call-arg]
    with pytest.raises(UsageError, match="group_size must be >= 1"):
        SpecForgeExportSettings(group_size=0)
    with pytest.raises(UsageError, match="num_hidden_layers"):
        SpeculatorsExportSettings(num_hidden_layers=0)
    with pytest.raises(AttributeError):
        SpecForgeExportSettings().group_size = 3  # type: ignore[misc]


def test_the_common_settings_take_the_trainers_defaults_and_another_trainers_are_refused() -> None:
    from hs_dataset.errors import UsageError
    from hs_dataset.interop.specforge.settings import SpecForgeExportSettings
    from hs_dataset.interop.speculators.settings import SpeculatorsExportSettings

    adopted = SpecForgeExportSettings.adopt(ExportSettings(overwrite=True, aux_layer_ids=[1, 2, 3]))
    assert adopted == SpecForgeExportSettings(overwrite=True, aux_layer_ids=[1, 2, 3], group_size=2000, keep_dtype=False)
    own = SpeculatorsExportSettings(token_freq=False)
    assert SpeculatorsExportSettings.adopt(own) is own
    with pytest.raises(UsageError, match="takes SpeculatorsExportSettings .* not SpecForgeExportSettings"):
        SpeculatorsExportSettings.adopt(SpecForgeExportSettings())


def test_the_record_is_named_as_before() -> None:
    assert EXPORT_RECORD_NAME == "hs_dataset_export.json"


def test_a_folder_of_other_files_is_refused_without_suggesting_an_overwrite_that_would_refuse_too(src: Path, tmp_path: Path) -> None:
    from hs_dataset.interop.common import ExportError, prepare_destination

    dest = tmp_path / "notes"
    dest.mkdir()
    (dest / "mine.txt").write_text("the user's")
    with pytest.raises(ExportError) as plain:
        prepare_destination(src, dest, target="speculators", resume_key={}, overwrite=False)
    assert "--overwrite" not in str(plain.value) and "another (new or empty) destination" in str(plain.value)
    with pytest.raises(ExportError, match="--overwrite deletes only an earlier hs_dataset export"):
        prepare_destination(src, dest, target="speculators", resume_key={}, overwrite=True)
    assert (dest / "mine.txt").read_text() == "the user's"
