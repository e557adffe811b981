"""A URL given where a local dataset directory is taken is refused in one line, never made a directory named ``s3:``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hs_dataset.cli.main import EXIT_ERROR, main as cli_main
from hs_dataset.errors import UsageError
from hs_dataset.formats.merge import merge_datasets
from hs_dataset.formats.paths import check_local_path, url_scheme
from hs_dataset.formats.reader import open_dataset
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.formats.writer import ShardWriter
from tests.fixtures.samples import make_metadata

URL = "s3://bucket/ds"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield
    assert not [name for name in os.listdir(tmp_path) if name.endswith(":")]


@pytest.mark.parametrize(
    "path, scheme",
    [
        ("s3://b/x", "s3"),
        ("gs://b", "gs"),
        ("hf://datasets/o/n", "hf"),
        ("file:///tmp/x", "file"),
        (Path("s3://b/x"), "s3"),
        ("S3://B", "s3"),
        ("out/ds", None),
        ("/abs/ds", None),
        ("C:/x", None),
        ("weird:name", None),
        (Path("a/s3:"), None),
    ],
)
def test_url_scheme(path, scheme):
    assert url_scheme(path) == scheme


def test_library_entry_points_refuse_urls(tmp_path):
    for call in (
        lambda: open_dataset(URL),
        lambda: open_dataset(Path(URL)),
        lambda: verify_dataset(URL),
        lambda: ShardWriter(URL, make_metadata()),
        lambda: merge_datasets([tmp_path / "a"], URL),
        lambda: check_local_path("gs://bucket/x", what="dataset"),
    ):
        with pytest.raises(UsageError, match=r"is a (s3|gs):// URL, but this takes a local directory") as info:
            call()
        assert "\n" not in str(info.value)
    assert not (tmp_path / "s3:").exists()


LOCAL_ONLY = "URL, but this takes a local directory"
BUILD = ["build", "--config", "tiny-deepseek-hf", "--num-samples", "1", "--out"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["info", URL], LOCAL_ONLY),
        (["export", "speculators", URL, "out/x"], LOCAL_ONLY),
        (["export", "speculators", "out/x", URL], LOCAL_ONLY),
        (["import", "speculators", URL, "out/x", "--config", "tiny-deepseek-hf"], LOCAL_ONLY),
        ([*BUILD, "nosuch://bucket/ds"], "nosuch:// is not a storage scheme fsspec knows; supported: local paths and s3://"),
        ([*BUILD, "s3:/bucket/ds"], "a s3:// URL that lost a '/'"),
        ([*BUILD, "s3://"], "give a prefix inside the bucket"),
    ],
)
def test_cli_refuses_a_url_in_one_line(argv, expected, tmp_path, capsys):
    assert cli_main(argv) == EXIT_ERROR
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and expected in err, err
    assert not (tmp_path / "s3:").exists()
