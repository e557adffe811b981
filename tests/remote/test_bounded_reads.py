"""Untrusted input: a store's answers are bounded in bytes and in time, and remote APIs check their arguments first.

Hostile stores are threads of this process on 127.0.0.1 (tests/fixtures/hostile_store.py:
a Range ignored, a body that never ends, an object longer than its record, a trickle of
a byte a second, Content-Range lies, an endpoint that accepts and never answers), read
as an ``http://`` dataset URL, or as ``s3://`` through s3fs pointed at the silent one.
Memory cases run the reader in a child process and assert its peak RSS growth
(tests/fixtures/child_memory.py's ``run_child``); time cases assert a bound. Tags
(tests/fixtures/tally.py): MEMORY, HANG, SILENT.
"""

from __future__ import annotations

import time

import pytest

import hs_dataset
from hs_dataset.cli.main import main as cli_main
from hs_dataset.errors import HsDatasetError, RemoteError, UsageError
from tests.fixtures.assertions import one_line
from tests.fixtures.child_memory import run_child
from tests.fixtures.hostile_store import HostileStore, SilentServer
from tests.fixtures.samples import write_small_dataset

GROWTH_MB = 300  # what one hostile store may add to a reader's resident memory
SHARD = "shard-000001.safetensors"


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> dict[str, bytes]:
    """A dataset's files (8 samples, 4 shards) as a store serves them."""
    local = tmp_path_factory.mktemp("served") / "ds"
    write_small_dataset(local)
    return {p.name: p.read_bytes() for p in local.iterdir() if p.is_file() and not p.name.startswith(".")}


MEMORY_CASES = {  # case -> (object, misbehaviour)
    "manifest ignoring Range (6 GB)": ("manifest.json", "huge"),
    "manifest never ending": ("manifest.json", "endless"),
    "shard 1.5 GB longer than its record": (SHARD, "longer"),
    "shard longer, no Content-Length": (SHARD, "longer_chunked"),
}
CACHE_BOUND = 1 << 20


@pytest.fixture(scope="module")
def memory_results(objects, tmp_path_factory) -> dict[str, dict]:
    """Every memory case read in one child interpreter, its peak RSS reset between cases (/proc/self/clear_refs).

    One child for all: each would otherwise pay the imports (torch) again. Per case: the
    error, the RSS growth over the resident size before it, and the cache's bytes on disk after.
    """
    root = tmp_path_factory.mktemp("memory")
    stores = {case: HostileStore(objects, {name: how}) for case, (name, how) in MEMORY_CASES.items()}
    urls = {case: store.url for case, store in stores.items()}
    code = f"""
import gc
import hs_dataset, torch, safetensors.torch, fsspec.implementations.http, hs_dataset.remote.dataset
from hs_dataset.errors import HsDatasetError
from hs_dataset.remote.cache import disk_usage
BASE = _rss('VmRSS:')  # after the imports a reader needs anyway (torch, the http client)
cases = {{}}
for case, url in {urls!r}.items():
    gc.collect()
    open('/proc/self/clear_refs', 'w').write('5')  # VmHWM := VmRSS
    before = _rss('VmRSS:')
    cache = {str(root)!r} + '/' + str(len(cases))
    try:
        data = hs_dataset.open_dataset(url, cache_dir=cache, max_cache_bytes={CACHE_BOUND}, prefetch_shards=0)
        error = None if sum(1 for _ in data) else "no samples"
    except HsDatasetError as exc:
        error = str(exc)
    cases[case] = {{"error": error, "growth_mb": _rss('VmHWM:') - before, "cache_bytes": disk_usage(cache)}}
RESULT = {{"cases": cases}}
"""
    for store in stores.values():
        store.__enter__()
    try:
        result, elapsed = run_child(code, timeout=240)
    finally:
        for store in stores.values():
            store.__exit__(None, None, None)
    assert elapsed < 120, f"HANG: {elapsed:.0f} s for the memory cases"
    return result["cases"]


# ---------------------------------------------------------------- memory: a response never exceeds what was asked


@pytest.mark.parametrize("case", list(MEMORY_CASES))
def test_a_store_answering_more_than_asked_is_cut(case, memory_results):
    result = memory_results[case]
    print(f"{case}: +{result['growth_mb']:.0f} MB, cache {result['cache_bytes']} bytes: {result['error']}")
    error = result["error"] or ""
    if MEMORY_CASES[case][0] == "manifest.json":
        assert "manifest.json: larger than 268435456 bytes" in error, result
    else:
        assert SHARD in error and ("9498 bytes moved, expected 9497" in error or "the manifest records 9497" in error), result
        assert result["cache_bytes"] <= CACHE_BOUND, f"MEMORY: the {CACHE_BOUND}-byte cache holds {result['cache_bytes']} bytes"
    assert result["growth_mb"] <= GROWTH_MB, f"MEMORY: +{result['growth_mb']:.0f} MB for a {case} (bound {GROWTH_MB} MB)"


def test_a_store_ignoring_range_on_a_ranged_read_is_refused(objects, tmp_path):
    """The packing sampler's offsets come from ranged reads; a 200 with the whole object is refused, not read."""
    with HostileStore(objects, {SHARD: "ignore_range"}) as store:
        data = hs_dataset.open_dataset(store.url, cache_dir=tmp_path / "cache")
        with pytest.raises(RemoteError) as err:
            data.shard_offsets(1)
        data.close()
    assert "ignored the Range" in one_line(err.value), "MEMORY: a whole object was read for a ranged read"


