"""hs_dataset.hub (upload and download) against a local stand-in of the Hub's HTTP API (tests/fixtures/hub_standin.py).

The real ``huggingface_hub.HfApi`` (LFS upload path, Xet off) and the real
``datasets.load_dataset`` talk HTTP to a server on 127.0.0.1. Every other host is
refused at the socket level, so nothing here can reach the real Hub.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from hs_dataset.errors import IntegrityError
from hs_dataset.formats import ShardWriter
from hs_dataset.formats.hashing import sha256_file
from hs_dataset.formats.reader import open_dataset
from hs_dataset.hub.download import download_pushed, open_pushed
from hs_dataset.hub.upload import push_to_hub
from tests.fixtures.samples import make_metadata, make_sample

CONFIG = "tiny-deepseek-hf"
pytestmark = pytest.mark.filterwarnings("ignore:Use .content=<...>. to upload raw bytes:DeprecationWarning")


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_card, hf_backend):
    """A real build: 4 conversations through the tiny DeepseekV3, one sample per shard."""
    from hs_dataset.pipeline.build import build_dataset

    out = tmp_path_factory.mktemp("built") / CONFIG
    build_dataset(tiny_card, out, num_samples=4, backend=hf_backend, shard_bytes=60_000)
    assert len(open_dataset(out).manifest.shards) == 4
    return out


def _synthetic(root: Path, n: int = 6, config: str = "unit-test", seed: int = 0) -> Path:
    samples = [make_sample(f"{config}-{i}", 4 + 3 * i, seed=seed * 100 + i) for i in range(n)]
    with ShardWriter(root, make_metadata(config_name=config), final_norm_weight=torch.ones(16), shard_bytes=1_500) as writer:
        writer.add_many(samples)
    return root


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


# ---------------------------------------------------------------------------- the main path
def test_push_then_load_with_datasets_and_with_our_reader(built, standin, api, tmp_path):
    import datasets

    report = push_to_hub(built, "me/tiny", api=api, commit_files=2)
    local = open_dataset(built)
    manifest = local.manifest
    files = standin.files("me/tiny")
    # layout: index parquet, the dataset directory under hs_shards/, figures, card
    assert f"{CONFIG}/train-00000-of-00001.parquet" in files
    for record in manifest.shards:
        remote = files[f"{CONFIG}/hs_shards/{record.file}"]
        assert remote["lfs"] and remote["sha256"] == sha256_file(built / record.file)  # the LFS oid is the shard's sha256
    for name in ("manifest.json", "final_norm.safetensors", "run_report.json"):
        assert f"{CONFIG}/hs_shards/{name}" in files
    assert {f"{CONFIG}/figures/lengths.png", f"{CONFIG}/figures/layer_stats.png", "README.md"} <= set(files)
    # 4 shards + norm weight in commits of <= 2 files, then one commit with manifest, index, figures, card
    assert len(report.commits) == 4 and len(standin.commits) == 4
    assert all(len(c["added"]) <= 2 for c in standin.commits[:3])
    assert f"{CONFIG}/hs_shards/manifest.json" in standin.commits[-1]["added"]

    # 1. datasets, straight from the (stand-in) Hub: the index rows
    index = datasets.load_dataset("me/tiny", CONFIG, split="train", cache_dir=str(tmp_path / "ds-cache"))
    assert len(index) == manifest.num_samples
    by_id = {row["sample_id"]: row for row in index}
    for item in local:
        row = by_id[item["sample_id"]]
        assert row["input_ids"] == item["input_ids"].tolist()
        assert row["seq_len"] == item["input_ids"].shape[0]
        assert row["num_supervised"] == int(item["loss_mask"].sum())

    # 2. our reader: download, every hash checked, tensors attached to the index rows
    ds = open_pushed("me/tiny", CONFIG, api=api, local_dir=tmp_path / "download", cache_dir=tmp_path / "ds-cache2")
    assert len(ds) == len(local)
    for i in range(len(ds)):
        row = ds[i]
        item = local[local.sample_ids.index(row["sample_id"])]
        assert torch.equal(row["aux_hidden_states"], item["aux_hidden_states"])
        assert torch.equal(row["final_hidden_state"], item["final_hidden_state"])
        assert torch.equal(row["loss_mask"], item["loss_mask"])
    pushed = open_dataset(tmp_path / "download" / CONFIG / "hs_shards", verify_hashes=True)
    assert pushed.sample_ids == local.sample_ids
    assert torch.equal(pushed.final_norm()[0], local.final_norm()[0])

    # the downloaded folder is itself loadable by datasets (README configs) and by open_pushed
    assert len(datasets.load_dataset(str(tmp_path / "download"), CONFIG, split="train", cache_dir=str(tmp_path / "c3"))) == len(local)
    assert len(open_pushed(tmp_path / "download", cache_dir=tmp_path / "c4")) == len(local)

    # a shard corrupted after download is caught by the hash check
    shard = tmp_path / "download" / CONFIG / "hs_shards" / manifest.shards[2].file
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="blake3"):
        download_pushed(tmp_path / "download", CONFIG)


def test_card_states_the_facts_and_embeds_the_figures(built, standin, api):
    push_to_hub(built, "me/tiny", api=api)
    text = standin.read("me/tiny", "README.md").decode()
    meta = _front_matter(text)
    assert meta["configs"] == [{"config_name": CONFIG, "data_files": [{"split": "train", "path": f"{CONFIG}/train-*.parquet"}]}]
    assert meta["dataset_info"][0]["splits"][0]["num_examples"] == 4
    assert meta["license"] == "apache-2.0" and "eagle3" in meta["tags"]
    manifest = open_dataset(built).manifest
    md = manifest.metadata.to_json()
    facts = [
        "`builtin:tiny-deepseek-v3`",
        md["model"]["fingerprint"],  # model: id + fingerprint, never a local path
        "`[2, 3, 4]`",
        "output_hidden_states",
        "`hidden_states[0]` is the embedding output",  # layers + convention
        "`hidden_states[2]` = output of decoder layer 1",
        "**pre_norm**",
        str(md["final_norm"]["eps"]),
        md["final_norm"]["weight_sha256"],  # norm position + weight
        f"{manifest.num_tokens:,}",
        f"{manifest.num_bytes:,}",
        "| 4 |",  # token counts, bytes, samples
        "rows read",
        "samples written",  # run report
        f'datasets.load_dataset("me/tiny", "{CONFIG}", split="train")',
        "hs_dataset.open_dataset(",
        "open_pushed(",
        f"![lengths]({CONFIG}/figures/lengths.png)",
        f"![layer stats]({CONFIG}/figures/layer_stats.png)",
        "hidden_states[4]",
        "final (pre_norm)",  # per-layer statistics table
    ]
    for record in manifest.shards:
        facts.append(sha256_file(built / record.file))  # the LFS oid, though the manifest records BLAKE3
    missing = [f for f in facts if f not in text]
    assert not missing, missing
    for name in ("lengths.png", "layer_stats.png"):
        assert standin.read("me/tiny", f"{CONFIG}/figures/{name}")[:8] == b"\x89PNG\r\n\x1a\n"
    assert md["model"]["path"] not in text and "/root/" not in text
    assert meta["task_categories"] == ["text-generation"] and meta["size_categories"] == ["n<1K"]
    assert meta["source_datasets"] == ["original"]


def test_repo_rows_are_speculators_rows_and_no_local_path_leaves(tmp_path, standin, api):
    """The index parquet carries speculators' prepare-data columns; card and pushed manifest name the model, not a path."""
    import datasets

    from hs_dataset.config import load_card

    root = tmp_path / "kimi-k25-sglang"
    local_model = "/root/.cache/huggingface/hub/models--moonshotai--Kimi-K2.5/snapshots/abc"
    md = make_metadata(config_name="kimi-k25-sglang")
    md["model"] = {"path": local_model, "id": None, "revision": None, "fingerprint": "f" * 64}
    md["tokenizer"] = {"path": local_model, "fingerprint": "t" * 64}
    md["backend"] = {"name": "sglang", "server_args": ["--model-path", local_model]}
    with ShardWriter(root, md, final_norm_weight=torch.ones(16), shard_bytes=1_500) as writer:
        writer.add_many([make_sample(f"k-{i}", 5 + i) for i in range(3)])
    push_to_hub(root, "me/kimi", api=api, plots=False)

    index = datasets.load_dataset("me/kimi", "kimi-k25-sglang", split="train", cache_dir=str(tmp_path / "c"))
    assert {"input_ids", "loss_mask", "seq_len"} <= set(index.column_names)
    assert index.features["loss_mask"].feature.dtype == "int64"
    for row, item in zip(index, open_dataset(root)):
        assert row["loss_mask"] == item["loss_mask"].long().tolist() and row["seq_len"] == len(row["input_ids"])

    card_id = load_card("kimi-k25-sglang").model.id
    text = standin.read("me/kimi", "README.md").decode()
    pushed = json.loads(standin.read("me/kimi", "kimi-k25-sglang/hs_shards/manifest.json"))
    for where, blob in (("card", text), ("pushed manifest", json.dumps(pushed))):
        assert "/root/" not in blob and local_model not in blob, where
    assert pushed["metadata"]["model"] == {"id": card_id, "revision": None, "fingerprint": "f" * 64}
    assert pushed["metadata"]["backend"]["server_args"] == ["--model-path", card_id]
    # the copy names the model by the card's id, which is not part of the identity: the copy is the same dataset
    from hs_dataset.formats.identity import identity_fingerprint

    assert pushed["identity"] == identity_fingerprint(pushed["metadata"]) == open_dataset(root).manifest.identity
    assert json.loads((root / "manifest.json").read_text())["metadata"]["model"]["path"] == local_model  # local copy keeps it
    meta = _front_matter(text)
    assert meta["base_model"] == card_id and meta["task_categories"] == ["text-generation"]
    assert meta["size_categories"] == ["n<1K"] and meta["source_datasets"]
    assert meta["license"] == "other" and meta["license_name"] == "modified-mit"


