"""Hub repository ids (hub/repo_id.py): a bad one is a one-line usage error before any work or request."""

from __future__ import annotations

import pytest

from hs_dataset.cli.main import main
from hs_dataset.errors import UsageError
from hs_dataset.hub.repo_id import check_repo_id
from tests.fixtures.untrusted_dataset import build


@pytest.mark.parametrize("repo_id", ["user/my-eagle3-data", "my-eagle3-data"])
def test_a_valid_id_is_kept(repo_id):
    assert check_repo_id(repo_id) == repo_id


@pytest.mark.parametrize(("repo_id", "says"), [("a/b/c", "NAMESPACE/NAME"), ("-a/b", "alphanumeric"), ("a/b.git", ".git"), ("", "")])
def test_an_invalid_id_is_a_usage_error_naming_it(repo_id, says):
    with pytest.raises(UsageError) as err:
        check_repo_id(repo_id)
    text = str(err.value)
    assert "\n" not in text and f"repo_id {repo_id!r} is not a Hub repository id" in text and says in text


def test_push_to_an_invalid_id_exits_2_in_one_line_without_the_network(tmp_path, capsys, monkeypatch):
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("the Hub was asked before the repo id was checked")

    monkeypatch.setattr(huggingface_hub, "HfApi", no_network)  # push makes its client from here: none may be made
    root = build(tmp_path / "ds")
    assert main(["push", str(root), "a/b/c"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("hs-dataset push: error: repo_id 'a/b/c' is not a Hub repository id"), err
    assert main(["push", str(tmp_path / "missing"), "a/b/c"]) == 2  # checked before the dataset is read
    assert "repo_id 'a/b/c'" in capsys.readouterr().err
