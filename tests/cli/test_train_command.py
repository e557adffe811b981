"""``hs-dataset train TRAINER DATASET``: the trainer comes from the registry (``interop/trainers.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hs_dataset.cli.main import main
from hs_dataset.interop import trainers


def test_the_launchers_are_the_registrys() -> None:
    assert trainers.train_launchers() == [name for name, t in trainers.TRAINERS.items() if t.launches_training]
    assert "speculators" in trainers.train_launchers() and "specforge" not in trainers.train_launchers()


def test_a_trainer_without_a_launcher_is_refused_in_one_line_naming_those_with_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "specforge", str(tmp_path), "--", "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("hs-dataset train: error: specforge has no train launcher; hs-dataset train runs speculators")


def test_an_unknown_trainer_is_an_invalid_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "megatron", str(tmp_path)]) == 2
    assert "invalid choice: 'megatron'" in capsys.readouterr().err


def test_the_named_trainers_launcher_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A trainer registered with a launcher gets its own options and its ``train`` is what runs."""
    import types

    calls: list[argparse.Namespace] = []
    fake = types.ModuleType("fake_trainer_cli")
    fake.TRAIN_HELP = "a stand-in trainer"  # type: ignore[attr-defined]
    fake.add_train_arguments = lambda p: (p.add_argument("dataset"), p.add_argument("--steps", type=int, default=1))  # type: ignore[attr-defined]
    fake.train = lambda args: calls.append(args) or 0  # type: ignore[attr-defined]
    registry = {**trainers.TRAINERS, "fake": trainers.Trainer("fake_pkg", trainers.ExportSettings, launches_training=True)}
    monkeypatch.setattr(trainers, "TRAINERS", registry)
    real_cli = trainers.trainer_cli
    monkeypatch.setattr(trainers, "trainer_cli", lambda name: fake if name == "fake" else real_cli(name))
    import hs_dataset.cli.train as train_command

    monkeypatch.setattr(train_command, "TRAINERS", registry)
    monkeypatch.setattr(train_command, "trainer_cli", trainers.trainer_cli)
    parser = argparse.ArgumentParser(prog="hs-dataset train")
    train_command.add_arguments(parser)
    args = parser.parse_args(["fake", "--steps", "3", str(tmp_path)])
    assert train_command.run(args) == 0
    assert [(a.trainer, a.dataset, a.steps) for a in calls] == [("fake", str(tmp_path), 3)]


def test_speculators_keeps_its_options_and_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "speculators", "--rows-dir", str(tmp_path / "rows"), str(tmp_path / "none"), "--", "--epochs", "1"]) == 2
    assert "not an hs_dataset dataset" in capsys.readouterr().err
    assert main(["train", "speculators", "--rows-dir", "s3://bucket/rows", str(tmp_path), "--", "--epochs", "1"]) == 2
    assert "--rows-dir" in capsys.readouterr().err