def test_second_push_uploads_nothing(built, standin, api):
    push_to_hub(built, "me/tiny", api=api)
    commits, uploads, head = len(standin.commits), list(standin.lfs_uploads), standin.files("me/tiny")
    puts = sum(method == "PUT" for method, _ in standin.requests)
    report = push_to_hub(built, "me/tiny", api=api)
    assert report.uploaded == [] and report.commits == [] and report.deleted == []
    assert len(report.skipped) == len(head) - 1  # everything but .gitattributes
    assert len(standin.commits) == commits and standin.lfs_uploads == uploads
    assert standin.files("me/tiny") == head
    assert sum(method == "PUT" for method, _ in standin.requests) == puts


# ---------------------------------------------------------------------------- interruptions
@pytest.mark.parametrize("where", ["server-commit", "client"])
def test_interrupted_push_resumes(tmp_path, standin, api, monkeypatch, where):
    from huggingface_hub.errors import HfHubHTTPError

    root = _synthetic(tmp_path / "ds")
    manifest = open_dataset(root).manifest
    assert len(manifest.shards) >= 3
    if where == "server-commit":
        standin.fail_next("commit", after=1)  # the second commit fails with HTTP 500
        expected = HfHubHTTPError
    else:
        calls = {"n": 0}
        real = api.create_commit

        def flaky(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:  # batch 2 is uploaded (preupload_lfs_files), its commit never starts
                raise KeyboardInterrupt("injected: interrupted between upload and commit of batch 2")
            return real(*args, **kwargs)

        monkeypatch.setattr(api, "create_commit", flaky)
        expected = KeyboardInterrupt
    with pytest.raises(expected):
        push_to_hub(root, "me/resume", api=api, card=False, commit_files=1, plots=False)
    files = standin.files("me/resume")
    first = f"unit-test/hs_shards/{manifest.shards[0].file}"
    assert first in files and f"unit-test/hs_shards/{manifest.shards[1].file}" not in files
    assert "unit-test/hs_shards/manifest.json" not in files and "README.md" not in files  # nothing half-published
    uploaded_before = list(standin.lfs_uploads)

    if where == "client":
        monkeypatch.setattr(api, "create_commit", real)
    report = push_to_hub(root, "me/resume", api=api, card=False, commit_files=1, plots=False)
    assert first in report.skipped and first not in report.uploaded
    assert f"unit-test/hs_shards/{manifest.shards[1].file}" in report.uploaded
    # shard 1's bytes reached the Hub's LFS store before the interruption: not sent again
    assert standin.lfs_uploads.count(sha256_file(root / manifest.shards[1].file)) == 1
    assert len(standin.lfs_uploads) == len(set(standin.lfs_uploads))
    assert set(uploaded_before) <= set(standin.lfs_uploads)
    ds = open_pushed("me/resume", api=api, local_dir=tmp_path / "dl", cache_dir=tmp_path / "c")
    assert sorted(ds["sample_id"]) == sorted(open_dataset(root).sample_ids)


def test_corrupted_local_shard_is_never_committed(tmp_path, standin, api):
    root = _synthetic(tmp_path / "ds")
    shard = root / open_dataset(root).manifest.shards[1].file
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, different bytes
    shard.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="not published"):
        push_to_hub(root, "me/bad", api=api, card=False, commit_files=1, plots=False)
    assert f"unit-test/hs_shards/{shard.name}" not in standin.files("me/bad")


