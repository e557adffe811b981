"""kill -9 the builder (and the exporters) again and again on ONE output directory; the end result
must be exactly what an uninterrupted run writes.

The builder runs the real command line, ``hs-dataset build --config tiny-deepseek-hf``,
in children forked from a warm interpreter (tests/_faults_forkserver.py: one import of
torch/transformers instead of one per kill), and the last resume of the chain is a
fresh ``python -m hs_dataset.cli.main build`` process. Kills come from every crash point of
:mod:`hs_dataset.faults` the build path reaches, at several counts, and from SIGKILLs
sent at random moments after the child started writing. After every kill the
directory must be crash-consistent (the manifest parses and every shard it lists is
complete: size and sha256), and at the end:

* same sample ids as the uninterrupted reference build, none twice;
* byte-identical tensors per sample (input_ids, loss_mask, aux and final states);
* ``verify`` passes (API and CLI); no temp file, rejected orphan or unlisted shard left.

The number of kills that really happened is printed and recorded (``record_property``).
``HS_DATASET_SOAK=1`` adds a longer randomized chain (marked ``slow``).

What the existing crash tests already cover is not repeated: single crash + resume of the
writer alone (tests/formats/test_crash_resume.py) and of a short build (tests/end_to_end/test_pipeline.py).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hs_dataset import open_dataset
from hs_dataset.faults import CRASH_POINTS
from hs_dataset.formats.atomic import TEMP_PREFIX
from hs_dataset.formats.hashing import file_digests
from hs_dataset.formats.manifest import Manifest
from hs_dataset.formats.verify import verify_dataset
from tests.fixtures.forkserver_client import ForkServer
from tests.fixtures.paths import REPO

SOAK = os.environ.get("HS_DATASET_SOAK", "") not in ("", "0")
COPIES = 6 if SOAK else 2  # the 42 bundled conversations, repeated under distinct ids: 84 samples (252 in soak mode)
SHARD_BYTES = 150_000  # ~1 sample per shard: many shard and manifest events per child
BATCH = 2
BUILD_POINTS = ("shard.mid_write", "shard.before_publish", "shard.after_publish", "manifest.mid_write", "pipeline.after_batch")
SAMPLE_KEYS = ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_state")

# One chain, in order, on one directory. "random" = SIGKILL at a random moment after the
# child started writing. Counts are per child process (each resumed child counts from 1).
CHAIN = [
    "pipeline.after_batch:1",  # fresh directory: the first batch is in the writer
    "shard.mid_write:1",
    "shard.before_publish:1",
    "shard.after_publish:1",  # leaves a complete shard the manifest does not list ...
    "manifest.mid_write:1",  # ... so this child's first manifest write is the adoption of that orphan
    "random",
    "manifest.mid_write:2",
    "shard.mid_write:2",
    "shard.after_publish:2",
    "pipeline.after_batch:3",
    "random",
    "shard.before_publish:3",
    "manifest.mid_write:4",
    "random",
    "shard.mid_write:4",
    "pipeline.after_batch:2",
    "shard.after_publish:4",
    "random",
    "shard.before_publish:2",
    "manifest.mid_write:6",
    "random",
    "pipeline.after_batch:5",
    "random",
]


def _soak_chain(seed: int, length: int = 80) -> list[str]:
    rng = random.Random(seed)
    chain = []
    for _ in range(length):
        if rng.random() < 0.3:
            chain.append("random")
        else:
            chain.append(f"{rng.choice(BUILD_POINTS)}:{rng.randint(1, 3)}")
    return chain


# ---------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def forkserver(tmp_path_factory):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("HS_DATASET_CRASH_AT", None)
    server = ForkServer(env, tmp_path_factory.mktemp("forkserver-logs"))
    print(f"fork server warm after {server.warmup_s:.1f} s")
    yield server
    server.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    from hs_dataset.sources import bundled_conversations_path

    rows = [json.loads(line) for line in bundled_conversations_path().read_text().splitlines() if line.strip()]
    path = tmp_path_factory.mktemp("source") / "chain.jsonl"
    with path.open("w") as f:
        for copy in range(COPIES):
            for row in rows:
                f.write(json.dumps({**row, "id": f"{row['id']}~{copy}"}) + "\n")
    return path


def build_argv(out: Path, source: Path) -> list[str]:
    return [
        "build",
        "--config",
        "tiny-deepseek-hf",
        "--out",
        str(out),
        "--source",
        str(source),
        "--batch-size",
        str(BATCH),
        "--shard-bytes",
        str(SHARD_BYTES),
        "--device",
        "cpu",
        "--no-progress",
    ]


@pytest.fixture(scope="module")
def reference(forkserver, source, tmp_path_factory) -> Path:
    """The uninterrupted build, made exactly like the chain's children."""
    out = tmp_path_factory.mktemp("reference") / "ds"
    result = forkserver.run(build_argv(out, source))
    assert result["returncode"] == 0 and result["killed_by"] is None, result
    assert verify_dataset(out).ok
    print(f"uninterrupted reference build: {result['elapsed_s']:.1f} s, {len(open_dataset(out))} samples")
    return out


