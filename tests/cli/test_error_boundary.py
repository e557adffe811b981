"""The command line's one error boundary: every command, fed bad input, says so in one line and exits 2.

Known errors (HsDatasetError, OSError, Ctrl-C) -> one stderr line ``hs-dataset CMD: error: ...``,
exit 2, no traceback unless ``--debug`` / ``HS_DATASET_DEBUG=1``; bugs -> traceback, exit 70 (not 1: verify's "found problems").
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hs_dataset.cli.main import COMMANDS, main
from hs_dataset.formats.writer import ShardWriter
from tests.fixtures.paths import REPO
from tests.fixtures.samples import make_metadata, make_sample

HS_DATASET = Path(sys.executable).parent / "hs-dataset"


@pytest.fixture(autouse=True)
def _no_debug_env(monkeypatch):
    monkeypatch.delenv("HS_DATASET_DEBUG", raising=False)


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    """A missing path, an empty (non-dataset) directory and a plain file."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("not a dataset\n")
    return {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "file": tmp_path / "file.txt", "out": tmp_path / "out"}


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    with ShardWriter(root, make_metadata()) as writer:
        writer.add_many([make_sample(f"s{i}", 4 + i) for i in range(3)])
    return root


def assert_one_error_line(code: int, err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith(f"hs-dataset {command}: error: "), err
    return lines[0]


def fails_cleanly(capsys, argv: list[str]) -> str:
    code = main(argv)
    return assert_one_error_line(code, capsys.readouterr().err, argv[0])


# ------------------------------------------------------------------ every command, bad input
BAD_INPUTS = [
    ("build-mistyped-config", lambda p: ["build", "--config", "tiny-deepseek-hff", "--out", str(p["out"])], "unknown config"),
    (
        "build-bad-rank",
        lambda p: ["build", "--config", "tiny-deepseek-hf", "--out", str(p["out"]), "--rank", "3", "--world-size", "2"],
        "rank",
    ),
    ("verify-missing-dir", lambda p: ["verify", str(p["missing"])], "no such directory"),
    ("verify-not-a-dataset", lambda p: ["verify", str(p["empty"])], "not an hs_dataset dataset"),
    ("verify-file", lambda p: ["verify", str(p["file"])], "not a dataset directory"),
    ("info-not-a-dataset", lambda p: ["info", str(p["empty"])], "not an hs_dataset dataset"),
    ("info-file", lambda p: ["info", str(p["file"])], "manifest"),
    ("info-missing-dir", lambda p: ["info", str(p["missing"])], "manifest"),
    ("merge-not-a-dataset", lambda p: ["merge", str(p["empty"]), str(p["out"])], "not an hs_dataset dataset"),
    ("repair-not-a-dataset", lambda p: ["repair", str(p["empty"])], "not an hs_dataset dataset"),
    ("repair-missing-dir", lambda p: ["repair", str(p["missing"])], "no manifest.json"),
    ("repair-file", lambda p: ["repair", str(p["file"])], "cannot be inspected"),
    ("serve-check-mistyped-config", lambda p: ["serve", "--config", "kimi-k25-sglangg", "--check"], "unknown config"),
    ("patch-missing-file", lambda p: ["patch", "check", "--file", str(p["missing"])], "cannot read"),
    ("patch-sglang-root-without-sglang", lambda p: ["patch", "check", "--sglang-root", str(p["empty"])], "deepseek_v2.py"),
    ("export-unknown-target", lambda p: ["export", "megatron", str(p["empty"]), str(p["out"])], "invalid choice"),
    ("export-not-a-dataset", lambda p: ["export", "speculators", str(p["empty"]), str(p["out"])], "not an hs_dataset dataset"),
    ("train-unknown-trainer", lambda p: ["train", "megatron", str(p["empty"])], "invalid choice"),
    ("train-not-a-dataset", lambda p: ["train", "speculators", str(p["empty"]), "--", "--epochs", "1"], "not an hs_dataset dataset"),
    (
        "import-missing-source",
        lambda p: ["import", "speculators", str(p["missing"]), str(p["out"]), "--config", "tiny-deepseek-hf"],
        str(Path("missing")),
    ),
    (
        "import-specforge-missing-source",
        lambda p: ["import", "specforge", str(p["missing"]), str(p["out"]), "--config", "tiny-deepseek-hf"],
        "missing",
    ),
    ("push-not-a-dataset", lambda p: ["push", str(p["empty"]), "me/x", "--token", "hf_fake", "--no-plots"], "not an hs_dataset dataset"),
    ("push-file", lambda p: ["push", str(p["file"]), "me/x", "--token", "hf_fake", "--no-plots"], "manifest"),
    ("push-bad-commit-files", lambda p: ["push", str(p["empty"]), "me/x", "--commit-files", "0"], "must be >= 1"),
    ("card-init-missing-model", lambda p: ["card", "init", "--model", str(p["missing"])], "no config.json"),
    (
        "build-bad-columns",
        lambda p: ["build", "--config", "tiny-deepseek-hf", "--out", str(p["out"]), "--columns", "dialog"],
        "OURS=THEIRS",
    ),
    (
        "build-report-json-is-gone",
        lambda p: ["build", "--config", "tiny-deepseek-hf", "--out", str(p["out"]), "--report-json"],
        "--report-json",
    ),
]


@pytest.mark.parametrize("argv_of, expected", [(a, e) for _, a, e in BAD_INPUTS], ids=[n for n, _, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(capsys, paths, argv_of, expected):
    line = fails_cleanly(capsys, argv_of(paths))
    assert expected in line


def test_every_command_has_a_bad_input_case():
    assert {argv_of({k: Path("x") for k in ("missing", "empty", "file", "out")})[0] for _, argv_of, _ in BAD_INPUTS} == set(COMMANDS)


def test_push_to_an_unreachable_endpoint(capsys, dataset, monkeypatch):
    """A refused connection is the HTTP client's own error (no OSError): push names the endpoint instead."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    line = fails_cleanly(
        capsys, ["push", str(dataset), "me/x", "--endpoint", "http://127.0.0.1:9", "--token", "hf_fake", "--no-plots", "--no-card"]
    )
    assert line.startswith("hs-dataset push: error: cannot reach http://127.0.0.1:9 (ConnectError"), line


def test_push_offline_with_a_fake_token_through_the_installed_script(dataset, tmp_path):
    if not HS_DATASET.exists():
        pytest.skip(f"{HS_DATASET} is not installed")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_TOKEN="hf_fake", HF_HOME=str(tmp_path / "hf"))
    env.pop("HS_DATASET_DEBUG", None)
    proc = subprocess.run(
        [str(HS_DATASET), "push", str(dataset), "me/x", "--no-plots", "--no-card"], env=env, capture_output=True, text=True, timeout=300
    )
    assert_one_error_line(proc.returncode, proc.stderr, "push")
    assert "offline" in proc.stderr.lower()


def test_installed_script_mistyped_config_and_debug(tmp_path):
    if not HS_DATASET.exists():
        pytest.skip(f"{HS_DATASET} is not installed")
    env = {k: v for k, v in os.environ.items() if k != "HS_DATASET_DEBUG"}
    argv = [str(HS_DATASET), "build", "--config", "tiny-deepseek-hff", "--out", str(tmp_path / "o")]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert_one_error_line(proc.returncode, proc.stderr, "build")
    assert proc.stdout == ""
    proc = subprocess.run(argv, env=dict(env, HS_DATASET_DEBUG="1"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" in proc.stderr and "CardError" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("hs-dataset build: error: unknown config")


# ------------------------------------------------------------------ --debug, bugs, Ctrl-C
@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_flag_shows_the_traceback(capsys, paths, where):
    argv = ["info", str(paths["empty"])]
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "FormatError" in err
    assert err.strip().splitlines()[-1].startswith("hs-dataset info: error: ")


def test_debug_environment_variable(capsys, paths, monkeypatch):
    monkeypatch.setenv("HS_DATASET_DEBUG", "1")
    assert main(["verify", str(paths["missing"])]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_a_bug_shows_the_traceback_and_exits_70(capsys, paths, monkeypatch):
    import hs_dataset.cli.info as info

    def broken(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(info, "run", broken)
    assert main(["info", str(paths["empty"])]) == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError: a bug" in err and "internal error" in err


def test_ctrl_c_is_one_line(capsys, paths, monkeypatch):
    import hs_dataset.cli.info as info

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(info, "run", interrupted)
    assert fails_cleanly(capsys, ["info", str(paths["empty"])]) == "hs-dataset info: error: interrupted"


def test_multi_line_messages_stay_on_one_line(capsys, monkeypatch):
    import hs_dataset.cli.info as info
    from hs_dataset.errors import CaptureError

    def failing(args):
        raise CaptureError("the server died\nlast log lines:\nOOM")

    monkeypatch.setattr(info, "run", failing)
    assert fails_cleanly(capsys, ["info", "x"]) == "hs-dataset info: error: the server died | last log lines: | OOM"


def test_verify_problems_are_a_result_exit_1(capsys, dataset):
    shard = next(dataset.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["verify", str(dataset)]) == 1
    err = capsys.readouterr().err
    assert "verification FAILED" in err and "Traceback" not in err


# ------------------------------------------------------------------ help, version, flags
def test_version(capsys):
    from hs_dataset.version import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"hs-dataset {__version__}"


HELP_ARGVS = [[c] for c in COMMANDS] + [
    ["export", "speculators"],
    ["export", "specforge"],
    ["import", "speculators"],
    ["import", "specforge"],
]


@pytest.mark.parametrize("argv", HELP_ARGVS, ids=" ".join)
def test_every_help_has_examples(capsys, argv):
    assert main([*argv, "--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "--debug" in out


def test_help_shows_defaults_and_verify_documents_exit_1(capsys):
    assert main(["export", "specforge", "--help"]) == 0
    assert "(default: 2000)" in capsys.readouterr().out
    assert main(["verify", "--help"]) == 0
    assert "1 problems found" in capsys.readouterr().out


def test_same_flag_names_everywhere(capsys):
    from hs_dataset.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))

    def options(*path: str) -> set[str]:
        p = sub.choices[path[0]]
        for name in path[1:]:
            p = next(a for a in p._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices[name]
        return {s for a in p._actions for s in a.option_strings}

    for path in (("build",), ("verify",), ("info",), ("export", "speculators"), ("import", "specforge"), ("patch",)):
        assert "--json" in options(*path), path
    for path in (("export", "speculators"), ("export", "specforge"), ("import", "speculators"), ("import", "specforge")):
        assert "--aux-layer-ids" in options(*path) and "--aux-layers" not in options(*path), path


def test_verbose_lets_library_logs_through(capsys, paths):
    main(["-v", "info", str(paths["empty"])])
    assert logging.getLogger("httpx").level == logging.INFO
    main(["info", str(paths["empty"])])  # last, so that later tests see the quiet default
    assert logging.getLogger("httpx").level == logging.WARNING and logging.getLogger("huggingface_hub").level == logging.WARNING
    capsys.readouterr()


def test_building_the_parser_is_light():
    """``hs-dataset --help`` must not import torch, transformers or datasets."""
    code = (
        "import sys; from hs_dataset.cli.main import build_parser; build_parser(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'datasets', 'huggingface_hub', 'numpy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip() == "[]"
