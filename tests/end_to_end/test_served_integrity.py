"""Every read path checks what it serves; destinations are never followed through links; nothing is lost or leaked.

Round three of the untrusted-input table (issue 27, part B). Each case damages or
replaces what a reader serves -- a cached shard of the online stream, the ``datasets``
builder's work directory, a part's recorded identity -- or points a writing command at
someone else's files (a symlinked export/import destination, the user's own figures,
a refused cache directory), and checks that

* wrong data is never served (``SILENT:``): a damaged cached shard is captured again,
  a replaced work directory or an edited identity is refused naming the file;
* a user's file is never deleted or replaced, and no row is lost (``LOST:``);
* nothing outside the destination is written or deleted, and nothing pushed names a
  local path (``ESCAPE:``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from hs_dataset.errors import ForeignDatasetError, HsDatasetError, IntegrityError, UnsafePathError, UsageError
from hs_dataset.formats.manifest import Manifest
from hs_dataset.formats.merge import merge_datasets
from hs_dataset.formats.reader import open_dataset
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.interop.settings import ExportSettings
from tests.fixtures.fake_capture import FakeCaptureBackend
from tests.fixtures.samples import make_metadata, make_sample
from tests.fixtures.untrusted_dataset import SECRET, build, load_manifest, save_manifest, snapshot, split_header

K, H = 3, 16


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Someone else's directory beside the destination: a canary and a file that must keep their bytes."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_bytes(SECRET)
    (out / "hs_0.safetensors").write_bytes(SECRET)  # a name an export also writes
    return out


def untouched(root: Path, before: dict[str, bytes], tag: str) -> None:
    after = snapshot(root)
    assert after == before, f"{tag} {root}: {sorted(set(before) ^ set(after)) or 'contents changed'}"


# ============================================================================ 1. the stream's cache
def _stream(card, model_dir, cache: Path, backend=None, **kw):
    from hs_dataset import stream

    backend = backend or FakeCaptureBackend(model_dir)
    return stream(card, cache_dir=cache, max_cache_bytes=50_000_000, backend=backend, num_samples=6, shard_bytes=60_000, **kw), backend


def _epoch(ds) -> dict[str, dict]:
    return {item["sample_id"]: item for item in ds}


@pytest.fixture(scope="module")
def cached(tiny_model_dir, tiny_card, tmp_path_factory):
    """A stream cache of 6 samples in several shards, and the items its first epoch yielded."""
    cache = tmp_path_factory.mktemp("stream") / "cache"
    ds, _ = _stream(tiny_card, tiny_model_dir, cache)
    items = _epoch(ds)
    ds.close()
    assert len(Manifest.load(cache).shards) >= 2 and not verify_dataset(cache).problems
    return cache, items


def _copy_cache(cached, tmp_path: Path) -> Path:
    import shutil

    cache = tmp_path / "cache"
    shutil.copytree(cached[0], cache)
    return cache


def _data_start(path: Path) -> int:
    import struct

    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


def flip_at(where):
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        i = where(path, len(data))
        data[i] ^= 0xFF
        path.write_bytes(bytes(data))

    return damage


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-16])


def append(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\0")


def delete(path: Path) -> None:
    path.unlink()


def zero_states(path: Path) -> None:
    data = bytearray(path.read_bytes())
    start = _data_start(path)
    data[start : start + 256] = bytes(256)
    path.write_bytes(bytes(data))


STREAM_DAMAGE = [
    ("byte-in-first-tensor", flip_at(lambda p, n: _data_start(p) + 3)),
    ("byte-in-the-middle", flip_at(lambda p, n: (_data_start(p) + n) // 2)),
    ("last-byte", flip_at(lambda p, n: n - 1)),
    ("byte-in-header", flip_at(lambda p, n: 12)),
    ("exponent-byte", flip_at(lambda p, n: n - 2)),
    ("zeroed-block", zero_states),
    ("truncated", truncate),
    ("appended", append),
    ("deleted", delete),
]


@pytest.mark.parametrize("damage", [d for _, d in STREAM_DAMAGE], ids=[n for n, _ in STREAM_DAMAGE])
def test_a_damaged_cached_shard_is_captured_again_never_served(damage, cached, tiny_model_dir, tiny_card, tmp_path):
    cache = _copy_cache(cached, tmp_path)
    victim = Manifest.load(cache).shards[0]
    damage(cache / victim.file)
    ds, _backend = _stream(tiny_card, tiny_model_dir, cache)
    items = _epoch(ds)
    assert set(items) == set(cached[1]), f"LOST: {sorted(set(cached[1]) - set(items))}"
    for sid, item in items.items():
        for key in ("aux_hidden_states", "final_hidden_state", "input_ids"):
            assert torch.equal(item[key], cached[1][sid][key]), f"SILENT: {sid} {key} differs from what was captured"
    assert ds.stats.hits == 6 - victim.samples, f"SILENT: {ds.stats.hits} hits, the damaged shard's samples counted as hits"
    assert ds.stats.captured == victim.samples and [d["file"] for d in ds.stats.damaged_shards] == [victim.file]
    assert victim.file in ds.stats.damaged_shards[0]["reason"]
    assert not verify_dataset(cache).problems
    ds.close()


def test_a_shard_changed_between_epochs_of_one_stream_is_checked_again(cached, tiny_model_dir, tiny_card, tmp_path):
    cache = _copy_cache(cached, tmp_path)
    ds, _backend = _stream(tiny_card, tiny_model_dir, cache)
    assert len(_epoch(ds)) == 6 and ds.stats.hits == 6
    victim = Manifest.load(cache).shards[-1]
    flip_at(lambda p, n: n - 1)(cache / victim.file)
    items = _epoch(ds)
    assert ds.stats.hits == 6 - victim.samples, "SILENT: a shard changed after it was checked was served from its old check"
    for sid, item in items.items():
        assert torch.equal(item["final_hidden_state"], cached[1][sid]["final_hidden_state"]), f"SILENT: {sid}"
    ds.close()


def test_nan_states_under_a_rewritten_hash_are_refused(cached, tiny_model_dir, tiny_card, tmp_path):
    from tests.fixtures.damage import rewrite_shard

    cache = _copy_cache(cached, tmp_path)
    nan = torch.tensor([float("nan")], dtype=torch.float32).numpy().tobytes()

    def poison(data: bytes) -> bytes:  # the first float of the final states
        header, body = split_header(data)
        begin = len(data) - len(body) + header["final_hidden_state"]["data_offsets"][0]
        return data[:begin] + nan + data[begin + 4 :]

    rewrite_shard(cache, 0, poison)
    ds, _ = _stream(tiny_card, tiny_model_dir, cache)
    with pytest.raises(IntegrityError, match="NaN/inf") as info:
        _epoch(ds)
    assert Manifest.load(cache).shards[0].file in str(info.value)
    ds.close()


def test_a_symlinked_cached_shard_is_refused_by_name(cached, tiny_model_dir, tiny_card, tmp_path, outside):
    cache = _copy_cache(cached, tmp_path)
    name = Manifest.load(cache).shards[0].file
    (outside / "copy.safetensors").write_bytes((cache / name).read_bytes())
    (cache / name).unlink()
    os.symlink(outside / "copy.safetensors", cache / name)
    before = snapshot(outside)
    with pytest.raises(UnsafePathError, match="symbolic link") as info:
        _stream(tiny_card, tiny_model_dir, cache)
    assert name in str(info.value)
    untouched(outside, before, "ESCAPE:")


@pytest.mark.parametrize("kind", ["file", "link-to-file"])
def test_a_cache_dir_that_is_a_file_is_one_line(kind, tiny_model_dir, tiny_card, tmp_path, outside):
    path = tmp_path / "cache"
    if kind == "file":
        path.write_bytes(SECRET)
    else:
        os.symlink(outside / "secret.txt", path)
    with pytest.raises(UsageError, match="not a directory") as info:
        _stream(tiny_card, tiny_model_dir, path)
    assert "\n" not in str(info.value)
    assert (outside / "secret.txt").read_bytes() == SECRET and (kind != "file" or path.read_bytes() == SECRET), "LOST:"


def _user_files(kind: str, root: Path) -> None:
    root.mkdir()
    if kind == "temp-named-and-notes":
        (root / ".hs-tmp-1-ab-notes.txt").write_bytes(SECRET)
        (root / "notes.txt").write_bytes(SECRET)
    elif kind == "text-named-final-norm":
        (root / "final_norm.safetensors").write_bytes(SECRET)
    elif kind == "other-safetensors-named-final-norm":
        from safetensors.torch import save_file

        save_file({"my_weights": torch.ones(4)}, str(root / "final_norm.safetensors"))
    elif kind == "notes-and-our-norm":
        (root / "notes.txt").write_bytes(SECRET)
        from safetensors.torch import save_file

        from hs_dataset.formats.shard_layout import NORM_WEIGHT_KEY

        save_file({NORM_WEIGHT_KEY: torch.ones(4)}, str(root / "final_norm.safetensors"))
    elif kind == "user-lock-and-notes":
        (root / ".lock").write_bytes(SECRET)
        (root / "notes.txt").write_bytes(SECRET)


USER_DIRS = [
    "temp-named-and-notes",
    "text-named-final-norm",
    "other-safetensors-named-final-norm",
    "notes-and-our-norm",
    "user-lock-and-notes",
]


def _hidden_snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


@pytest.mark.parametrize("kind", USER_DIRS)
def test_a_refused_writer_keeps_every_user_file(kind, tmp_path):
    root = tmp_path / "mine"
    _user_files(kind, root)
    before = _hidden_snapshot(root)
    with pytest.raises(ForeignDatasetError, match="nothing in it was changed"):
        ShardWriter(root, make_metadata(K, H), final_norm_weight=torch.ones(H))
    assert _hidden_snapshot(root) == before, f"LOST: {sorted(set(before) ^ set(_hidden_snapshot(root)))}"


@pytest.mark.parametrize("kind", ["temp-named-and-notes", "text-named-final-norm"])
def test_a_refused_stream_keeps_every_user_file(kind, tiny_model_dir, tiny_card, tmp_path):
    root = tmp_path / "mine"
    _user_files(kind, root)
    before = _hidden_snapshot(root)
    with pytest.raises(ForeignDatasetError):
        _stream(tiny_card, tiny_model_dir, root)
    assert _hidden_snapshot(root) == before, "LOST: the refused stream changed the directory it refused"


def test_leftovers_of_our_own_crash_are_still_cleaned(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    with ShardWriter(tmp_path / "scratch", make_metadata(K, H), final_norm_weight=torch.ones(H)):
        pass
    (root / "final_norm.safetensors").write_bytes((tmp_path / "scratch" / "final_norm.safetensors").read_bytes())
    (root / ".hs-tmp-1-ab-shard-000000.safetensors").write_bytes(b"partial")
    with ShardWriter(root, make_metadata(K, H), final_norm_weight=torch.ones(H)) as w:
        w.add(make_sample("a", 4, K, H))
    assert open_dataset(root).sample_ids == ["a"] and not verify_dataset(root).problems


# ============================================================================ 2. the datasets builder's work directory
def _built(**kw):
    return {"dataset_id": "d" * 32, "identity": "i" * 64, "samples_considered": 5, **kw}


@pytest.mark.parametrize(
    "built, match",
    [
        (_built(dataset_id="e" * 32), "another build replaced it"),
        (_built(identity="j" * 64), "another build replaced it"),
        (_built(samples_considered=3), "asked for 3"),
        (_built(samples_considered=0), "asked for 0"),
    ],
    ids=["other-dataset-id", "other-identity", "more-rows-than-asked", "nothing-asked"],
)
def test_served_rows_must_be_the_ones_the_load_built(built, match, tmp_path):
    from hs_dataset.builder import _check_served

    manifest = Manifest(dataset_id="d" * 32, metadata={}, tensors={}, identity="i" * 64)
    manifest.shards = Manifest.load(build(tmp_path / "ds")).shards  # 5 samples
    with pytest.raises(IntegrityError, match=match):
        _check_served(manifest, built, str(tmp_path / "part"))
    _check_served(manifest, _built(), str(tmp_path / "part"))  # what it built, all of it: served


def test_load_dataset_refuses_a_work_dir_another_build_filled(tiny_card, hf_backend, tmp_path):
    import hs_dataset
    from hs_dataset.pipeline.build import build_dataset

    work = tmp_path / "work"
    build_dataset(tiny_card, work / "part-00000-of-00001", num_samples=6, backend=hf_backend)
    with pytest.raises(IntegrityError, match="holds 6 samples but this load asked for 3"):
        rows = hs_dataset.load_dataset("tiny-deepseek-hf", num_samples=3, cache_dir=str(tmp_path / "cache"), work_dir=str(work))
        pytest.fail(f"SILENT: {len(rows)} rows served for num_samples=3")
    rows = hs_dataset.load_dataset("tiny-deepseek-hf", num_samples=6, cache_dir=str(tmp_path / "cache6"), work_dir=str(work))
    assert len(rows) == 6, f"LOST: {len(rows)} rows of 6"


# ============================================================================ 3. identity recomputed from what the manifest claims
def _edit(path: str, value):
    def edit(md: dict) -> None:
        keys = path.split(".")
        target = md
        for key in keys[:-1]:
            target = target.setdefault(key, {})
        target[keys[-1]] = value

    return edit


# The fields that define the data (formats/identity.py); the card's name and fingerprint and the model's id are not
# among them since the identity was narrowed to what defines the data.
IDENTITY_EDITS = [
    ("aux_layer_ids", _edit("aux_layer_ids", [1, 5, 7])),
    ("aux_layer_ids-reordered", _edit("aux_layer_ids", [6, 4, 2])),
    ("model.fingerprint", _edit("model.fingerprint", "f" * 64)),
    ("final_state", _edit("final_state", "post_norm")),
    ("max_length", _edit("max_length", 7)),
    ("layer_convention", _edit("layer_convention", "sglang_layer_index")),
    ("dtype", _edit("dtype", "float16")),
    ("source.name", _edit("source.name", "other.jsonl")),
]


def _identity_damaged(root: Path, edit) -> None:
    raw = load_manifest(root)
    edit(raw["metadata"])
    save_manifest(root, raw)


@pytest.mark.parametrize("edit", [e for _, e in IDENTITY_EDITS], ids=[n for n, _ in IDENTITY_EDITS])
def test_an_edited_identity_field_fails_verify_and_open(edit, tmp_path):
    root = build(tmp_path / "ds")
    _identity_damaged(root, edit)
    problems = verify_dataset(root).problems
    assert problems, "SILENT: verify passed a manifest whose identity fields were edited"
    assert "manifest.json" in problems[0] and "identity" in problems[0]
    with pytest.raises(IntegrityError, match="field identity"):
        open_dataset(root)


@pytest.mark.parametrize("edit", [e for _, e in IDENTITY_EDITS[:5]], ids=[n for n, _ in IDENTITY_EDITS[:5]])
def test_merge_refuses_a_part_with_an_edited_identity_field(edit, tmp_path):
    a = build(tmp_path / "a", ids=("a0", "a1", "a2", "a3", "a4"))
    b = build(tmp_path / "b", ids=("b0", "b1", "b2", "b3", "b4"))
    _identity_damaged(b, edit)
    out = tmp_path / "merged"
    with pytest.raises(HsDatasetError, match="identity") as info:
        merge_datasets([a, b], out)
        pytest.fail("SILENT: merge published a part under the other parts' identity")
    assert str(b / "manifest.json") in str(info.value)
    assert not (out / "manifest.json").exists(), "SILENT: a merged manifest was published"


def test_a_forged_identity_value_is_refused(tmp_path):
    root = build(tmp_path / "ds")
    raw = load_manifest(root)
    raw["identity"] = "0" * 64
    save_manifest(root, raw)
    assert any("identity" in p for p in verify_dataset(root).problems), "SILENT:"


@pytest.mark.parametrize("key, value", [("model.path", "/elsewhere/model"), ("backend.name", "import"), ("tokenizer.path", "/x")])
def test_fields_outside_the_identity_may_change(key, value, tmp_path):
    root = build(tmp_path / "ds")
    _identity_damaged(root, _edit(key, value))
    assert verify_dataset(root).ok, "LOST: a dataset whose non-identity metadata changed no longer reads"


# ============================================================================ 4. export / import destinations
def _export(target: str):
    from hs_dataset.interop import export_specforge, export_speculators

    return {"speculators": export_speculators, "specforge": export_specforge}[target]


TARGETS = ["speculators", "specforge"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("src") / "ds")


@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "plain"])
@pytest.mark.parametrize("target", TARGETS)
def test_export_into_a_symlinked_destination_is_refused(target, overwrite, source, tmp_path, outside):
    from hs_dataset.interop import ExportError

    dest = tmp_path / "dest"
    os.symlink(outside, dest)
    before = snapshot(outside)
    with pytest.raises(ExportError, match="symbolic link"):
        _export(target)(source, dest, ExportSettings(overwrite=overwrite))
    untouched(outside, before, "ESCAPE:")


@pytest.mark.parametrize("target", TARGETS)
def test_export_into_a_link_to_an_empty_dir_writes_nothing_there(target, source, tmp_path):
    from hs_dataset.interop import ExportError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "dest")
    with pytest.raises(ExportError, match="symbolic link"):
        _export(target)(source, tmp_path / "dest")
    assert not list(elsewhere.iterdir()), "ESCAPE: files written through the destination's link"


@pytest.mark.parametrize(
    "target, inner",
    [("speculators", "hidden_states"), ("specforge", "rows_0-2000"), ("speculators", "token_freq.pt")],
    ids=["speculators-hidden-states-dir", "specforge-rows-dir", "speculators-file"],
)
@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "resume"])
def test_a_link_inside_an_earlier_export_is_never_followed(target, inner, overwrite, source, tmp_path, outside):
    from hs_dataset.interop import ExportError

    dest = tmp_path / "dest"
    _export(target)(source, dest)
    link_target = outside if inner != "token_freq.pt" else outside / "secret.txt"
    path = dest / inner
    if path.is_dir():
        import shutil

        shutil.rmtree(path)
    else:
        path.unlink()
    os.symlink(link_target, path)
    before = snapshot(outside)
    with pytest.raises(ExportError, match="symbolic link|no export wrote"):
        _export(target)(source, dest, ExportSettings(overwrite=overwrite))
    untouched(outside, before, "ESCAPE:")


@pytest.mark.parametrize("target", TARGETS)
def test_overwrite_keeps_a_user_file_beside_an_earlier_export(target, source, tmp_path):
    from hs_dataset.interop import ExportError

    dest = tmp_path / "dest"
    other = build(tmp_path / "other", ids=("o0", "o1", "o2", "o3", "o4"))
    _export(target)(other, dest)
    (dest / "notes.txt").write_bytes(SECRET)
    before = snapshot(dest)
    with pytest.raises(ExportError, match="no export wrote"):
        _export(target)(source, dest, ExportSettings(overwrite=True))
    untouched(dest, before, "LOST:")


@pytest.mark.parametrize("target", TARGETS)
def test_overwrite_refuses_a_directory_of_user_files(target, source, tmp_path):
    from hs_dataset.interop import ExportError

    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_bytes(SECRET)
    (dest / "hs_0.safetensors").write_bytes(SECRET)
    before = snapshot(dest)
    with pytest.raises(ExportError, match="deletes only an earlier hs_dataset export"):
        _export(target)(source, dest, ExportSettings(overwrite=True))
    untouched(dest, before, "LOST:")


@pytest.mark.parametrize("first, second", [("speculators", "specforge"), ("specforge", "speculators")])
def test_overwrite_replaces_an_earlier_export_of_ours(first, second, source, tmp_path):
    dest = tmp_path / "dest"
    other = build(tmp_path / "other", ids=("o0", "o1", "o2", "o3", "o4"))
    _export(first)(other, dest)
    _export(second)(source, dest, ExportSettings(overwrite=True))
    record = json.loads((dest / "hs_dataset_export.json").read_text())
    assert record["target"] == second and record["status"] == "complete"
    leftovers = {"speculators": "hidden_states", "specforge": "rows_0-2000"}[first]
    assert not (dest / leftovers).exists(), "SILENT: the earlier export's files were left beside the new one"


@pytest.fixture(scope="module")
def exported(source, tmp_path_factory) -> Path:
    from hs_dataset.interop import export_speculators

    dest = tmp_path_factory.mktemp("exp") / "spec"
    export_speculators(source, dest)
    return dest


@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "plain"])
def test_import_into_a_symlinked_destination_is_refused(overwrite, exported, tmp_path, outside):
    from hs_dataset.interop import ExportError, ImportSettings, import_speculators

    dest = tmp_path / "dest"
    os.symlink(outside, dest)
    before = snapshot(outside)
    with pytest.raises(ExportError, match="symbolic link"):
        import_speculators(exported, dest, ImportSettings(config="unit-test", overwrite=overwrite))
    untouched(outside, before, "ESCAPE:")


def test_import_overwrite_keeps_user_files(exported, tmp_path):
    from hs_dataset.interop import ExportError, ImportSettings, import_speculators

    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_bytes(SECRET)
    before = snapshot(dest)
    with pytest.raises(ExportError, match="deletes only an earlier hs_dataset export"):
        import_speculators(exported, dest, ImportSettings(config="unit-test", overwrite=True))
    untouched(dest, before, "LOST:")


def test_import_overwrite_replaces_an_earlier_export(exported, source, tmp_path):
    from hs_dataset.interop import ImportSettings, export_specforge, import_speculators

    dest = tmp_path / "dest"
    export_specforge(source, dest)
    report = import_speculators(exported, dest, ImportSettings(config="unit-test", overwrite=True))
    assert report.samples_written == 5 and verify_dataset(dest).ok and not (dest / "rows_0-2000").exists()


# ============================================================================ 5. info --plots
def _info_plots(ds: Path, out: Path, capsys) -> tuple[int, str]:
    from hs_dataset.cli.main import main

    code = main(["info", str(ds), "--plots", str(out)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("name", ["lengths.png", "layer_stats.png"])
def test_plots_never_replace_a_user_file(name, source, tmp_path, capsys):
    out = tmp_path / "figures"
    out.mkdir()
    (out / name).write_bytes(SECRET)
    code, err = _info_plots(source, out, capsys)
    assert code == 2 and "already exists" in err and err.count("\n") == 1
    assert (out / name).read_bytes() == SECRET, "LOST: the user's figure was replaced"
    assert sorted(p.name for p in out.iterdir()) == [name], "nothing else written either"


def test_plots_never_write_through_a_link_named_like_a_figure(source, tmp_path, outside, capsys):
    out = tmp_path / "figures"
    out.mkdir()
    os.symlink(outside / "secret.txt", out / "lengths.png")
    code, _err = _info_plots(source, out, capsys)
    assert code == 2 and (outside / "secret.txt").read_bytes() == SECRET, "ESCAPE: a figure written through a link"


def test_plots_into_a_fresh_dir_then_refused_the_second_time(source, tmp_path, capsys):
    out = tmp_path / "figures"
    code, _ = _info_plots(source, out, capsys)
    assert code == 0 and sorted(p.name for p in out.iterdir()) == ["layer_stats.png", "lengths.png"]
    first = snapshot(out)
    code, err = _info_plots(source, out, capsys)
    assert code == 2 and "already exists" in err
    untouched(out, first, "LOST:")


# ============================================================================ 6. nothing pushed names a local path
@pytest.mark.parametrize(
    "report, hidden",
    [
        ({"out_dir": "/home/me/data/out"}, "/home/me/data/out"),
        ({"out_dir": "out/rel", "source": {"issues": [{"reason": "row 3 of /home/me/rows.jsonl: bad"}]}}, "/home/me/rows.jsonl"),
        ({"notes": ["read ~/private/chats.jsonl"]}, "~/private"),
        ({"x": {"y": ["/srv/models/Kimi-K2.5/config.json"]}}, "/srv/models"),
    ],
    ids=["absolute-out-dir", "path-in-an-issue", "home-path", "nested-model-path"],
)
def test_public_run_report_names_no_local_path(report, hidden):
    from hs_dataset.hub.public import public_run_report

    text = public_run_report({"runs": [report]}, ["/home/me/data/out"]).decode()
    assert hidden not in text and "out_dir" not in text, f"ESCAPE: {text}"


def test_public_run_report_keeps_urls_and_counts():
    from hs_dataset.hub.public import public_run_report

    raw = {"runs": [{"samples_written": 7, "capture_failures": [{"reason": "http://10.0.0.1:30000/generate: timeout"}]}]}
    out = json.loads(public_run_report(raw, []))
    assert out == raw, "LOST: the scrub changed what is no path"


def test_a_push_carries_no_local_path(tiny_card, hf_backend, standin, api, tmp_path):
    from hs_dataset.hub.upload import push_to_hub
    from hs_dataset.pipeline.build import build_dataset

    out = tmp_path / "local-build-dir" / "tiny"
    build_dataset(tiny_card, out, num_samples=2, backend=hf_backend)
    assert str(out) in (out / "run_report.json").read_text()
    push_to_hub(out, "me/tiny", api=api, plots=False)
    pushed = standin.files("me/tiny")
    assert any(name.endswith("run_report.json") for name in pushed)
    leaks = [name for name in pushed if str(tmp_path).encode() in standin.read("me/tiny", name)]
    assert not leaks, f"ESCAPE: pushed files name the local path {tmp_path}: {leaks}"
    from hs_dataset.hub.download import open_pushed

    ds = open_pushed("me/tiny", "tiny-deepseek-hf", api=api, local_dir=tmp_path / "dl", cache_dir=tmp_path / "dl-cache")
    assert len(ds) == 2, "LOST: the pushed manifest no longer reads"


# ============================================================================ 7. one over-long row id
@pytest.mark.parametrize("length", [1025, 2000, 100_000])
def test_an_over_long_row_id_is_counted_and_skipped(length, tiny_card, hf_backend, tmp_path):
    from hs_dataset.pipeline.build import build_dataset
    from hs_dataset.sources import bundled_conversations_path

    rows = [json.loads(line) for line in Path(bundled_conversations_path()).read_text().splitlines()[:4]]
    rows[1]["id"] = "x" * length
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = build_dataset(tiny_card, tmp_path / "out", source=str(src), backend=hf_backend)
    assert report.samples_written == 3, f"LOST: {report.samples_written} of the 3 good rows kept"
    assert report.not_written() == {"malformed": 1}
    assert "characters" in report.source["issues"][0]["reason"] and len(report.source["issues"][0]["reason"]) < 300


def test_an_id_of_exactly_the_limit_is_kept(tiny_card, hf_backend, tmp_path):
    from hs_dataset.pipeline.build import build_dataset
    from hs_dataset.sources import bundled_conversations_path

    row = json.loads(Path(bundled_conversations_path()).read_text().splitlines()[0])
    row["id"] = "y" * 1024
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps(row) + "\n")
    report = build_dataset(tiny_card, tmp_path / "out", source=str(src), backend=hf_backend)
    assert report.samples_written == 1 and open_dataset(tmp_path / "out").sample_ids == ["y" * 1024], "LOST:"
