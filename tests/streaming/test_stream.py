"""Online capture into training with a bounded cache (``hs_dataset.stream``, ``formats/evict.py``).

Fast tests (default suite): eviction keeps a dataset valid; a stream over a stand-in
backend that fails mid-epoch raises one CaptureError, keeps its cache valid and resumes.

Real-server tests (``-m sglang``): the tiny DeepseekV3 served in float32 by the real CPU
SGLang server of tests/capture/sglang/test_server.py (its fixtures and reference forward are
reused), with a cache bound smaller than the data: states equal an independent
transformers forward, the bound holds after every item, a SIGKILLed stream resumes
without re-capturing what is cached, a large bound gives a second epoch with no request,
and bad bounds or a foreign cache directory are refused by name.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hs_dataset.errors import CaptureError, ForeignDatasetError, FormatError, UsageError
from hs_dataset.formats.evict import evict_shards
from hs_dataset.formats.manifest import Manifest
from hs_dataset.formats.reader import open_dataset
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.sample import CapturedSample, TokenizedSample
from tests.fixtures.fake_capture import FakeCaptureBackend
from tests.fixtures.paths import REPO
from tests.fixtures.samples import make_metadata, make_sample


def _disk_bytes(root: Path) -> int:
    return sum(p.lstat().st_size for p in Path(root).rglob("*") if p.is_file() and not p.is_symlink())


# ---------------------------------------------------------------------------- eviction (fast)
def test_evict_drops_shards_from_the_manifest_then_deletes_them(tmp_path):
    root = tmp_path / "ds"
    with ShardWriter(root, make_metadata(), shard_bytes=1) as w:  # one sample per shard
        for i in range(5):
            w.add(make_sample(f"s{i}", 7 + i))
    files = [r.file for r in Manifest.load(root).shards]
    assert len(files) == 5

    before = (root / "manifest.json").read_bytes()
    with pytest.raises(FormatError, match="not listed in shards"):
        evict_shards(root, [files[0], "shard-999999.safetensors"])
    assert (root / "manifest.json").read_bytes() == before and all((root / f).exists() for f in files)  # nothing changed

    removed = evict_shards(root, files[:2])
    assert [r.file for r in removed] == files[:2] and [r.samples for r in removed] == [1, 1]
    assert not (root / files[0]).exists() and not (root / files[1]).exists()
    result = verify_dataset(root)
    assert not result.problems, result.problems
    assert open_dataset(root).sample_ids == ["s2", "s3", "s4"]
    assert evict_shards(root, []) == []

    # a crash between the manifest rewrite and the unlink leaves a complete unlisted shard: a writer adopts it again
    keep = (root / files[2]).read_bytes()
    evict_shards(root, [files[2]])
    (root / files[2]).write_bytes(keep)
    with ShardWriter(root, make_metadata(), shard_bytes=1) as w:
        assert w.report.adopted_shards == [files[2]]
        assert w.add(make_sample("s0", 7))  # an evicted sample is no longer stored: it can come back
    assert sorted(open_dataset(root).sample_ids) == ["s0", "s2", "s3", "s4"]
    assert not verify_dataset(root).problems


# ---------------------------------------------------------------------------- a stand-in backend (fast)
def test_stream_capture_failure_is_one_error_and_the_cache_resumes(tiny_model_dir, tiny_card, tmp_path):
    from hs_dataset import stream

    cache = tmp_path / "cache"
    failing = FakeCaptureBackend(tiny_model_dir, fail_after=9)
    ds = stream(tiny_card, cache_dir=cache, max_cache_bytes=50_000_000, backend=failing, num_samples=20, shard_bytes=400_000)
    seen = []
    with pytest.raises(CaptureError, match=r"could not be captured .*stay valid: fix the server and iterate again"):
        for item in ds:
            seen.append(item["sample_id"])
    assert len(seen) == 9 and ds.stats.failed == 1
    assert not verify_dataset(cache).problems
    cached = set(open_dataset(cache).sample_ids)
    assert cached == set(seen)  # the pending samples were written before the error

    healthy = FakeCaptureBackend(tiny_model_dir)
    again = stream(tiny_card, cache_dir=cache, max_cache_bytes=50_000_000, backend=healthy, num_samples=20, shard_bytes=400_000)
    ids = [item["sample_id"] for item in again]
    assert len(ids) == 20 == len(set(ids))
    assert again.stats.hits == len(cached) and not set(healthy.captured_ids) & cached
    assert again.stats.captured == 20 - len(cached) == again.stats.requests
    assert not verify_dataset(cache).problems


class _RecapturingBackend(FakeCaptureBackend):
    """Other (still deterministic) states each time a sample is captured again, as a server after an update gives."""

    def capture_batch(self, samples):
        out = super().capture_batch(samples)
        again = sum(1 for sid in self.captured_ids[: -len(out) or None] if sid in {s.sample_id for s in samples})
        return [
            CapturedSample(r.sample_id, r.input_ids, r.loss_mask, r.aux_hidden_states + again, r.final_hidden_state + again) for r in out
        ]


def test_a_shard_name_reused_after_evicting_the_newest_is_read_anew(tiny_model_dir, tiny_card, tmp_path):
    """Evicting the newest shard frees its name for the next write; later epochs read the new shard's states."""
    from hs_dataset import stream

    cache = tmp_path / "cache"
    backend = _RecapturingBackend(tiny_model_dir)
    ds = stream(tiny_card, cache_dir=cache, max_cache_bytes=50_000_000, backend=backend, num_samples=4, shard_bytes=1)
    first = {item["sample_id"]: item for item in ds}
    newest = max(Manifest.load(cache).shards, key=lambda r: r.file)
    (last,) = open_dataset(cache).shard(Manifest.load(cache).shards.index(newest)).sample_ids
    evict_shards(cache, [newest.file])  # its name is the next one a writer takes

    second = {item["sample_id"]: item for item in ds}  # epoch 2 captures `last` again, with other states, into a shard of that name
    assert ds.stats.captured == 1 and ds.stats.hits == 3
    assert Manifest.load(cache).shards[-1].file == newest.file and Manifest.load(cache).shards[-1].blake3 != newest.blake3
    third = {item["sample_id"]: item for item in ds}  # epoch 3: every sample from the cache
    assert ds.stats.hits == 4
    assert not torch.equal(second[last]["aux_hidden_states"], first[last]["aux_hidden_states"])
    for key, value in second[last].items():  # what the re-created shard holds, not the evicted one
        assert torch.equal(third[last][key], value) if isinstance(value, torch.Tensor) else third[last][key] == value, key