# ---------------------------------------------------------------------------- repos with history
def test_repush_replaces_stale_files_and_keeps_other_configs(tmp_path, standin, api):
    import datasets

    big = _synthetic(tmp_path / "a", n=8, config="alpha")
    push_to_hub(big, "me/multi", api=api, card=False, plots=False)
    small = _synthetic(tmp_path / "b", n=3, config="alpha", seed=1)  # a different dataset, fewer shards
    report = push_to_hub(small, "me/multi", api=api, card=False, plots=False)
    files = standin.files("me/multi")
    shards = sorted(p for p in files if p.startswith("alpha/hs_shards/shard-"))
    assert shards == sorted(f"alpha/hs_shards/{r.file}" for r in open_dataset(small).manifest.shards)
    assert report.deleted  # the old dataset's extra shards are gone, in the same commit as the new manifest
    other = _synthetic(tmp_path / "c", n=2, config="beta")
    push_to_hub(other, "me/multi", api=api, card=False, plots=False)
    text = standin.read("me/multi", "README.md").decode()
    meta = _front_matter(text)
    assert [c["config_name"] for c in meta["configs"]] == ["alpha", "beta"]
    assert "## Config `alpha`" in text and "## Config `beta`" in text
    cache = str(tmp_path / "cache")
    assert len(datasets.load_dataset("me/multi", "alpha", split="train", cache_dir=cache)) == 3
    assert len(datasets.load_dataset("me/multi", "beta", split="train", cache_dir=cache)) == 2


