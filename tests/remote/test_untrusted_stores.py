"""Untrusted input on the remote side: what a bucket's manifest, a shared cache directory and an output URL can do.

Each case feeds one hostile input to the real entry point (``open_dataset(URL)``,
``verify URL``, ``build --out URL``, ``merge``, ``info --plots``, ``load_dataset``,
the stream's and the remote reader's caches) and asserts the named one-line error, or
correct handling, and that no file outside the cache or output directory was created or
changed. Stores are ``file://`` prefixes (the same code as ``s3://``) or moto's S3
server. Assertion tags (tests/fixtures/tally.py): ESCAPE: a file written outside,
LOST: a file that is not ours deleted or overwritten, or a build's work thrown away,
SILENT: wrong bytes served or a refusal that was claimed but not made. The bounded
reads (memory, time, arguments) are in tests/remote/test_bounded_reads.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
import torch

import hs_dataset
from hs_dataset.cli.main import main as cli_main
from hs_dataset.config.remote import RemoteOptions
from hs_dataset.errors import ForeignDatasetError, FormatError, HsDatasetError, IntegrityError, RebuiltDatasetError, UsageError
from hs_dataset.formats.manifest import MANIFEST_NAME
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.remote.location import open_location
from hs_dataset.remote.publish import CLAIM_NAME, publish_dataset
from tests.fixtures.assertions import one_line
from tests.fixtures.samples import make_metadata, make_sample, write_small_dataset


def write_dataset(root: Path, n: int = 8, *, first: int = 0) -> Path:
    return write_small_dataset(root, n, first=first)


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links as their target) with a digest of its bytes: what 'nothing changed' compares."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


@pytest.fixture
def published(tmp_path):
    """(url, local dir, store dir): 8 samples in 4 shards, published to file://tmp/bucket/ds."""
    local = write_dataset(tmp_path / "local")
    url = f"file://{tmp_path}/bucket/ds"
    publish_dataset(local, open_location(url))
    return url, local, tmp_path / "bucket" / "ds"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """The user's files outside every cache and output (a ``.ssh`` directory), and the working directory, empty."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text("host ssh-ed25519 AAAA\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HS_DATASET_CACHE_DIR", str(tmp_path / "cache"))
    return home


def assert_untouched(home: Path, before: dict[str, str]) -> None:
    assert tree(home) == before, f"ESCAPE: files outside the cache were created or changed: {sorted(set(tree(home)) ^ set(before))}"
    assert tree(Path.cwd()) == {}, f"ESCAPE: written into the working directory: {sorted(tree(Path.cwd()))}"


def edit_remote_manifest(store: Path, edit) -> None:
    raw = json.loads((store / MANIFEST_NAME).read_text())
    edit(raw)
    (store / MANIFEST_NAME).write_text(json.dumps(raw))


# ---------------------------------------------------------------- a manifest's names are names, never paths


@pytest.mark.parametrize("entry", ["final_norm", "verify"])
@pytest.mark.parametrize("dataset_id", ["absolute", "dotdot"])
def test_a_dataset_id_that_is_a_path_writes_nothing_there(entry, dataset_id, published, home, capsys):
    url, _local, store = published
    target = home / ".ssh"
    (store / "authorized_keys").write_bytes(b"ssh-ed25519 ATTACKER\n")
    ident = str(target) if dataset_id == "absolute" else "../../home/.ssh"

    def edit(raw):
        raw["dataset_id"] = ident
        raw["metadata"]["final_norm"] = {"eps": 1e-6, "weight_file": "authorized_keys"}

    edit_remote_manifest(store, edit)
    before = tree(home)
    if entry == "final_norm":
        with pytest.raises(FormatError) as err:
            hs_dataset.open_dataset(url).final_norm()
        assert "dataset_id" in one_line(err.value), err.value
    else:
        assert cli_main(["verify", url]) != 0
        assert "dataset_id" in capsys.readouterr().err
    assert not (target / "authorized_keys").exists(), "ESCAPE: the bucket wrote authorized_keys into .ssh"
    assert_untouched(home, before)


def test_a_shard_records_dataset_id_that_is_a_path_is_refused(published, home):
    url, _local, store = published
    edit_remote_manifest(store, lambda raw: raw["shards"][0].update(dataset_id="/etc"))
    before = tree(home)
    with pytest.raises(FormatError) as err:
        hs_dataset.open_dataset(url)
    assert "shards[0].dataset_id" in one_line(err.value)
    assert_untouched(home, before)


def test_norm_weight_bytes_are_checked_before_they_get_their_name(published, home, tmp_path):
    url, _local, store = published
    norm = store / "final_norm.safetensors"
    data = bytearray(norm.read_bytes())
    data[-1] ^= 0x01  # same size, other bytes: the recorded sha256 differs
    norm.write_bytes(bytes(data))
    data = hs_dataset.open_dataset(url)
    with pytest.raises(IntegrityError) as err:
        data.final_norm()
    assert "sha256" in one_line(err.value)
    placed = list((tmp_path / "cache" / "meta").rglob("final_norm.safetensors"))
    assert not placed, f"ESCAPE: unchecked bytes were placed at their final name: {placed}"
    data.close()


def test_a_url_as_cache_dir_makes_no_local_directory(published, home):
    url, _local, _store = published
    before = tree(home)
    with pytest.raises(UsageError) as err:
        hs_dataset.open_dataset(url, cache_dir="s3://bucket/cache")
    assert "is a s3:// URL, but this takes a local directory" in one_line(err.value)
    assert_untouched(home, before)


def test_info_plots_to_a_url_writes_nothing_locally(published, home, capsys):
    _url, local, _store = published
    before = tree(home)
    assert cli_main(["info", str(local), "--plots", "s3://bucket/plots"]) == 2, "SILENT: info --plots URL exited 0"
    assert "--plots directory is a s3:// URL" in capsys.readouterr().err
    assert_untouched(home, before)


# ---------------------------------------------------------------- a cache owns only what it wrote


def test_a_dataset_as_cache_dir_is_refused_and_kept(published, home):
    url, _local, _store = published
    victim = write_dataset(home / "my-dataset", 4, first=50)
    before = tree(home)
    with pytest.raises(ForeignDatasetError) as err:
        hs_dataset.open_dataset(url, cache_dir=victim, max_cache_bytes=1 << 16)
    assert "holds a dataset" in one_line(err.value)
    assert tree(home) == before, "LOST: the cache changed a dataset given as cache_dir"


@pytest.mark.parametrize("via_link", [False, True])
def test_a_directory_with_user_files_is_refused_as_cache(via_link, published, home, tmp_path):
    url, _local, _store = published
    user = home / "models"
    user.mkdir()
    (user / "model.safetensors").write_bytes(b"\0" * 5000)
    cache_dir = user
    if via_link:  # the cache directory is a link to the user's directory
        cache_dir = tmp_path / "cache-link"
        cache_dir.symlink_to(user)
    before = tree(home)
    with pytest.raises(ForeignDatasetError) as err:
        hs_dataset.open_dataset(url, cache_dir=cache_dir, max_cache_bytes=1 << 16)
    assert "files the cache did not write" in one_line(err.value) and "model.safetensors" in str(err.value)
    assert tree(home) == before, "LOST: the cache changed a directory of user files"


def test_files_put_into_a_cache_are_never_evicted(published, home, tmp_path):
    """A user's model.safetensors in the cache, and one behind a link, survive reads that evict over and over."""
    url, local, _store = published
    cache = tmp_path / "cache"
    hs_dataset.open_dataset(url, cache_dir=cache).close()  # the cache claims its directory
    (home / "model.safetensors").write_bytes(b"\1" * 3000)
    (cache / "model.safetensors").write_bytes(b"\2" * 3000)
    (cache / "linked.safetensors").symlink_to(home / "model.safetensors")
    before_home, mine = tree(home), (cache / "model.safetensors").read_bytes()
    shard = -(-max(p.stat().st_size for p in local.glob("shard-*")) // 4096) * 4096  # on disk: whole blocks
    bound = 3 * shard + 3 * 4096  # 2 open shards and the next, the user's file, the index and a block: the 4th evicts
    data = hs_dataset.open_dataset(url, cache_dir=cache, max_cache_bytes=bound, prefetch_shards=0)
    for _ in range(2):
        assert [row["sample_id"] for row in data] == [f"s{i:02d}" for i in range(8)]
    data.close()
    kept = cache / "model.safetensors"
    assert kept.exists() and kept.read_bytes() == mine, "LOST: eviction deleted a user's file in the cache"
    assert (cache / "linked.safetensors").is_symlink(), "LOST: eviction deleted a user's link in the cache"
    assert tree(home) == before_home, "LOST: eviction reached a file behind a link"


def test_a_planted_file_under_a_cache_name_is_not_served(published, home, tmp_path):
    url, _local, _store = published
    cache = tmp_path / "cache"
    data = hs_dataset.open_dataset(url, cache_dir=cache, prefetch_shards=0)
    record = data.manifest.shards[0]
    planted = data.cache.path_for(record)
    planted.write_bytes(b"\0" * record.bytes)  # the right name and size, other bytes
    with pytest.raises(IntegrityError) as err:
        data[0]
    assert "the cache did not write" in one_line(err.value), "SILENT: a planted file was served"
    assert planted.read_bytes() == b"\0" * record.bytes, "LOST: the cache deleted a file it did not write"
    data.close()


def test_a_cached_shard_flipped_after_download_is_not_served_on_reopen(published, home, tmp_path):
    url, local, _store = published
    cache = tmp_path / "cache"
    here = hs_dataset.open_dataset(local)
    data = hs_dataset.open_dataset(url, cache_dir=cache, prefetch_shards=0)
    assert torch.equal(data[0]["aux_hidden_states"], here[0]["aux_hidden_states"])
    path = data.cache.path_for(data.manifest.shards[0])
    data.close()
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF  # in the states of the shard's last sample
    os.chmod(path, 0o644)
    path.write_bytes(bytes(raw))
    again = hs_dataset.open_dataset(url, cache_dir=cache, prefetch_shards=0)
    for i in range(again.manifest.shards[0].samples):
        assert torch.equal(again[i]["aux_hidden_states"], here[i]["aux_hidden_states"]), "SILENT: a flipped cached shard was served"
    assert path.read_bytes() == (local / again.manifest.shards[0].file).read_bytes()  # downloaded again
    again.close()


def test_a_cache_dir_that_is_a_file_is_one_line(published, home, tmp_path):
    url, _local, _store = published
    file = tmp_path / "not-a-dir"
    file.write_text("x")
    with pytest.raises(UsageError) as err:
        hs_dataset.open_dataset(url, cache_dir=file)
    assert "cache_dir is a file" in one_line(err.value)
    with pytest.raises(UsageError) as err:
        hs_dataset.open_dataset(url, cache_dir=file / "sub")
    assert "a part of its path is a file" in one_line(err.value)


def test_a_cache_of_an_older_version_is_refused_untouched(published, home, tmp_path):
    url, local, _store = published
    old = tmp_path / "old-cache"
    old.mkdir()
    (old / ".lock").touch()
    (old / f"blake3-{'a' * 64}.safetensors").write_bytes((local / "shard-000000.safetensors").read_bytes())
    before = tree(old)
    with pytest.raises(ForeignDatasetError) as err:
        hs_dataset.open_dataset(url, cache_dir=old)
    assert "older hs_dataset" in one_line(err.value)
    assert tree(old) == before, "LOST: an old cache was changed"


def test_the_stream_cache_refuses_a_built_dataset_of_the_same_card(home):
    from hs_dataset.streaming.cache import StreamCache

    victim = write_dataset(home / "built", 6)
    before = tree(home)
    cache = StreamCache(
        victim, 1 << 20, make_metadata(), final_norm_weight=torch.ones(16), storage="native", dtype=torch.bfloat16, card_name="unit-test"
    )
    with pytest.raises(ForeignDatasetError) as err:
        cache.open()
    assert "not a stream cache" in one_line(err.value)
    assert tree(home) == before, "LOST: the stream's cache evicted a built dataset's shards"


# ---------------------------------------------------------------- one destination rule for every scheme


def build_argv(out: str, stage: Path) -> list[str]:
    return [
        "build",
        "--config",
        "tiny-deepseek-hf",
        "--out",
        out,
        "--stage-dir",
        str(stage),
        "--num-samples",
        "2",
        "--device",
        "cpu",
        "--no-progress",
    ]


def test_build_out_file_url_refuses_a_directory_of_user_files(home, tmp_path, capsys):
    out = home / "project"
    out.mkdir()
    for name in ("shard-000000.safetensors", "run_report.json", "final_norm.safetensors"):
        (out / name).write_bytes(b"user data " + name.encode())
    before = tree(home)
    start = time.monotonic()
    assert cli_main(build_argv(f"file://{out}", tmp_path / "stage")) == 2
    assert "not empty and holds no hs_dataset manifest" in capsys.readouterr().err
    assert tree(home) == before, "LOST: build --out file:// overwrote a user's files"
    assert time.monotonic() - start < 60, "LOST: refused only after the capture"


def test_build_out_s3_refuses_another_tools_objects(s3_bucket, tmp_path, home, capsys):
    import s3fs

    fs = s3fs.S3FileSystem()
    prefix = f"{s3_bucket.removeprefix('s3://')}/proj"
    theirs = {f"{prefix}/{name}": b"another tool " + name.encode() for name in ("shard-000000.safetensors", "run_report.json")}
    for key, data in theirs.items():
        fs.pipe_file(key, data)
    assert cli_main(build_argv(f"s3://{prefix}", tmp_path / "stage")) == 2
    assert "not empty and holds no hs_dataset manifest" in capsys.readouterr().err
    fs.invalidate_cache()
    assert {key: fs.cat_file(key) for key in theirs} == theirs, "LOST: build --out s3:// overwrote another tool's objects"
    assert sorted(fs.find(prefix)) == sorted(theirs), "LOST: objects were added beside another tool's"


def test_build_out_a_missing_bucket_fails_before_any_capture(s3_server, tmp_path, home, capsys):
    start = time.monotonic()
    assert cli_main(build_argv("s3://no-such-bucket-r4/proj", tmp_path / "stage")) == 2
    assert "does not exist" in capsys.readouterr().err
    elapsed = time.monotonic() - start
    assert not (tmp_path / "stage" / MANIFEST_NAME).exists(), "LOST: the build captured before the bucket was checked"
    assert elapsed < 60, f"LOST: {elapsed:.0f} s before the refusal"


@pytest.mark.parametrize("url", ["s3://bucket", "s3://bucket/", "memory://bucket", "file:///"])
def test_a_bucket_root_is_refused(url):
    with pytest.raises(UsageError) as err:
        open_location(url)
    assert "not its root" in one_line(err.value), f"SILENT: {url} was accepted"


def test_load_dataset_with_a_url_work_dir_refuses_before_capture(tmp_path, home):
    start = time.monotonic()
    with pytest.raises(UsageError) as err:
        hs_dataset.load_dataset("tiny-deepseek-hf", work_dir="s3://bucket/work", num_samples=2, cache_dir=str(tmp_path / "hf"))
    assert "work_dir is a s3:// URL" in one_line(err.value)
    assert time.monotonic() - start < 30, "LOST: load_dataset captured before refusing the URL"
    assert_untouched(home, {".ssh": "dir", ".ssh/known_hosts": tree(home)[".ssh/known_hosts"]})


def test_a_remote_merge_refuses_an_object_it_would_overwrite(tmp_path):
    parts = []
    for rank in range(2):
        local = write_dataset(tmp_path / f"local{rank}", 2, first=10 * rank)
        parts.append(f"file://{tmp_path}/bucket/parts/rank{rank}")
        publish_dataset(local, open_location(parts[-1]))
    out = tmp_path / "bucket" / "merged"
    out.mkdir()
    (out / "final_norm.safetensors").write_bytes(b"another tool's file")
    before = tree(out)
    from hs_dataset.remote.merge import merge_remote

    with pytest.raises(ForeignDatasetError) as err:
        merge_remote(parts, f"file://{out}")
    assert "final_norm.safetensors: already exists" in one_line(err.value)
    assert tree(out) == before, "LOST: the merge overwrote another tool's object"


def test_a_prefix_claimed_by_another_build_is_refused(tmp_path):
    url = f"file://{tmp_path}/bucket/proj"
    first = write_dataset(tmp_path / "a", 2)
    second = write_dataset(tmp_path / "b", 2, first=20)
    claim = {"format": "hs_dataset-upload", "dataset_id": json.loads((first / MANIFEST_NAME).read_text())["dataset_id"]}
    (tmp_path / "bucket" / "proj").mkdir(parents=True)
    (tmp_path / "bucket" / "proj" / CLAIM_NAME).write_text(json.dumps(claim))  # the first build stopped after its claim
    before = tree(tmp_path / "bucket")
    with pytest.raises(ForeignDatasetError) as err:
        publish_dataset(second, open_location(url))
    assert "another build" in one_line(err.value)
    assert tree(tmp_path / "bucket") == before, "LOST: a build wrote into another build's prefix"
    publish_dataset(first, open_location(url))  # the build that claimed it finishes its upload
    assert open_location(url).require_manifest().num_samples == 2


@pytest.mark.parametrize(
    "claim",
    [
        "[" * 2000,  # nested past the parser's depth: a RecursionError
        '{"format": "hs_dataset-upload", "dataset_id": "a", "dataset_id": "b"}',  # two owners, one per parser
    ],
    ids=["nested 2000 deep", "dataset_id twice"],
)
def test_a_claim_hs_dataset_did_not_write_is_foreign_not_a_traceback(tmp_path, claim):
    url = f"file://{tmp_path}/bucket/proj"
    local = write_dataset(tmp_path / "a", 2)
    (tmp_path / "bucket" / "proj").mkdir(parents=True)
    (tmp_path / "bucket" / "proj" / CLAIM_NAME).write_text(claim)
    before = tree(tmp_path / "bucket")
    with pytest.raises(ForeignDatasetError) as err:
        publish_dataset(local, open_location(url))
    assert CLAIM_NAME in one_line(err.value), err.value
    assert tree(tmp_path / "bucket") == before, "LOST: a build wrote beside a claim it did not write"


def test_a_stage_of_another_dataset_is_refused_before_any_capture(published, tmp_path):
    from hs_dataset.remote.destination import staged_upload

    url, _local, store = published
    stage = write_dataset(tmp_path / "stage", 2, first=40)
    before = tree(store)
    options = RemoteOptions(cache_dir=tmp_path / "cache", stage_dir=stage)
    with pytest.raises(ForeignDatasetError) as err, staged_upload(url, options):
        raise AssertionError("LOST: the build body ran against another dataset's prefix")
    assert "already holds another dataset" in one_line(err.value)
    assert tree(store) == before, "LOST: the prefix of another dataset was changed"


# ---------------------------------------------------------------- follow


def follow_through_a_rebuild(tmp_path, second: Path) -> tuple[list[str], BaseException | None]:
    """Follow a 4-sample prefix; once it is read, delete it and publish ``second`` there. The ids yielded and the error."""
    import shutil

    from hs_dataset.remote.follow import follow_dataset

    url = f"file://{tmp_path}/bucket/ds"
    publish_dataset(write_dataset(tmp_path / "first", 4), open_location(url))
    seen: list[str] = []
    try:
        for row in follow_dataset(url, poll_s=0.05, idle_timeout_s=1.0, cache_dir=tmp_path / "cache"):
            seen.append(row["sample_id"])
            if len(seen) == 4:  # the first build was read: it is rebuilt in place
                shutil.rmtree(tmp_path / "bucket" / "ds")
                publish_dataset(second, open_location(url))
    except HsDatasetError as exc:
        return seen, exc
    return seen, None


def test_follow_refuses_a_prefix_rebuilt_under_the_same_shard_names(tmp_path):
    seen, error = follow_through_a_rebuild(tmp_path, write_dataset(tmp_path / "second", 4, first=30))
    assert seen == [f"s{i:02d}" for i in range(4)]
    assert isinstance(error, RebuiltDatasetError), f"SILENT: a rebuilt prefix was followed on: {seen}"
    text = one_line(error)
    assert f"file://{tmp_path}/bucket/ds/manifest.json: dataset_id is now" in text
    assert "start a new follow_dataset()" in text


def test_follow_never_yields_a_prefix_rebuilt_from_the_same_source_twice(tmp_path):
    """The same samples in other shard sizes: other hashes, so only the rebuild check stands between them and duplicates."""
    second = tmp_path / "second"
    with ShardWriter(second, make_metadata(), final_norm_weight=torch.ones(16), shard_bytes=30_000) as writer:
        for i in range(4):
            writer.add(make_sample(f"s{i:02d}", 30 + i))
    seen, error = follow_through_a_rebuild(tmp_path, second)
    assert len(seen) == len(set(seen)) == 4, f"DUPLICATES: {seen}"
    assert error is not None and "was rebuilt while followed" in one_line(error)


def test_follow_reads_a_url_given_twice_once(tmp_path, published):
    from hs_dataset.remote.follow import follow_dataset

    url, _local, _store = published
    urls = [url, url + "/", url + "//", url]
    seen = [row["sample_id"] for row in follow_dataset(urls, poll_s=0.05, idle_timeout_s=0.3, cache_dir=tmp_path / "cache")]
    assert sorted(seen) == [f"s{i:02d}" for i in range(8)], f"DUPLICATES: {seen}"


def test_a_planted_download_under_a_live_pid_is_not_waited_on_for_ever(tmp_path):
    """HANG: a `.hs-tmp-<live pid>-...` file in the cache that no writer holds locked is a leftover, whatever its mtime, not a download in progress."""
    import os
    import time as _time

    from hs_dataset.formats.atomic import TEMP_PREFIX
    from hs_dataset.remote.cache import ShardCache

    cache = ShardCache(tmp_path / "cache", max_bytes=1 << 20)
    for ahead in (-3600, 0, 86400):  # an hour old, fresh, a day ahead
        planted = cache.directory / f"{TEMP_PREFIX}{os.getppid()}-0000abcd-shard-000000.safetensors"
        planted.write_bytes(b"x" * 100)
        when = _time.time() + ahead
        os.utime(planted, (when, when))
        assert cache._remove_dead_temps("shard-000000.safetensors") is False
        assert not planted.exists()