def crash_consistent(root: Path) -> int:
    """At any instant after a kill: the manifest parses and every shard it lists is complete. Returns samples listed."""
    if not (root / "manifest.json").exists():
        return 0
    manifest = Manifest.load(root)
    ids: list[str] = []
    for record in manifest.shards:
        path = root / record.file
        assert path.is_file() and path.stat().st_size == record.bytes, f"{record.file} listed but missing or partial"
        with open(path, "rb") as f:
            assert file_digests(f, (record.hash_algorithm,))[record.hash_algorithm] == record.digest, f"{record.file} listed but corrupt"
        from hs_dataset.formats.shard_file import shard_sample_ids

        ids.extend(shard_sample_ids(path))
    assert len(ids) == len(set(ids)) == manifest.num_samples, "a sample is listed twice"
    return len(ids)


def leftovers(root: Path) -> list[str]:
    """Temp files, rejected orphans and shards the manifest does not list, anywhere under root."""
    listed = {s.file for s in Manifest.load(root).shards} if (root / "manifest.json").exists() else set()
    bad = []
    for dirpath, dirs, names in os.walk(root):
        for name in list(names) + list(dirs):
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if (
                name.startswith((TEMP_PREFIX, ".tmp-"))
                or name.endswith((".rejected", ".part"))
                or (dirpath == str(root) and name.startswith("shard-") and name not in listed)
            ):
                bad.append(rel)
    return sorted(bad)


def assert_same_content(reference: Path, other: Path) -> int:
    a, b = open_dataset(reference), open_dataset(other)
    ids_a, ids_b = a.sample_ids, b.sample_ids
    assert len(ids_b) == len(set(ids_b)), "a sample is stored twice"
    assert sorted(ids_a) == sorted(ids_b), set(ids_a) ^ set(ids_b)
    by_id = {item["sample_id"]: item for item in b}
    for item in a:
        got = by_id[item["sample_id"]]
        for key in SAMPLE_KEYS:
            x, y = item[key], got[key]
            assert x.dtype == y.dtype and x.shape == y.shape, (item["sample_id"], key)
            assert x.contiguous().view(torch.uint8).numpy().tobytes() == y.contiguous().view(torch.uint8).numpy().tobytes(), (
                item["sample_id"],
                key,
            )
    assert a.manifest.metadata == b.manifest.metadata or _same_metadata(a.manifest.metadata.to_json(), b.manifest.metadata.to_json())
    return len(ids_b)


def _same_metadata(x: dict, y: dict) -> bool:
    strip = lambda md: {k: v for k, v in md.items() if k != "final_norm"}  # noqa: E731
    return strip(x) == strip(y)


def run_chain(forkserver, argv: list[str], out: Path, chain: list[str], rng: random.Random, max_delay_s: float = 0.12) -> list[dict]:
    """Run the kill chain; every child must either be SIGKILLed or finish cleanly."""
    log = []
    for step, what in enumerate(chain):
        if what == "random":
            res = forkserver.run(argv, kill_after_progress={"dir": str(out), "delay_s": rng.uniform(0.0, max_delay_s)})
        else:
            res = forkserver.run(argv, crash=what)
        stored = crash_consistent(out)
        killed = res["returncode"] == -9
        log.append({"step": step, "fault": what, "killed": killed, "by": res["killed_by"], "stored_after": stored, "s": res["elapsed_s"]})
    return log


def summarize(log: list[dict], label: str) -> int:
    kills = [e for e in log if e["killed"]]
    print(f"\n{label}: {len(kills)} of {len(log)} children SIGKILLed")
    for e in log:
        print(
            f"  {e['step']:3d} {e['fault']:<24} {'KILLED by ' + e['by'] if e['killed'] else 'finished (point not reached)':<34} stored after: {e['stored_after']:4d}  {e['s']:.2f} s"
        )
    return len(kills)


