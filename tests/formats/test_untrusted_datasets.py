"""A dataset directory is untrusted input: hostile or damaged ones are refused, never followed.

Every row of ``HOSTILE`` builds a small valid dataset, damages it the way an attacker
(or a bad disk) would, then checks that

* ``verify`` reports a problem naming the file or field (never "verified"),
* reading everything (``open_dataset``, every sample, the norm weight) raises a
  clear :class:`HsDatasetError` subclass naming it, not a traceback of another type,
* nothing outside the dataset is read or written: a canary file beside it keeps its
  bytes and mtime, and its secret never shows up in any message.

Then the operations that write (merge, import/export ``--overwrite``, push) are tried
with hostile inputs, and valid datasets (native, fp8, prefixed, merged, reached
through a symlinked root) still verify and read back.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
import torch

from hs_dataset.errors import ForeignDatasetError, FormatError, HsDatasetError, IntegrityError, UnsafePathError, UnsupportedFormatError
from hs_dataset.formats import manifest as manifest_module
from hs_dataset.formats.merge import merge_datasets
from hs_dataset.formats.paths import check_member_name, resolve_member
from hs_dataset.formats.reader import open_dataset
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.interop.settings import ExportSettings
from tests.fixtures.damage import rewrite_shard
from tests.fixtures.samples import make_metadata
from tests.fixtures.untrusted_dataset import LENGTHS, SECRET, H, K, build, load_manifest, save_manifest, snapshot, split_header


# ---------------------------------------------------------------------------- building blocks
def edit_manifest(edit: Callable[[dict], None]) -> Callable:
    def damage(root: Path, outside: Path) -> None:
        raw = load_manifest(root)
        edit(raw)
        save_manifest(root, raw)

    return damage


def join_header(header: dict, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def edit_header(edit: Callable[[dict], None], index: int = 0) -> Callable:
    def damage(root: Path, outside: Path) -> None:
        def mutate(data: bytes) -> bytes:
            header, body = split_header(data)
            edit(header)
            return join_header(header, body)

        rewrite_shard(root, index, mutate)

    return damage


def set_scale(name: str, value: float) -> Callable:
    """Overwrite the first float32 scale of tensor ``name`` in shard 0 (an fp8 dataset)."""

    def damage(root: Path, outside: Path) -> None:
        def mutate(data: bytes) -> bytes:
            header, body = split_header(data)
            begin = header[name]["data_offsets"][0]
            return data[: len(data) - len(body)] + body[:begin] + struct.pack("<f", value) + body[begin + 4 :]

        rewrite_shard(root, 0, mutate)

    return damage


def outside_copy_of_shard(root: Path, outside: Path) -> str:
    """A byte-identical copy of shard 0 outside the dataset (what an escape would read as valid data)."""
    name = load_manifest(root)["shards"][0]["file"]
    copy = outside / "stolen.safetensors"
    copy.write_bytes((root / name).read_bytes())
    return str(copy)


def set_shard_file(value: Callable[[Path, Path], object]) -> Callable:
    def damage(root: Path, outside: Path) -> None:
        raw = load_manifest(root)
        raw["shards"][0]["file"] = value(root, outside)
        save_manifest(root, raw)

    return damage


def symlink_shard(root: Path, outside: Path) -> None:
    name = load_manifest(root)["shards"][0]["file"]
    target = outside_copy_of_shard(root, outside)
    (root / name).unlink()
    os.symlink(target, root / name)


def symlink_directory(root: Path, outside: Path) -> None:
    raw = load_manifest(root)
    name = raw["shards"][0]["file"]
    (outside / "dir").mkdir()
    os.replace(root / name, outside / "dir" / name)
    os.symlink(outside / "dir", root / "sub")
    raw["shards"][0]["file"] = f"sub/{name}"
    save_manifest(root, raw)


def symlink_norm_to_canary(root: Path, outside: Path) -> None:
    raw = load_manifest(root)
    raw["metadata"]["final_norm"].pop("weight_sha256")
    save_manifest(root, raw)
    (root / "final_norm.safetensors").unlink()
    os.symlink(outside / "secret.txt", root / "final_norm.safetensors")


def symlink_manifest(root: Path, outside: Path) -> None:
    (outside / "manifest.json").write_bytes((root / "manifest.json").read_bytes())
    (root / "manifest.json").unlink()
    os.symlink(outside / "manifest.json", root / "manifest.json")


def fifo_shard(root: Path, outside: Path) -> None:
    name = load_manifest(root)["shards"][0]["file"]
    (root / name).unlink()
    os.mkfifo(root / name)


def directory_shard(root: Path, outside: Path) -> None:
    name = load_manifest(root)["shards"][0]["file"]
    (root / name).unlink()
    (root / name).mkdir()


def norm_weight(tensor: torch.Tensor) -> Callable:
    """Replace the norm weight with ``tensor`` and record its hash (so only the content is wrong)."""

    def damage(root: Path, outside: Path) -> None:
        from safetensors.torch import save_file

        save_file({"weight": tensor}, str(root / "final_norm.safetensors"))
        raw = load_manifest(root)
        raw["metadata"]["final_norm"]["weight_sha256"] = hashlib.sha256((root / "final_norm.safetensors").read_bytes()).hexdigest()
        save_manifest(root, raw)

    return damage


def header_length(value: int) -> Callable:
    def damage(root: Path, outside: Path) -> None:
        rewrite_shard(root, 0, lambda data: struct.pack("<Q", value) + data[8:])

    return damage


def overlap(header: dict) -> None:
    """final_hidden_state reads the aux bytes: same length, shifted onto them (the file size is unchanged)."""
    aux_begin = header["aux_hidden_states"]["data_offsets"][0]
    begin, end = header["final_hidden_state"]["data_offsets"]
    header["final_hidden_state"]["data_offsets"] = [aux_begin, aux_begin + end - begin]


def negative_dims(header: dict) -> None:
    t, k, h = header["aux_hidden_states"]["shape"]
    header["aux_hidden_states"]["shape"] = [-t, -k, h]  # same element count: only the signs are wrong


def huge_manifest(root: Path, outside: Path) -> None:
    raw = load_manifest(root)
    raw["padding"] = " " * (2 * 1024 * 1024)
    save_manifest(root, raw)


def deep_manifest(root: Path, outside: Path) -> None:
    (root / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)


def decreasing_offsets(root: Path, outside: Path) -> None:
    def mutate(data: bytes) -> bytes:
        header, body = split_header(data)
        begin = header["sample_offsets"]["data_offsets"][0]
        return data[: len(data) - len(body)] + body[: begin + 8] + struct.pack("<q", 10**6) + body[begin + 16 :]

    rewrite_shard(root, 0, mutate)


# (id, storage, damage, regex that the verify problem and the reader's error must both match)
HOSTILE: list[tuple[str, str, Callable, str]] = [
    # ---- escapes: names that leave the directory
    ("shard-dotdot", "native", set_shard_file(lambda r, o: "../outside/stolen.safetensors"), r"shards\[0\]\.file"),
    ("shard-absolute", "native", set_shard_file(outside_copy_of_shard), r"shards\[0\]\.file"),
    ("shard-symlink", "native", symlink_shard, r"shards\[0\]\.file.*symbolic link"),
    ("shard-in-symlinked-dir", "native", symlink_directory, r"shards\[0\]\.file.*symbolic link"),
    ("shard-backslash", "native", set_shard_file(lambda r, o: "..\\outside\\stolen.safetensors"), r"shards\[0\]\.file.*backslash"),
    ("shard-nul", "native", set_shard_file(lambda r, o: "shard-000000.safetensors\x00.txt"), r"shards\[0\]\.file"),
    ("shard-empty-name", "native", set_shard_file(lambda r, o: ""), r"shards\[0\]\.file.*empty"),
    ("shard-dot-component", "native", set_shard_file(lambda r, o: "./shard-000000.safetensors"), r"shards\[0\]\.file"),
    ("shard-hidden-name", "native", set_shard_file(lambda r, o: ".lock"), r"shards\[0\]\.file"),
    ("shard-long-name", "native", set_shard_file(lambda r, o: "a" * 5000), r"shards\[0\]\.file.*longer"),
    ("shard-deep-name", "native", set_shard_file(lambda r, o: "a/" * 20 + "x.safetensors"), r"shards\[0\]\.file.*deeper"),
    ("shard-name-not-string", "native", set_shard_file(lambda r, o: ["../x"]), r"shards\[0\]\.file"),
    (
        "norm-dotdot",
        "native",
        edit_manifest(lambda m: m["metadata"]["final_norm"].update(weight_file="../outside/secret.txt")),
        r"final_norm\.weight_file",
    ),
    (
        "norm-absolute",
        "native",
        lambda r, o: edit_manifest(lambda m: m["metadata"]["final_norm"].update(weight_file=str(o / "secret.txt")))(r, o),
        r"final_norm\.weight_file",
    ),
    ("norm-symlink-no-hash", "native", symlink_norm_to_canary, r"final_norm\.weight_file.*symbolic link"),
    ("manifest-symlink", "native", symlink_manifest, r"manifest.*symbolic link"),
    ("shard-fifo", "native", fifo_shard, r"not a regular file"),
    ("shard-directory", "native", directory_shard, r"not a regular file"),
    # ---- shard headers: bytes that would be misread
    ("tensors-overlap", "native", edit_header(overlap), r"overlap.*final_hidden_state|final_hidden_state.*overlap"),
    ("trailing-bytes", "native", lambda r, o: rewrite_shard(r, 0, lambda d: d + b"\0" * 64), r"tensors cover"),
    ("truncated-shard", "native", lambda r, o: rewrite_shard(r, 0, lambda d: d[:-10]), r"tensors cover|needs|outside"),
    ("header-length-gigabytes", "native", header_length(8 * 1024**3), r"header length"),
    ("header-length-2^63", "native", header_length(2**63), r"header length"),
    (
        "absurd-shape",
        "native",
        edit_header(lambda h: h["aux_hidden_states"].update(shape=[10**18, 10**18, 16])),
        r"aux_hidden_states.*needs",
    ),
    ("negative-dims", "native", edit_header(negative_dims), r"aux_hidden_states.*non-negative"),
    (
        "float-dims",
        "native",
        edit_header(lambda h: h["loss_mask"].update(shape=[float(h["loss_mask"]["shape"][0])])),
        r"loss_mask.*non-negative",
    ),
    ("unknown-dtype", "native", edit_header(lambda h: h["loss_mask"].update(dtype="F4_MAGIC")), r"F4_MAGIC"),
    ("duplicate-header-key", "native", lambda r, o: rewrite_shard(r, 0, lambda d: _duplicate_key(d)), r"appears twice"),
    ("header-not-object", "native", lambda r, o: rewrite_shard(r, 0, lambda d: join_header([], b"")), r"not a JSON object"),  # type: ignore[arg-type]
    ("metadata-not-strings", "native", edit_header(lambda h: h["__metadata__"].update(shard_seq=3)), r"__metadata__"),
    ("offsets-decreasing", "native", decreasing_offsets, r"sample_offsets|offsets"),
    # ---- fp8 scales: finite data that decodes to inf/NaN/0
    ("fp8-scale-inf", "fp8", set_scale("final_hidden_state.scale", float("inf")), r"final_hidden_state\.scale inf"),
    ("fp8-scale-nan", "fp8", set_scale("final_hidden_state.scale", float("nan")), r"final_hidden_state\.scale nan"),
    ("fp8-scale-zero", "fp8", set_scale("aux_hidden_states.scale", 0.0), r"aux_hidden_states\.scale 0\.0"),
    ("fp8-scale-negative", "fp8", set_scale("aux_hidden_states.scale", -1.0), r"aux_hidden_states\.scale -1\.0"),
    ("fp8-scale-overflows", "fp8", set_scale("final_hidden_state.scale", 1e38), r"final_hidden_state\.scale"),
    # ---- manifest fields
    ("sha256-not-hex", "native", edit_manifest(lambda m: m["shards"][0].update(sha256="../../etc")), r"shards\[0\]\.sha256"),
    ("bytes-negative", "native", edit_manifest(lambda m: m["shards"][0].update(bytes=-1)), r"shards\[0\]"),
    ("samples-float", "native", edit_manifest(lambda m: m["shards"][0].update(samples=1.5)), r"shards\[0\]"),
    ("shard-entry-not-object", "native", edit_manifest(lambda m: m["shards"].append("x")), r"shards\[\d\] is a str"),
    ("shard-listed-twice", "native", edit_manifest(lambda m: m["shards"].append(dict(m["shards"][0]))), r"listed twice"),
    ("hidden-size-string", "native", edit_manifest(lambda m: m["metadata"].update(hidden_size="16")), r"hidden_size"),
    ("aux-ids-not-ints", "native", edit_manifest(lambda m: m["metadata"].update(aux_layer_ids="abc")), r"aux_layer_ids"),
    ("tensor-entry-broken", "native", edit_manifest(lambda m: m["tensors"].update(loss_mask=[])), r"tensors\.loss_mask"),
    ("tensor-entry-missing", "native", edit_manifest(lambda m: m["tensors"].pop("final_hidden_state")), r"tensors\.final_hidden_state"),
    ("states-two-encodings", "native", edit_manifest(lambda m: m["tensors"]["final_hidden_state"].update(encoding="f16")), r"final state"),
    ("final-norm-not-object", "native", edit_manifest(lambda m: m["metadata"].update(final_norm="x")), r"final_norm"),
    ("quarantine-broken", "native", edit_manifest(lambda m: m.update(quarantine=[1])), r"quarantine\[0\]"),
    ("manifest-huge", "native", huge_manifest, r"larger than"),
    ("manifest-deeply-nested", "native", deep_manifest, r"not valid JSON|nested too deeply"),
    # ---- norm weight content
    ("norm-wrong-shape", "native", norm_weight(torch.ones(H + 1)), r"norm weight has shape"),
    ("norm-nan", "native", norm_weight(torch.full((H,), float("nan"))), r"NaN/inf"),
]


def _duplicate_key(data: bytes) -> bytes:
    header, body = split_header(data)
    text = json.dumps(header)
    extra = '"final_hidden_state": ' + json.dumps(header["aux_hidden_states"]) + ", "
    text = "{" + extra + text[1:]
    raw = text.encode() + b" " * (-len(text.encode()) % 8)
    return struct.pack("<Q", len(raw)) + raw + body


def read_everything(root: Path) -> None:
    ds = open_dataset(root)
    for _ in ds:
        pass
    if "weight_file" in (ds.manifest.metadata.to_json().get("final_norm") or {}):
        ds.final_norm()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the dataset with a canary the dataset must never reach."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_bytes(SECRET)
    return out


def canary_state(outside: Path) -> tuple[bytes, int]:
    st = os.stat(outside / "secret.txt")
    return (outside / "secret.txt").read_bytes(), st.st_mtime_ns


@pytest.mark.parametrize("name, storage, damage, match", HOSTILE, ids=[row[0] for row in HOSTILE])
def test_hostile_dataset_is_refused(name, storage, damage, match, tmp_path, outside, monkeypatch):
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", 1024 * 1024)
    root = build(tmp_path / "ds", storage=storage)
    before = canary_state(outside)
    damage(root, outside)

    result = verify_dataset(root)
    assert not result.ok, f"{name}: verify said {result.summary()}"
    assert any(re.search(match, p, re.S) for p in result.problems), result.problems
    with pytest.raises(HsDatasetError, match=match) as caught:
        read_everything(root)

    messages = " ".join(result.problems) + str(caught.value)
    assert SECRET.decode().strip() not in messages, f"ESCAPE: {name} leaked the canary into a message"
    assert canary_state(outside) == before, f"ESCAPE: {name} touched a file outside the dataset"


# ---------------------------------------------------------------------------- the resolver itself
@pytest.mark.parametrize(
    "name",
    [
        "shard-000000.safetensors",
        "rank3-shard-000001.safetensors",
        "part-00002/shard-000000.safetensors",
        "final_norm.safetensors",
        "a_b.c-d",
    ],
)
def test_plain_names_are_accepted(name):
    assert check_member_name(name, what="f", where="m") == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "../x",
        "a/../b",
        "/etc/passwd",
        "a//b",
        "a/",
        "./a",
        ".hidden",
        "-rf",
        "a\\b",
        "a\x00b",
        "a b",
        "é.safetensors",
        "a" * 300,
        "x/" * 9 + "y",
        None,
        3,
        b"bytes",
    ],
)
def test_unsafe_names_are_refused(name):
    with pytest.raises(FormatError, match="f"):
        check_member_name(name, what="f", where="m")


def test_resolver_refuses_a_symlink_even_when_it_points_inside(tmp_path):
    (tmp_path / "real.safetensors").write_bytes(b"x")
    os.symlink("real.safetensors", tmp_path / "link.safetensors")
    with pytest.raises(UnsafePathError, match="link.safetensors.*symbolic link"):
        resolve_member(tmp_path, "link.safetensors", what="shards[0].file")
    assert resolve_member(tmp_path, "missing.safetensors", what="x") == tmp_path / "missing.safetensors"


# ---------------------------------------------------------------------------- merge
def parts(tmp_path: Path, storage_b: str = "native") -> tuple[Path, Path]:
    a = build(tmp_path / "a", ids=("a0", "a1", "a2", "a3", "a4"))
    b = build(tmp_path / "b", storage=storage_b, ids=("b0", "b1", "b2", "b3", "b4"))
    return a, b


def test_merge_of_a_hostile_norm_name_touches_nothing_outside(tmp_path, outside):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_bytes(SECRET)
    a, b = parts(tmp_path)
    for part in (a, b):
        raw = load_manifest(part)
        raw["metadata"]["final_norm"]["weight_file"] = "../.bashrc"
        save_manifest(part, raw)
    with pytest.raises(FormatError, match=r"final_norm\.weight_file '\.\./\.bashrc'"):
        merge_datasets([a, b], home / "out")
    assert (home / ".bashrc").read_bytes() == SECRET and not (home / ".bashrc").is_symlink()
    assert (home / ".bashrc").stat().st_nlink == 1


def test_merge_with_the_same_part_twice_or_into_a_part_changes_no_part(tmp_path):
    a, b = parts(tmp_path)
    before = snapshot(a), snapshot(b)
    with pytest.raises(IntegrityError, match="same part"):
        merge_datasets([a, a, b], tmp_path / "out")
    with pytest.raises(ForeignDatasetError, match="is the part"):
        merge_datasets([a, b], a)  # `hs-dataset merge A A B` with the output first
    with pytest.raises(ForeignDatasetError, match="inside it"):
        merge_datasets([a, b], a / "merged")
    copy = tmp_path / "copy-of-a"
    copy.mkdir()
    for name, data in snapshot(a).items():
        (copy / name).write_bytes(data)
    with pytest.raises(IntegrityError, match="same part"):
        merge_datasets([a, copy], tmp_path / "out2")
    assert (snapshot(a), snapshot(b)) == before
    assert verify_dataset(a).ok and verify_dataset(b).ok


def test_merge_refuses_mixed_encodings_before_writing(tmp_path):
    a, b = parts(tmp_path, storage_b="fp8")
    with pytest.raises(ForeignDatasetError, match="fp8_e4m3_per_token.*--storage|--storage"):
        merge_datasets([a, b], tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_merge_refuses_parts_with_different_norms(tmp_path):
    a, b = parts(tmp_path)
    raw = load_manifest(b)
    raw["metadata"]["final_norm"]["eps"] = 1e-3
    save_manifest(b, raw)
    with pytest.raises(ForeignDatasetError, match="final norm"):
        merge_datasets([a, b], tmp_path / "out")


def test_merge_takes_the_writer_lock(tmp_path):
    a, b = parts(tmp_path)
    out = tmp_path / "out"
    with ShardWriter(out, make_metadata(K, H)), pytest.raises(ForeignDatasetError, match="being written"):
        merge_datasets([a, b], out)
    # and a writer cannot start while a merge holds it: the lock is one and the same
    from hs_dataset.formats.dirlock import acquire_dir_lock, release_dir_lock

    (tmp_path / "c").mkdir()
    fd = acquire_dir_lock(tmp_path / "c")
    with pytest.raises(ForeignDatasetError, match="being written"):
        ShardWriter(tmp_path / "c", make_metadata(K, H))
    release_dir_lock(fd)


def test_merge_refuses_a_foreign_output_and_planted_links(tmp_path, outside):
    a, b = parts(tmp_path)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ForeignDatasetError, match="not empty"):
        merge_datasets([a, b], foreign)
    assert (foreign / "notes.txt").read_text() == "mine"

    out = tmp_path / "out"
    merge_datasets([a, b], out)
    assert verify_dataset(out).ok
    # a planted link in the previous merge's output: the re-merge must not write through it
    import shutil

    shutil.rmtree(out / "part-00000")
    os.symlink(outside, out / "part-00000")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        merge_datasets([a, b], out)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"] and (outside / "secret.txt").read_bytes() == SECRET
    (out / "part-00000").unlink()
    (out / "final_norm.safetensors").unlink()
    os.symlink(outside / "secret.txt", out / "final_norm.safetensors")
    with pytest.raises(UnsafePathError, match=r"final_norm\.weight_file.*symbolic link"):
        merge_datasets([a, b], out)
    assert (outside / "secret.txt").read_bytes() == SECRET
    (out / "final_norm.safetensors").unlink()
    merge_datasets([a, b], out)
    assert verify_dataset(out).ok


def test_remerge_replaces_stale_files_of_the_same_size(tmp_path):
    a, b = parts(tmp_path)
    out = tmp_path / "out"
    manifest = merge_datasets([a, b], out)
    stale = out / manifest.shards[0].file
    data = bytearray(stale.read_bytes())
    stale.unlink()  # break the hard link, then corrupt the copy (same size)
    data[-1] ^= 0xFF
    stale.write_bytes(bytes(data))
    merge_datasets([a, b], out)
    assert verify_dataset(out).ok


# ---------------------------------------------------------------------------- import / export / push
def test_import_overwrite_refuses_to_delete_a_dataset(tmp_path):
    from hs_dataset.interop import ExportError, ImportSettings, export_speculators, import_speculators

    src = build(tmp_path / "src")
    exported = tmp_path / "exp"
    export_speculators(src, exported)
    victim = build(tmp_path / "victim", ids=("v0", "v1", "v2", "v3", "v4"))
    before = snapshot(victim)
    with pytest.raises(ExportError, match="will not delete it"):
        import_speculators(exported, victim, ImportSettings(config="unit-test", overwrite=True))
    with pytest.raises(ExportError, match="will not delete it"):
        export_speculators(src, victim, ExportSettings(overwrite=True))
    assert snapshot(victim) == before and verify_dataset(victim).ok


def _speculators_export(tmp_path: Path) -> Path:
    from hs_dataset.interop import export_speculators

    exported = tmp_path / "exp"
    export_speculators(build(tmp_path / "src"), exported)
    return exported


def test_import_refuses_an_export_record_naming_a_file_outside(tmp_path, outside):
    from hs_dataset.interop import ImportSettings, import_speculators

    exported = _speculators_export(tmp_path)
    record = json.loads((exported / "hs_dataset_export.json").read_text())
    record["final_norm"]["weight_file"] = "../outside/secret.txt"
    (exported / "hs_dataset_export.json").write_text(json.dumps(record))
    with pytest.raises(HsDatasetError, match=r"final_norm\.weight_file") as caught:
        import_speculators(exported, tmp_path / "in", ImportSettings(config="unit-test"))
    assert SECRET.decode().strip() not in str(caught.value)


def test_import_refuses_symlinked_source_files(tmp_path, outside):
    from hs_dataset.interop import ImportSettings, import_speculators

    exported = _speculators_export(tmp_path)
    os.replace(exported / "final_norm.safetensors", outside / "norm.safetensors")
    os.symlink(outside / "norm.safetensors", exported / "final_norm.safetensors")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        import_speculators(exported, tmp_path / "in1", ImportSettings(config="unit-test"))
    os.unlink(exported / "final_norm.safetensors")
    os.replace(outside / "norm.safetensors", exported / "final_norm.safetensors")
    hs = exported / "hidden_states" / "hs_1.safetensors"
    os.replace(hs, outside / "hs_1.safetensors")
    os.symlink(outside / "hs_1.safetensors", hs)
    with pytest.raises(UnsafePathError, match=r"hs_1\.safetensors.*symbolic link"):
        import_speculators(exported, tmp_path / "in2", ImportSettings(config="unit-test"))


def test_specforge_import_refuses_a_symlinked_file(tmp_path, outside):
    from hs_dataset.interop import ImportSettings, export_specforge, import_specforge

    exported = tmp_path / "sf"
    export_specforge(build(tmp_path / "src"), exported)
    victim = next(exported.rglob("data_1.ckpt"))
    os.replace(victim, outside / "data_1.ckpt")
    os.symlink(outside / "data_1.ckpt", victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        import_specforge(exported, tmp_path / "in", ImportSettings(config="unit-test"))


def test_push_refuses_a_symlinked_norm_without_a_hash(tmp_path, outside):
    from hs_dataset.hub.upload import push_to_hub

    root = build(tmp_path / "ds")
    symlink_norm_to_canary(root, outside)
    api = mock.MagicMock()
    with pytest.raises(UnsafePathError, match="symbolic link"):
        push_to_hub(root, "me/x", api=api, plots=False)
    assert not api.method_calls  # nothing was sent anywhere


def test_push_refuses_a_symlinked_run_report(tmp_path, outside):
    from hs_dataset.hub.upload import push_to_hub

    root = build(tmp_path / "ds")
    os.symlink(outside / "secret.txt", root / "run_report.json")
    api = mock.MagicMock()
    with pytest.raises(UnsafePathError, match="run_report.json"):
        push_to_hub(root, "me/x", api=api, card=False, plots=False)
    assert not any("secret" in str(c) for c in api.method_calls)


# ---------------------------------------------------------------------------- valid data still passes
@pytest.mark.parametrize("storage", ["native", "fp8"])
def test_valid_datasets_still_verify_and_read(tmp_path, storage):
    root = build(tmp_path / "ds", storage=storage)
    assert verify_dataset(root).ok
    ds = open_dataset(root, verify_hashes=True)
    assert [s["sample_id"] for s in ds] == [f"s{i}" for i in range(len(LENGTHS))]
    weight, eps = ds.final_norm()
    assert weight.shape == (H,) and eps == 1e-6
    from safetensors import safe_open

    for record in ds.manifest.shards:  # safetensors' own loader agrees with our parser
        with safe_open(str(root / record.file), framework="pt") as f:
            assert set(f.keys()) == set(ds.shard(0).specs)


def test_prefixed_merged_and_symlinked_root_datasets_verify(tmp_path):
    a = build(tmp_path / "a", prefix="rank0-", ids=("a0", "a1", "a2", "a3", "a4"))
    b = build(tmp_path / "b", prefix="rank1-", ids=("b0", "b1", "b2", "b3", "b4"))
    out = tmp_path / "merged"
    merge_datasets([a, b], out)
    assert verify_dataset(out).ok and len(open_dataset(out)) == 10
    os.symlink(out, tmp_path / "link-to-merged")  # the user may name the root through a link
    assert verify_dataset(tmp_path / "link-to-merged").ok
    assert len(list(open_dataset(tmp_path / "link-to-merged"))) == 10


def test_unknown_dtype_is_reported_as_unsupported(tmp_path, outside):
    root = build(tmp_path / "ds")
    edit_header(lambda h: h["loss_mask"].update(dtype="F4_MAGIC"))(root, outside)
    with pytest.raises(UnsupportedFormatError):
        read_everything(root)


@pytest.mark.parametrize("target", ["speculators", "specforge"])
def test_export_refuses_a_symlinked_norm(target, tmp_path, outside):
    from hs_dataset.interop import export_specforge, export_speculators

    root = build(tmp_path / "ds")
    symlink_norm_to_canary(root, outside)
    export = {"speculators": export_speculators, "specforge": export_specforge}[target]
    with pytest.raises(HsDatasetError, match="symbolic link") as caught:
        export(root, tmp_path / "out")
    assert SECRET.decode().strip() not in str(caught.value)
    assert not any(SECRET in p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())