def test_a_store_answering_other_bytes_than_the_range_asked_is_refused(objects, tmp_path):
    with HostileStore(objects, {SHARD: "range_lies"}) as store:
        data = hs_dataset.open_dataset(store.url, cache_dir=tmp_path / "cache")
        with pytest.raises(RemoteError) as err:
            data.shard_offsets(1)
        data.close()
    assert "serves other bytes than asked" in one_line(err.value), "SILENT: bytes of another range were taken"


# ---------------------------------------------------------------- time: a total deadline per operation


def test_a_manifest_trickling_a_byte_a_second_fails_at_the_deadline(objects, tmp_path):
    with HostileStore(objects, {"manifest.json": "trickle"}) as store:
        start = time.monotonic()
        with pytest.raises(RemoteError) as err:
            hs_dataset.open_dataset(store.url, cache_dir=tmp_path / "cache", request_timeout_s=2)
        elapsed = time.monotonic() - start
    assert "did not finish answering within" in one_line(err.value)
    assert elapsed < 8, f"HANG: {elapsed:.1f} s for a 2 s request_timeout_s"


def test_a_shard_trickling_a_byte_a_second_fails_at_its_deadline(objects, tmp_path):
    size = len(objects[SHARD])
    with HostileStore(objects, {SHARD: "trickle"}) as store:
        data = hs_dataset.open_dataset(
            store.url, cache_dir=tmp_path / "cache", prefetch_shards=0, request_timeout_s=2, min_bytes_per_s=size
        )  # the deadline: 2 s + the shard at its size per second = 3 s
        start = time.monotonic()
        with pytest.raises(RemoteError) as err:
            data[data.manifest.shards[0].samples]  # the first sample of shard 1
        elapsed = time.monotonic() - start
        data.close()
    assert "did not finish answering within 3.0 s" in one_line(err.value)
    assert elapsed < 9, f"HANG: {elapsed:.1f} s for a 3 s deadline"


def test_verify_of_an_endpoint_that_never_answers_ends_at_the_deadline(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HS_DATASET_REQUEST_TIMEOUT_S", "2")
    monkeypatch.setenv("HS_DATASET_CACHE_DIR", str(tmp_path / "cache"))
    with SilentServer() as silent:
        start = time.monotonic()
        assert cli_main(["verify", f"{silent.endpoint}/ds"]) == 2
        elapsed = time.monotonic() - start
    assert "did not finish answering within 2.0 s" in capsys.readouterr().err
    assert elapsed < 15, f"HANG: verify held {elapsed:.0f} s"


@pytest.fixture
def fresh_s3fs():
    """s3fs keeps one client per set of arguments: one made for another endpoint (moto's) must not answer here, nor this one later."""
    s3fs = pytest.importorskip("s3fs")
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def test_verify_of_an_s3_endpoint_that_never_answers_ends_at_the_deadline(fresh_s3fs, tmp_path, monkeypatch, capsys):
    with SilentServer() as silent:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ENDPOINT_URL": silent.endpoint,
            "HS_DATASET_REQUEST_TIMEOUT_S": "2",
            "HS_DATASET_CACHE_DIR": str(tmp_path / "cache"),
        }.items():
            monkeypatch.setenv(key, value)
        start = time.monotonic()
        assert cli_main(["verify", "s3://bucket/ds"]) == 2
        elapsed = time.monotonic() - start
    assert "did not finish answering within 2.0 s" in capsys.readouterr().err
    assert elapsed < 15, f"HANG: verify held {elapsed:.0f} s (416 s before)"


def test_following_no_url_is_refused_at_once():
    from hs_dataset.remote.follow import follow_dataset

    start = time.monotonic()
    with pytest.raises(UsageError) as err:
        follow_dataset([])
    assert "non-empty list of URLs" in one_line(err.value)
    assert time.monotonic() - start < 5, "HANG"


# ---------------------------------------------------------------- arguments are checked before the first sample


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"poll_s": -1}, "poll_s: Input should be greater than 0"),
        ({"idle_timeout_s": "x"}, "idle_timeout_s: Input should be a valid number"),
        ({"cache_dir": "s3://bucket/cache"}, "cache_dir is a s3:// URL"),
        ({"prefetch_shards": -2}, "prefetch_shards"),
    ],
)
def test_follow_checks_its_arguments_before_the_first_sample(kwargs, match, objects, tmp_path):
    from hs_dataset.remote.follow import follow_dataset

    with HostileStore(objects) as store, pytest.raises(UsageError) as err:
        follow_dataset(store.url, **{"cache_dir": tmp_path / "cache", **kwargs})  # not iterated: refused at the call
    assert match in one_line(err.value)


def test_request_timeout_from_the_environment_is_checked(monkeypatch, objects, tmp_path):
    monkeypatch.setenv("HS_DATASET_REQUEST_TIMEOUT_S", "soon")
    with pytest.raises(HsDatasetError) as err:
        hs_dataset.open_dataset("http://127.0.0.1:9/ds", cache_dir=tmp_path / "cache")
    assert "HS_DATASET_REQUEST_TIMEOUT_S='soon'" in one_line(err.value)