# ---------------------------------------------------------------------------- the build chain
def _build_chain_test(forkserver, source, reference, tmp_path, record_property, chain, seed, min_kills):
    out = tmp_path / "chain"
    argv = build_argv(out, source)
    rng = random.Random(seed)
    t0 = time.monotonic()
    log = run_chain(forkserver, argv, out, chain, rng)
    kills = summarize(log, "build kill chain")
    # the last resume: a fresh process through the console entry point, no fork server
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("HS_DATASET_CRASH_AT", None)
    done = subprocess.run([sys.executable, "-m", "hs_dataset.cli.main", *argv], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    print(done.stdout)
    final = json.loads((out / "run_report.json").read_text())["runs"][-1]
    total = COPIES * 42
    assert final["samples_considered"] == total and final["skipped_existing"] + final["samples_written"] == total, final
    assert not final["capture_failures"] and not final["quarantined"] and not final["source"]["issues"], final

    result = verify_dataset(out)
    assert result.ok, result.problems
    from hs_dataset.cli.main import main as cli_main

    assert cli_main(["verify", str(out)]) == 0
    assert leftovers(out) == []
    assert assert_same_content(reference, out) == total
    kinds = {e["fault"].split(":")[0] for e in log if e["killed"]}
    distinct = len({e["fault"] for e in log if e["killed"] and e["fault"] != "random"}) + sum(
        1 for e in log if e["killed"] and e["fault"] == "random"
    )
    record_property("kills", kills)
    record_property("distinct_kill_points", distinct)
    record_property("kill_log", json.dumps(log))
    print(f"survived {kills} SIGKILLs ({distinct} distinct kill points) in {time.monotonic() - t0:.1f} s; 0 samples lost, 0 duplicated")
    assert set(BUILD_POINTS) <= kinds, f"crash points never reached: {set(BUILD_POINTS) - kinds}"
    assert kills >= min_kills, f"only {kills} kills happened"
    return kills


def test_build_survives_a_chain_of_sigkills_on_one_directory(forkserver, source, reference, tmp_path, record_property):
    _build_chain_test(forkserver, source, reference, tmp_path, record_property, CHAIN, seed=20260, min_kills=20)


@pytest.mark.slow
@pytest.mark.skipif(not SOAK, reason="soak mode: set HS_DATASET_SOAK=1")
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_soak_build_kill_chain(forkserver, source, reference, tmp_path, record_property, seed):
    chain = _soak_chain(seed)
    _build_chain_test(forkserver, source, reference, tmp_path, record_property, chain, seed=seed, min_kills=len(chain) // 2)


def test_build_crash_points_are_all_known():
    """The chain names only real crash points, and every build-path point is in it."""
    named = {c.split(":")[0] for c in CHAIN if c != "random"}
    assert named <= set(CRASH_POINTS)
    assert set(BUILD_POINTS) <= named
    # export chains below; push in tests/hub/test_upload_download.py and tests/hub/test_push_kills.py; regeneration in
    # tests/regenerate/test_regenerate_build.py and tests/regenerate/test_kill_resume.py; uploads in tests/remote/test_s3_build.py;
    # remote merges in tests/remote/test_merge_kills.py
    assert set(CRASH_POINTS) - set(BUILD_POINTS) == {
        "export.mid_file",
        "merge.after_copy",
        "merge.before_manifest",
        "push.before_commit",
        "push.before_last_commit",
        "regenerate.after_chunk",
        "regenerate.after_turn",
        "regenerate.mid_chunk",
        "remote.mid_upload",
        "remote.before_manifest",
    }


def test_kill_while_creating_the_first_manifest_then_resume(forkserver, source, tmp_path):
    out = tmp_path / "first"
    argv = build_argv(out, source) + ["--num-samples", "4"]
    res = forkserver.run(argv, crash="manifest.mid_write:1")
    assert res["returncode"] == -9
    res = forkserver.run(argv)
    assert res["returncode"] == 0, Path(res["log"]).read_text()[-2000:]
    assert verify_dataset(out).ok and len(open_dataset(out)) == 4


# ---------------------------------------------------------------------------- export chains
def _export_tree(dest: Path) -> dict:
    """Contents of an export, normalized: tensors for .ckpt/.pt/.safetensors, rows for the Arrow index."""
    tree: dict = {}
    for dirpath, _dirs, names in os.walk(dest):
        for name in names:
            path = Path(dirpath) / name
            rel = str(path.relative_to(dest))
            if name.endswith((".ckpt", ".pt")):
                tree[rel] = torch.load(path, weights_only=True, map_location="cpu")
            elif name.endswith(".safetensors"):
                from safetensors import safe_open

                with safe_open(str(path), "pt") as f:
                    tree[rel] = ({k: f.get_tensor(k) for k in f.keys()}, f.metadata())
            elif name == "hs_dataset_export.json":
                rec = json.loads(path.read_text())
                tree[rel] = {k: rec.get(k) for k in ("status", "target", "samples", "tokens", "resume_key", "layers")}
            elif name in ("state.json", "dataset_info.json") or name.endswith(".arrow"):
                continue  # compared as rows below (datasets writes a random fingerprint)
            else:
                tree[rel] = path.read_bytes()
    if (dest / "state.json").exists():
        import datasets

        tree["<arrow rows>"] = datasets.load_from_disk(str(dest)).with_format(None).to_dict()
    return tree


def _same(x, y, where="") -> None:
    if isinstance(x, torch.Tensor):
        assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y), where
    elif isinstance(x, dict):
        assert isinstance(y, dict) and set(x) == set(y), (where, set(x) ^ set(y) if isinstance(y, dict) else y)
        for k in x:
            _same(x[k], y[k], f"{where}/{k}")
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), where
        for i, (a, b) in enumerate(zip(x, y)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert x == y, where


# manifest.mid_write:1 of an export child is its export record (in_progress), :2 the record marked complete.
EXPORT_CHAINS = {
    "specforge": ["export.mid_file:1", "export.mid_file:4", "export.mid_file:9", "random", "manifest.mid_write:2"],
    "speculators": ["export.mid_file:2", "export.mid_file:5", "export.mid_file:11", "random", "manifest.mid_write:2"],
}


@pytest.mark.parametrize("target", sorted(EXPORT_CHAINS))
def test_export_survives_a_chain_of_sigkills(forkserver, reference, tmp_path, target, record_property):
    dest = tmp_path / f"{target}-chain"
    argv = ["export", target, str(reference), str(dest)]
    log = run_chain(forkserver, argv, dest, EXPORT_CHAINS[target], random.Random(7), max_delay_s=0.02)
    kills = summarize(log, f"{target} export kill chain")
    res = forkserver.run(argv)
    assert res["returncode"] == 0, Path(res["log"]).read_text()[-3000:]
    clean = tmp_path / f"{target}-clean"
    res = forkserver.run(["export", target, str(reference), str(clean)])
    assert res["returncode"] == 0, Path(res["log"]).read_text()[-3000:]
    assert leftovers(dest) == [], leftovers(dest)
    got, want = _export_tree(dest), _export_tree(clean)
    assert got.get("hs_dataset_export.json", {}).get("status") == "complete"
    _same(want, got, target)
    record_property("kills", kills)
    assert kills >= 4
    print(f"{target} export survived {kills} SIGKILLs; {len(want)} entries identical to an uninterrupted export")


def test_speculators_export_killed_while_moving_its_arrow_index(forkserver, reference, tmp_path):
    """No crash point marks the Arrow index write, so the child is killed right after save_to_disk into its staging dir."""
    dest = tmp_path / "spec"
    argv = ["export", "speculators", str(reference), str(dest)]
    res = forkserver.run(argv, kill_after_call="datasets.Dataset.save_to_disk")
    assert res["returncode"] == -9, res
    res = forkserver.run(argv)
    assert res["returncode"] == 0, Path(res["log"]).read_text()[-3000:]
    assert json.loads((dest / "hs_dataset_export.json").read_text())["status"] == "complete"
    import datasets

    assert len(datasets.load_from_disk(str(dest))) == len(open_dataset(reference))
    assert leftovers(dest) == [], f"left behind by the killed export: {leftovers(dest)}"


def test_push_and_merge_kill_points_are_exercised():
    """Push kill points run in tests/hub/ (they need the stand-in Hub fixture), remote merge ones in tests/remote/test_merge_kills.py."""
    hub_points = [p for p in CRASH_POINTS if p.startswith("push.")]
    assert hub_points == ["push.before_commit", "push.before_last_commit"]
    pushes = (REPO / "tests" / "hub" / "test_upload_download.py").read_text() + (REPO / "tests" / "hub" / "test_push_kills.py").read_text()
    assert all(point in pushes for point in hub_points)
    merges = (REPO / "tests" / "remote" / "test_merge_kills.py").read_text()
    assert all(point in merges for point in CRASH_POINTS if point.startswith("merge."))