def test_push_to_a_branch_and_cli(tmp_path, standin, api):
    from hs_dataset.cli.main import main

    root = _synthetic(tmp_path / "ds", n=3)
    rc = main(
        ["push", str(root), "me/cli", "--endpoint", standin.url, "--revision", "v1", "--no-plots", "--no-card", "--config", "renamed"]
    )
    assert rc == 0
    assert "renamed/hs_shards/manifest.json" in standin.files("me/cli", revision="v1")
    assert "renamed/hs_shards/manifest.json" not in standin.files("me/cli", revision="main")
    manifest = json.loads(standin.read("me/cli", "renamed/hs_shards/manifest.json", revision="v1"))
    assert manifest == json.loads((root / "manifest.json").read_text())
    ds = open_pushed("me/cli", "renamed", api=api, revision="v1", local_dir=tmp_path / "dl", cache_dir=tmp_path / "c")
    assert len(ds) == 3 and ds[0]["aux_hidden_states"].shape[1:] == (3, 16)


# ---------------------------------------------------------------------------- the card that built the dataset
@pytest.fixture(scope="module")
def own_card(tmp_path_factory, tiny_card, hf_backend):
    """A card file of the user's own (not a shipped name) with Hub metadata, and a dataset built from it."""
    from hs_dataset.config import load_card
    from hs_dataset.pipeline.build import build_dataset

    raw = tiny_card.to_dict()
    raw["name"] = "my-tiny"
    raw["dataset_card"] = {**raw["dataset_card"], "license": "mit", "pretty_name": "My tiny states", "tags": ["mine", "tiny"]}
    where = tmp_path_factory.mktemp("own-card")
    path = where / "my-tiny.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    out = where / "my-tiny"
    build_dataset(load_card(path), out, num_samples=2, backend=hf_backend)
    return path, out


@pytest.mark.parametrize("given", ["path", "card"])
def test_a_card_given_by_path_keeps_its_metadata(own_card, standin, api, given):
    from hs_dataset.config import load_card

    path, out = own_card
    push_to_hub(out, "me/mine", api=api, card=path if given == "path" else load_card(path), plots=False)
    text = standin.read("me/mine", "README.md").decode()
    meta = _front_matter(text)
    assert meta["license"] == "mit" and meta["pretty_name"] == "My tiny states"
    assert meta["tags"][:2] == ["mine", "tiny"] and {"eagle3", "hs_dataset"} <= set(meta["tags"])
    assert "\n# My tiny states\n" in text and "## Config `my-tiny`" in text