def test_a_final_state_only_stream_serves_and_caches_the_final_state_alone(tiny_model_dir, tiny_card, hf_backend, tmp_path):
    """``layers.preset: mtp`` online: training rows carry an empty [T-1, 0, H] aux; the cache holds the final state of the capture with aux layers."""
    from hs_dataset import stream
    from hs_dataset.capture.base import CaptureTarget
    from hs_dataset.capture.hf import HFBackend
    from hs_dataset.config import HFBackendSection

    card = tiny_card.with_overrides(layers={"aux": None, "preset": "mtp"})
    backend = HFBackend(HFBackendSection(name="hf", device="cpu"), CaptureTarget(tiny_model_dir, (), dtype="float32"))
    try:
        ds = stream(card, cache_dir=tmp_path / "cache", max_cache_bytes=50_000_000, backend=backend, num_samples=5)
        first = {item["sample_id"]: item for item in ds}
        second = {item["sample_id"]: item for item in ds}  # from the cache
    finally:
        backend.close()
    assert len(first) == 5 and ds.stats.hits == 5
    for sid, item in first.items():  # the shifted training rows (training.shift_sample)
        assert item["aux_hidden_states"].shape == (item["input_ids"].shape[0], 0, 64)
        assert torch.equal(second[sid]["final_hidden_state"], item["final_hidden_state"])
    cached = open_dataset(tmp_path / "cache")
    assert cached.manifest.aux_layer_ids == [] and "aux_hidden_states" not in cached.manifest.tensors
    for stored in cached:
        (with_aux,) = hf_backend.capture_batch([TokenizedSample(stored["sample_id"], stored["input_ids"], stored["loss_mask"])])
        assert torch.allclose(stored["final_hidden_state"], with_aux.final_hidden_state, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- the real server
from tests.fixtures.sglang_server import hf_reference, rel, remove_dumps, staged_files  # noqa: E402  (the server fixtures come from conftest.py)

N = 24  # source samples (bundled conversations, ~180 tokens each, ~190 kB of float32 states)
SMALL = 2_500_000  # about half of the data


def _source_samples(card, tiny_model):
    """The source's samples, tokenized independently of the stream (to get every sample's full token ids)."""
    from hs_dataset.sources import SampleRules, bundled_conversations_path, load_samples

    samples, _ = load_samples(bundled_conversations_path(), tiny_model, SampleRules(max_length=card.max_length, overflow=card.overflow))
    return {s.sample_id: s for s in samples[:N]}


@pytest.mark.sglang
def test_stream_matches_transformers_and_stays_within_the_bound(card, capture_server, hf_model, tiny_model, tmp_path):
    from hs_dataset import stream

    source = _source_samples(card, tiny_model)
    t0 = time.monotonic()
    reference = {sid: hf_reference(hf_model, s.input_ids) for sid, s in source.items()}  # once per sample, outside the timed epochs
    print(f"independent transformers forward of {len(reference)} samples: {time.monotonic() - t0:.1f} s")
    cache = tmp_path / "cache"
    ds = stream(card, server=capture_server.url, cache_dir=cache, max_cache_bytes=SMALL, num_samples=N)
    try:
        worst = {"aux": 0.0, "final": 0.0}
        peak = 0
        for epoch in (1, 2):
            ids = []
            for item in ds:
                peak = max(peak, _disk_bytes(cache))
                assert peak <= SMALL, f"epoch {epoch}: cache holds {peak} bytes > {SMALL}"
                sid = item["sample_id"]
                ids.append(sid)
                full = source[sid].input_ids
                assert torch.equal(item["input_ids"], full[1:]) and torch.equal(item["loss_mask"], source[sid].loss_mask[1:])
                ref_aux, ref_final = reference[sid]
                assert item["aux_hidden_states"].dtype == torch.float32
                for k in range(3):
                    worst["aux"] = max(worst["aux"], rel(item["aux_hidden_states"][:, k], ref_aux[:-1, k]))
                worst["final"] = max(worst["final"], rel(item["final_hidden_state"], ref_final[1:]))
            assert sorted(ids) == sorted(source), f"epoch {epoch} yielded {len(ids)} samples"
            print(ds.stats.summary())
            assert ds.stats.requests == ds.stats.captured  # one request per capture, no retry
        first, second = ds.history
        assert first.hits == 0 and first.captured == N and first.evicted_shards > 0
        assert 0 < second.hit_rate < 1 and second.hits + second.captured == N  # the bound keeps part of the data
        assert second.hits == second.cached_at_start  # nothing cached at the start of the epoch was captured again
    finally:
        ds.close()
    print(f"worst relative error vs transformers: {worst}; peak cache {peak} of {SMALL} bytes")
    assert worst["aux"] < 1e-6 and worst["final"] < 1e-6, worst
    assert not verify_dataset(cache).problems


_CHILD = """
import sys
from hs_dataset import stream
from hs_dataset.config import load_card
ds = stream(load_card("tiny-deepseek-sglang"), server=sys.argv[1], cache_dir=sys.argv[2], max_cache_bytes=int(sys.argv[3]),
            num_samples=int(sys.argv[4]), batch_size=4)
for item in ds:
    print(item["sample_id"], flush=True)
print("done", flush=True)
"""


@pytest.mark.sglang
def test_killed_stream_resumes_without_capturing_what_is_cached(card, capture_server, tiny_model, tmp_path, python_env):
    from hs_dataset import stream

    cache = tmp_path / "cache"
    staged_before = set(staged_files(capture_server.staging_dir))
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, capture_server.url, str(cache), str(SMALL), str(N)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env,
        cwd=str(REPO),
    )
    yielded = []
    try:
        deadline = time.monotonic() + 120
        while len(yielded) < 15 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            yielded.append(line.strip())
        assert len(yielded) == 15, (yielded, proc.stderr.read() if proc.poll() is not None else "")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    yielded += proc.stdout.read().split()  # printed before the next item was asked for, so before it could be cached
    cached = set(open_dataset(cache).sample_ids)
    assert cached and cached <= set(yielded), (cached, yielded)
    assert _disk_bytes(cache) <= SMALL

    ds = stream(card, server=capture_server.url, cache_dir=cache, max_cache_bytes=SMALL, num_samples=N)
    try:
        ids = [item["sample_id"] for item in ds]
    finally:
        ds.close()
    stats = ds.stats
    print(f"killed after {len(yielded)} items with {len(cached)} cached; resumed: {stats.summary()}")
    assert "done" not in yielded
    assert sorted(ids) == sorted(_source_samples(card, tiny_model))
    assert stats.cached_at_start >= len(cached) and stats.hits == stats.cached_at_start
    assert stats.captured == N - stats.hits == stats.requests  # only the missing samples went to the server
    assert not verify_dataset(cache).problems and _disk_bytes(cache) <= SMALL
    # the killed consumer's requests in flight still wrote their dumps, which nobody will read (the server's sweeper
    # would expire them): removed here, so the tests after this one on the shared server see a clean staging dir
    orphans = set(staged_files(capture_server.staging_dir)) - staged_before
    remove_dumps(capture_server.staging_dir, [name.removesuffix(".safetensors") for name in orphans])


