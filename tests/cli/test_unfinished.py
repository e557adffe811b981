"""An unfinished build on the command line and in the API: verify and info say so first; push, export and merge refuse it in one line.

The refusal is the API's (``push_to_hub``, the exports, the merges take ``allow_incomplete``);
the commands pass ``--allow-incomplete`` on, so a script and a command refuse the same line.

The datasets here are written by the writer with a ``running`` build record (what a
killed build leaves); tests/end_to_end/test_unfinished_build.py kills a real build.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hs_dataset.cli.main import main
from hs_dataset.formats import ShardWriter
from hs_dataset.formats.build_state import RUNNING, BuildState
from hs_dataset.formats.manifest import Manifest
from tests.fixtures.paths import FIXTURES
from tests.fixtures.samples import make_metadata, make_sample

COMMAND = "hs-dataset build --config tiny-deepseek-hf --out out/killed --num-samples 9"


def _write(root: Path, n: int, *, build: BuildState | None, finish: bool = False, first: int = 0) -> Path:
    with ShardWriter(root, make_metadata(num_hidden_layers=8), shard_bytes=1) as writer:
        if build is not None:
            writer.record_build(build)
        writer.add_many([make_sample(f"s{i}", 4 + i % 3) for i in range(first, first + n)])
        if finish and build is not None:
            writer.finish_build(build)
    return root


@pytest.fixture
def killed(tmp_path: Path) -> Path:
    """3 of 9 samples stored, the build record still running (a build killed at that point)."""
    return _write(tmp_path / "killed", 3, build=BuildState(RUNNING, 9, COMMAND, os.getcwd()))


@pytest.fixture
def finished(tmp_path: Path) -> Path:
    return _write(tmp_path / "done", 2, build=BuildState(RUNNING, 2, COMMAND, os.getcwd()), finish=True, first=100)


def _first_line(text: str) -> str:
    return text.splitlines()[0]


EXPECTED_LINE = "unfinished build: 3 of 9 samples stored in {path}; re-run the same command to resume: " + COMMAND


def test_verify_says_unfinished_first_and_fails(killed, capsys):
    assert main(["verify", str(killed)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert _first_line(err) == "error: " + EXPECTED_LINE.format(path=killed) + " (or pass --allow-incomplete to verify it as it is)"
    assert err.splitlines()[-1] == f"verification FAILED: 1 problem(s) in {killed}"


def test_verify_allow_incomplete_checks_what_is_stored(killed, capsys):
    assert main(["verify", str(killed), "--allow-incomplete"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == EXPECTED_LINE.format(path=killed)
    assert lines[-1].startswith("verified 3 samples")


def test_verify_json_reports_the_build(killed, capsys):
    assert main(["verify", str(killed), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["finished"] is False and report["samples"] == 3
    assert report["build"]["samples_expected"] == 9 and report["build"]["command"] == COMMAND
    assert report["problems"][0].startswith("unfinished build: 3 of 9 samples stored")


def test_verify_of_an_unknown_total_says_so(tmp_path, capsys):
    root = _write(tmp_path / "unknown", 2, build=BuildState(RUNNING, None, COMMAND, os.getcwd()))
    assert main(["verify", str(root), "--allow-incomplete"]) == 0
    assert _first_line(capsys.readouterr().out).startswith(f"unfinished build: 2 samples stored (total unknown) in {root}; ")


def test_info_says_unfinished_first(killed, capsys):
    assert main(["info", str(killed)]) == 0
    out = capsys.readouterr().out
    assert _first_line(out) == EXPECTED_LINE.format(path=killed)
    assert "build            running or stopped, 3 of 9 samples stored" in out
    assert main(["info", str(killed), "--json"]) == 0  # JSON stays JSON: the record is its build field
    assert json.loads(capsys.readouterr().out)["build"]["state"] == RUNNING


def test_a_finished_build_says_nothing_of_it(finished, capsys):
    assert main(["verify", str(finished)]) == 0
    assert capsys.readouterr().out.startswith("verified 2 samples")
    assert main(["info", str(finished)]) == 0
    out = capsys.readouterr().out
    assert "unfinished" not in out and f"build            finished ({COMMAND})" in out


def _refusal(capsys, argv: list[str], path: Path, verb: str) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.strip().splitlines() == [
        f"hs-dataset {argv[0]}: error: {path}: unfinished build (3 of 9 samples stored; manifest.json build.state is 'running'): "
        f"resume it with `{COMMAND}`, or pass --allow-incomplete (allow_incomplete=True in Python) to {verb} it as it is"
    ]


def test_push_refuses_before_any_request(killed, capsys):
    _refusal(capsys, ["push", str(killed), "me/x", "--token", "hf_fake", "--endpoint", "http://127.0.0.1:9", "--no-plots"], killed, "push")


def test_export_refuses_and_the_flag_exports(killed, tmp_path, capsys):
    dest = tmp_path / "exported"
    _refusal(capsys, ["export", "speculators", str(killed), str(dest)], killed, "export")
    assert not dest.exists()
    assert main(["export", "speculators", str(killed), str(dest), "--allow-incomplete"]) == 0
    assert dest.is_dir()


def test_merge_refuses_and_the_flag_merges_into_an_unfinished_dataset(killed, finished, tmp_path, capsys):
    out = tmp_path / "merged"
    _refusal(capsys, ["merge", str(finished), str(killed), str(out)], killed, "merge")
    assert not out.exists()
    assert main(["merge", str(finished), str(killed), str(out), "--allow-incomplete"]) == 0
    printed = capsys.readouterr().out
    assert _first_line(printed).startswith(f"unfinished build: 5 of 11 samples stored in {out}; ")
    assert Manifest.load(out).unfinished
    assert main(["push", str(out), "me/x", "--token", "hf_fake", "--no-plots"]) == 2  # the merge did not hide it
    assert "unfinished build (5 of 11 samples stored" in capsys.readouterr().err


@pytest.mark.parametrize("layout", ["native", "fp8"])
def test_an_old_dataset_without_the_record_counts_as_finished(tmp_path, capsys, layout):
    root = tmp_path / layout
    shutil.copytree(FIXTURES / "old_layout" / layout, root)
    assert main(["verify", str(root)]) == 0
    assert capsys.readouterr().out.startswith("verified ")
    assert main(["info", str(root)]) == 0
    out = capsys.readouterr().out
    assert "unfinished" not in out
    assert "build            not recorded (written before hs_dataset recorded it, or not by `hs-dataset build`): treated as finished" in out
    export = ["export", "speculators", str(root), str(tmp_path / "exported"), "--num-hidden-layers", "8"]
    assert main(export) == 0  # not refused: nothing says its build is unfinished


def _api_refusal(path: Path, verb: str) -> str:
    return (
        f"{path}: unfinished build (3 of 9 samples stored; manifest.json build.state is 'running'): "
        f"resume it with `{COMMAND}`, or pass --allow-incomplete (allow_incomplete=True in Python) to {verb} it as it is"
    )


def test_push_to_hub_refuses_before_any_request_and_the_flag_pushes(killed, api, standin):
    from hs_dataset.errors import IncompleteDatasetError
    from hs_dataset.hub.upload import push_to_hub

    with pytest.raises(IncompleteDatasetError) as caught:
        push_to_hub(killed, "me/killed", api=api, card=False, plots=False)
    assert str(caught.value) == _api_refusal(killed, "push")
    assert not api.repo_exists("me/killed", repo_type="dataset")  # refused before any request
    report = push_to_hub(killed, "me/killed", api=api, card=False, plots=False, allow_incomplete=True)
    assert report.repo_id == "me/killed" and api.repo_exists("me/killed", repo_type="dataset")


@pytest.mark.parametrize("trainer", ["speculators", "specforge"])
def test_the_export_functions_refuse_and_the_flag_exports(killed, tmp_path, trainer):
    from hs_dataset import interop
    from hs_dataset.errors import IncompleteDatasetError
    from hs_dataset.interop import ExportMismatchError, ExportSettings

    export = getattr(interop, f"export_{trainer}")
    dest = tmp_path / "exported"
    with pytest.raises(IncompleteDatasetError) as caught:
        export(killed, dest)
    assert str(caught.value) == _api_refusal(killed, "export") and not dest.exists()
    if trainer == "speculators":
        assert export(killed, dest, ExportSettings(allow_incomplete=True)).samples == 3
    else:  # past the refusal: the synthetic states lack the final norm SpecForge's post-norm state needs
        with pytest.raises(ExportMismatchError, match="final"):
            export(killed, dest, ExportSettings(allow_incomplete=True))


@pytest.mark.parametrize("entry", ["merge_datasets", "dataset_access.merge"])
def test_the_merge_functions_refuse_and_the_flag_merges(killed, finished, tmp_path, entry):
    from hs_dataset.dataset_access import merge
    from hs_dataset.errors import IncompleteDatasetError
    from hs_dataset.formats.merge import merge_datasets

    run = merge_datasets if entry == "merge_datasets" else merge
    out = tmp_path / "merged"
    with pytest.raises(IncompleteDatasetError) as caught:
        run([str(finished), str(killed)], str(out))
    assert str(caught.value) == _api_refusal(killed, "merge") and not out.exists()
    run([str(finished), str(killed)], str(out), allow_incomplete=True)
    merged = Manifest.load(out)
    assert merged.unfinished and merged.num_samples == 5