def test_a_card_that_cannot_be_found_is_one_clear_error(own_card, standin, api):
    from hs_dataset.errors import UsageError

    _path, out = own_card
    with pytest.raises(UsageError, match=r"'my-tiny', which is not a card shipped with hs_dataset.*--card PATH.*--no-card"):
        push_to_hub(out, "me/mine", api=api, plots=False)
    with pytest.raises(UsageError, match=r"built by config 'my-tiny', but the card cards/tiny-deepseek-hf.yaml is 'tiny-deepseek-hf'"):
        push_to_hub(out, "me/mine", api=api, card="tiny-deepseek-hf", plots=False)
    assert standin.requests == [] and standin.commits == []  # refused before anything was sent


def test_upload_settings_are_checked_before_anything_runs(tmp_path):
    from hs_dataset.errors import UsageError
    from hs_dataset.hub.upload import PushOptions

    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['commit_file'\]"):
        push_to_hub(tmp_path, "me/x", commit_file=1)
    with pytest.raises(UsageError, match="commit_bytes and commit_files must be >= 1"):
        push_to_hub(tmp_path, "me/x", commit_bytes=0)
    with pytest.raises(UsageError, match="commit_files must be a whole number of files"):
        PushOptions(commit_files="3")
    assert PushOptions.of(PushOptions(commit_files=3), {"plots": False}) == PushOptions(commit_files=3, plots=False)


# ---------------------------------------------------------------------------- statistics and pictures
def test_stats_make_an_all_zero_capture_stand_out(tmp_path, capsys):
    from hs_dataset.cli.main import main
    from hs_dataset.formats.stats import compute_stats

    samples = [make_sample(f"s{i}", 5 + i) for i in range(6)]
    samples[2].aux_hidden_states[:, 1] = 0  # layer hidden_states[3] came back empty for one sample
    with ShardWriter(tmp_path / "ds", make_metadata(), shard_bytes=2_000) as writer:
        writer.add_many(samples)
    stats = compute_stats(tmp_path / "ds")
    assert [layer.name for layer in stats.layers] == ["hidden_states[2]", "hidden_states[3]", "hidden_states[4]", "final (pre_norm)"]
    assert stats.lengths == [5, 6, 7, 8, 9, 10] and stats.supervised == [int(s.loss_mask.sum()) for s in samples]
    assert [layer.zero_tokens for layer in stats.layers] == [0, 7, 0, 0]
    assert [layer.suspicious for layer in stats.layers] == [False, True, False, False]
    assert min(stats.layers[1].sample_rms) == 0.0 and min(stats.layers[0].sample_rms) > 0.5
    every = torch.cat([s.final_hidden_state.float() for s in samples])
    assert stats.layers[3].rms == pytest.approx(float(every.pow(2).mean().sqrt()), rel=1e-6)
    assert stats.layers[3].max_abs == pytest.approx(float(every.abs().max()))
    assert main(["info", str(tmp_path / "ds"), "--plots", str(tmp_path / "plots")]) == 0
    assert "layer_stats.png" in capsys.readouterr().out
    for name in ("lengths.png", "layer_stats.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("nth", [1, 3])
def test_sigkill_mid_push_then_resume(tmp_path, standin, api, python_env, nth):
    """kill -9 `hs-dataset push` after a batch is uploaded but before its commit; rerun; nothing half-published."""
    import signal
    import subprocess
    import sys

    root = _synthetic(tmp_path / "ds", n=8)
    manifest = open_dataset(root).manifest
    env = dict(
        python_env,
        HS_DATASET_CRASH_AT=f"push.before_commit:{nth}",
        HF_HUB_DISABLE_XET="1",
        HF_HUB_CACHE=str(tmp_path / "child-cache"),
        HF_HUB_OFFLINE="0",
    )
    cmd = [
        sys.executable,
        "-m",
        "hs_dataset.cli.main",
        "push",
        str(root),
        "me/killed",
        "--endpoint",
        standin.url,
        "--commit-files",
        "1",
        "--no-plots",
        "--no-card",
    ]
    assert subprocess.run(cmd, env=env).returncode == -signal.SIGKILL
    files = standin.files("me/killed")
    assert "README.md" not in files and "unit-test/hs_shards/manifest.json" not in files
    assert sum(f.startswith("unit-test/hs_shards/") for f in files) == nth - 1  # only committed batches are visible
    report = push_to_hub(root, "me/killed", api=api, card=False, commit_files=1, plots=False)
    assert len(report.skipped) >= nth - 1
    ds = open_pushed("me/killed", api=api, local_dir=tmp_path / "dl", cache_dir=tmp_path / "c")
    assert sorted(ds["sample_id"]) == sorted(open_dataset(root).sample_ids) and len(manifest.shards) >= 3