@pytest.mark.sglang
def test_a_bound_larger_than_the_data_serves_epoch_two_from_the_cache(card, capture_server, tmp_path):
    from hs_dataset import stream

    cache = tmp_path / "cache"
    ds = stream(card, server=[capture_server.url], cache_dir=cache, max_cache_bytes=10**9, num_samples=12)
    try:
        first = sorted(item["sample_id"] for item in ds)
        second = sorted(item["sample_id"] for item in ds)
    finally:
        ds.close()
    one, two = ds.history
    print(one.summary())
    print(two.summary())
    assert first == second and len(first) == 12
    assert one.captured == 12 and one.evicted_shards == 0
    assert two.hit_rate == 1.0 and two.captured == 0 and two.requests == 0
    assert len(open_dataset(cache)) == 12 and not verify_dataset(cache).problems


@pytest.mark.sglang
def test_bad_bounds_and_a_foreign_cache_are_refused_by_name(card, capture_server, tmp_path):
    from hs_dataset import stream

    with pytest.raises(UsageError, match=r"max_cache_bytes=1000 is smaller than the cache's own files .* raise max_cache_bytes"):
        stream(card, server=capture_server.url, cache_dir=tmp_path / "tiny", max_cache_bytes=1000)
    ds = stream(card, server=capture_server.url, cache_dir=tmp_path / "small", max_cache_bytes=40_000, num_samples=2)
    try:
        with pytest.raises(UsageError, match=r"max_cache_bytes=40000 cannot hold one sample: .* raise max_cache_bytes to at least \d+"):
            list(ds)
    finally:
        ds.close()
    assert _disk_bytes(tmp_path / "small") <= 40_000 and not verify_dataset(tmp_path / "small").problems
    with pytest.raises(UsageError, match="max_cache_bytes"):
        stream(card, server=capture_server.url, cache_dir=tmp_path / "zero", max_cache_bytes=0)

    foreign = tmp_path / "foreign"  # another card's data (config 'unit-test', hidden 16)
    with ShardWriter(foreign, make_metadata()) as w:
        w.add(make_sample("other-0", 9))
    before = {p.name: p.read_bytes() for p in foreign.iterdir() if p.is_file()}
    # the identity names each field that differs (the card's name is not part of it)
    with pytest.raises(
        ForeignDatasetError,
        match=r"(?s)another dataset than .*hidden_size: 16 \(stored\) vs 64 .*pass another cache_dir, or delete this one",
    ):
        stream(card, server=capture_server.url, cache_dir=foreign, max_cache_bytes=10**9)
    assert {p.name: p.read_bytes() for p in foreign.iterdir() if p.is_file()} == before  # untouched
