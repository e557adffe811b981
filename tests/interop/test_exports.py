"""Exports to speculators / SpecForge layouts, loaded with their OWN readers, and imports back.

The real readers come from PyPI (``bash scripts/make_interop_env.sh VENV`` installs
speculators==0.9.0 and specforge==0.2.0 without their GPU stacks). Without them the
reader tests skip, unless CI is set: then they fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hs_dataset.formats.reader import open_dataset
from hs_dataset.formats.verify import verify_dataset
from hs_dataset.formats.writer import ShardWriter
from hs_dataset.interop import (
    EXPORT_RECORD_NAME,
    ExportError,
    ExportMismatchError,
    ImportDataError,
    ImportSettings,
    derive_post_norm,
    export_specforge,
    export_speculators,
    import_specforge,
    import_speculators,
)
from hs_dataset.interop.settings import ExportSettings
from hs_dataset.interop.specforge.settings import SpecForgeExportSettings
from hs_dataset.interop.speculators.settings import SpeculatorsExportSettings
from tests.fixtures.interop import require_interop
from tests.fixtures.samples import PYTHON, make_metadata, make_sample

H, K, L = 16, 3, 6
LENGTHS = (7, 12, 5, 9, 11)


def _write(
    root: Path, *, k: int = K, dtype: str = "bfloat16", storage: str = "native", norm: bool = True, lengths=LENGTHS, **extra
) -> Path:
    md = make_metadata(k=k, h=H, dtype=dtype, **{"num_hidden_layers": L, **extra})
    tdtype = getattr(torch, dtype)
    weight = torch.linspace(0.5, 1.5, H) if norm else None
    if not norm:
        md.pop("final_norm", None)
    with ShardWriter(root, md, final_norm_weight=weight, storage=storage, shard_bytes=1500) as w:
        for i, t in enumerate(lengths):
            w.add(make_sample(f"s{i}", t, k=k, h=H, dtype=tdtype))
    return root


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return _write(tmp_path / "src")


# ---------------------------------------------------------------------------- speculators
def test_speculators_layout_and_values(src: Path, tmp_path: Path) -> None:
    import datasets

    dest = tmp_path / "spec"
    report = export_speculators(src, dest)
    ds = open_dataset(src)
    assert report.samples == len(LENGTHS) and report.files_written == len(LENGTHS)
    assert len(ds.manifest.shards) > 1  # the export walks several shards
    arrow = datasets.load_from_disk(str(dest))
    assert arrow.format["type"] == "torch"
    assert arrow.features["input_ids"].feature.dtype == "int64" and arrow.features["loss_mask"].feature.dtype == "int64"
    assert list(arrow.with_format(None)["seq_len"]) == list(LENGTHS)
    for idx, sample in enumerate(ds):
        f = load_file(dest / "hidden_states" / f"hs_{idx}.safetensors")
        assert set(f) == {"hidden_states", "token_ids"}
        assert f["hidden_states"].shape == (LENGTHS[idx], K + 1, H) and f["token_ids"].dtype == torch.int64
        assert torch.equal(f["hidden_states"][:, :-1], sample["aux_hidden_states"])
        assert torch.equal(f["hidden_states"][:, -1], sample["final_hidden_state"])  # pre-norm, last
        assert torch.equal(f["token_ids"], sample["input_ids"])
        assert torch.equal(arrow[idx]["loss_mask"], sample["loss_mask"].long())
        assert arrow[idx]["sample_id"] == sample["sample_id"]
    record = json.loads((dest / EXPORT_RECORD_NAME).read_text())
    assert record["status"] == "complete"
    assert record["layers"]["hidden_states_layer_ids"] == [2, 3, 4, L]
    assert record["layers"]["train_flag"] == "--target-layer-ids 2 3 4"
    freq = torch.load(dest / "token_freq.pt", weights_only=True)
    assert sum(freq.values()) == sum(int(s["loss_mask"].sum()) for s in ds)


def test_speculators_loads_with_speculators_own_dataset_and_collate(src: Path, tmp_path: Path) -> None:
    data_mod = require_interop("speculators.train.data")
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.dataloader import create_train_val_loaders

    dest = tmp_path / "spec"
    export_speculators(src, dest)
    ds = open_dataset(src)
    arrow_ds = data_mod.ArrowDataset(max_len=64, datapath=str(dest), on_missing="raise", hidden_states_dtype=torch.float32)
    assert len(arrow_ds) == len(LENGTHS) and arrow_ds.approx_lengths == list(LENGTHS)
    items = [arrow_ds[i] for i in range(len(arrow_ds))]
    for item, sample in zip(items, ds):
        assert not isinstance(item, data_mod.SampleUnavailable)  # token_ids matched the Arrow input_ids
        t = sample["input_ids"].shape[0]
        assert torch.equal(item["hidden_states"], sample["aux_hidden_states"].reshape(t, K * H))
        assert torch.equal(item["verifier_last_hidden_states"], sample["final_hidden_state"])
        assert torch.equal(item["loss_mask"], sample["loss_mask"].long())
    batch = data_mod.CollateFn(64, H, num_target_layers=K, dtype=torch.bfloat16, preprocess=shift_batch)(items)
    assert batch["hidden_states"].shape == (1, 64, K * H) and batch["error_records"] == 0
    assert int((batch["document_ids"] >= 0).sum()) == sum(t - 1 for t in LENGTHS)
    # The trainer's own loader construction (multipack sampler, train/val split), in-process.
    train, val = create_train_val_loaders(
        data_path=str(dest),
        total_seq_len=64,
        hidden_states_dtype=torch.bfloat16,
        vllm_endpoint="http://127.0.0.1:9/v1",
        on_missing="raise",
        verifier_name_or_path="unused",
        request_timeout=1,
        max_retries=0,
        generation_validation_retries=0,
        max_consecutive_generation_failures=1,
        hidden_size=H,
        num_target_layers=K,
        num_workers=0,
        prefetch_factor=None,
        preprocess=shift_batch,
        train_data_ratio=0.6,
    )
    seen = [b for loader in (train, val) for b in loader]
    assert seen and all(b["error_records"] == 0 for b in seen)


def test_speculators_refuses_post_norm_and_bad_layers(tmp_path: Path) -> None:
    post = _write(tmp_path / "post", final_state="post_norm")
    with pytest.raises(ExportMismatchError, match="post_norm.*PRE-norm"):
        export_speculators(post, tmp_path / "out1")
    src = _write(tmp_path / "src")
    with pytest.raises(ExportMismatchError, match=r"aux layer\(s\) \[5\] are not in the data"):
        export_speculators(src, tmp_path / "out2", ExportSettings(aux_layer_ids=[2, 5]))
    with pytest.raises(ExportMismatchError, match="contradicts the manifest's num_hidden_layers 6"):
        export_speculators(src, tmp_path / "out3", SpeculatorsExportSettings(num_hidden_layers=3))
    nolayers = _write(tmp_path / "nolayers", num_hidden_layers=None)
    with pytest.raises(ExportMismatchError, match="num_hidden_layers"):
        export_speculators(nolayers, tmp_path / "out4")
    shallow = _write(tmp_path / "shallow", num_hidden_layers=None, aux_layer_ids=[2, 3, 4])
    with pytest.raises(ExportMismatchError, match=r"outside 0\.\.3"):
        export_speculators(shallow, tmp_path / "out5", SpeculatorsExportSettings(num_hidden_layers=4))
    assert not (tmp_path / "out1").exists() or not any((tmp_path / "out1").iterdir())


# ---------------------------------------------------------------------------- specforge
def test_specforge_layout_and_post_norm(src: Path, tmp_path: Path) -> None:
    dest = tmp_path / "forge"
    export_specforge(src, dest, SpecForgeExportSettings(group_size=2))
    ds = open_dataset(src)
    weight, eps = ds.final_norm()
    assert sorted(p.name for p in dest.iterdir()) == sorted([EXPORT_RECORD_NAME, "rows_0-2", "rows_2-4", "rows_4-6"])
    for idx, sample in enumerate(ds):
        g = (idx // 2) * 2
        raw = torch.load(dest / f"rows_{g}-{g + 2}" / f"data_{idx}.ckpt", weights_only=True)
        t = LENGTHS[idx]
        assert raw["input_ids"].dtype == torch.int64 and raw["input_ids"].shape == (t,)
        assert raw["loss_mask"].dtype == torch.int64 and torch.equal(raw["loss_mask"], sample["loss_mask"].long())
        assert raw["aux_hidden_state"].shape == (1, t, K * H)
        assert torch.equal(raw["aux_hidden_state"][0].reshape(t, K, H), sample["aux_hidden_states"])
        expected = derive_post_norm(sample["final_hidden_state"], weight, eps)
        assert raw["hidden_state"].shape == (1, t, H) and raw["hidden_state"].dtype == torch.bfloat16
        assert torch.equal(raw["hidden_state"][0], expected)
        assert not torch.equal(raw["hidden_state"][0], sample["final_hidden_state"])
        # compact: the file holds this sample, not the whole memory-mapped shard the views came from
        assert (dest / f"rows_{g}-{g + 2}" / f"data_{idx}.ckpt").stat().st_size < 4096 + t * (K + 1) * H * 2 + t * 16
    record = json.loads((dest / EXPORT_RECORD_NAME).read_text())
    assert record["layers"]["specforge_aux_hidden_state_layer_ids"] == [1, 2, 3]


def test_specforge_loads_with_specforge_offline_reader(src: Path, tmp_path: Path) -> None:
    reader_mod = require_interop("specforge.runtime.data_plane.offline_reader")
    from specforge.algorithms.eagle3.data import build_offline_collator, build_offline_normalizer
    from specforge.runtime.data_plane.feature_dataloader import FeatureDataLoader
    from specforge.runtime.data_plane.feature_store import LocalFeatureStore, load_feature_file

    assert not [m for m in sys.modules if m.split(".")[0] in ("sglang", "sgl_kernel", "yunchang")]
    dest = tmp_path / "forge"
    export_specforge(src, dest)
    refs = reader_mod.OfflineManifestReader(str(dest), validate_files=True, max_len=64).read()
    assert len(refs) == len(LENGTHS)
    ds = open_dataset(src)
    weight, eps = ds.final_norm()
    by_path = {ref.feature_store_uri[len("file://") :]: ref for ref in refs}
    for idx, sample in enumerate(ds):
        path = str((dest / "rows_0-2000" / f"data_{idx}.ckpt").resolve())
        assert by_path[path].feature_specs["aux_hidden_state"].shape in ((1, LENGTHS[idx], K * H), [1, LENGTHS[idx], K * H])
        raw = load_feature_file(path)  # SpecForge's own file loader
        assert torch.equal(raw["hidden_state"][0], derive_post_norm(sample["final_hidden_state"], weight, eps))
    loader = FeatureDataLoader(
        LocalFeatureStore(),
        refs=refs,
        batch_size=2,
        collate_fn=build_offline_collator(),
        per_sample_transform=build_offline_normalizer(64),
        drop_last=False,
        gc_interval_s=None,
    )
    batches = list(loader)
    assert sum(len(b.sample_ids) for b in batches) == len(LENGTHS)
    for b in batches:
        assert b.tensors["hidden_state"].shape[-1] == K * H and b.tensors["target"].shape[-1] == H
        assert b.tensors["loss_mask"].shape == b.tensors["input_ids"].shape


def test_specforge_post_norm_matches_real_transformers_state(tiny_card, hf_backend, tmp_path: Path) -> None:
    """The derived post-norm state vs transformers' own hidden_states[-1] (after model.norm), float32."""
    from hs_dataset.pipeline.build import build_dataset

    src = tmp_path / "tiny"
    build_dataset(tiny_card, src, num_samples=4, backend=hf_backend)
    dest = tmp_path / "forge"
    with pytest.warns(UserWarning, match="cannot train"):
        export_specforge(src, dest, SpecForgeExportSettings(keep_dtype=True))  # float32 kept, to measure the derivation itself
    worst = 0.0
    for idx, sample in enumerate(open_dataset(src)):
        with torch.inference_mode():
            real = hf_backend.model(input_ids=sample["input_ids"][None], output_hidden_states=True).hidden_states[-1][0]
        derived = torch.load(dest / "rows_0-2000" / f"data_{idx}.ckpt", weights_only=True)["hidden_state"][0]
        assert derived.dtype == torch.float32
        rel = float((derived - real).abs().max() / real.abs().max())
        worst = max(worst, rel)
        # the stored state really is pre-norm: far from the post-norm one
        assert float((sample["final_hidden_state"] - real).abs().max() / real.abs().max()) > 0.1
    print(f"\nmax relative deviation of derived post-norm vs transformers hidden_states[-1]: {worst:.3e}")
    assert worst <= 1e-6


def test_specforge_refusals(tmp_path: Path) -> None:
    four = _write(tmp_path / "four", k=4)
    with pytest.raises(ExportMismatchError, match="exactly 3 aux layers.*4"):
        export_specforge(four, tmp_path / "o1")
    report = export_specforge(four, tmp_path / "o2", ExportSettings(aux_layer_ids=[2, 3, 5]))
    assert report.layers["aux layers (HF hidden_states ids)"] == [2, 3, 5]
    raw = torch.load(tmp_path / "o2" / "rows_0-2000" / "data_0.ckpt", weights_only=True)
    assert torch.equal(raw["aux_hidden_state"][0].reshape(-1, 3, H), open_dataset(four)[0]["aux_hidden_states"][:, [0, 1, 3]])
    nonorm = _write(tmp_path / "nonorm", norm=False)
    with pytest.raises(ExportMismatchError, match="final norm cannot be applied"):
        export_specforge(nonorm, tmp_path / "o3")
    layernorm = _write(tmp_path / "layernorm", final_norm={"kind": "layernorm", "eps": 1e-5})
    with pytest.raises(ExportMismatchError, match="'layernorm'"):
        export_specforge(layernorm, tmp_path / "o4")
    emb = _write(tmp_path / "emb", aux_layer_ids=[0, 2, 3])
    with pytest.raises(ExportMismatchError, match="embedding output"):
        export_specforge(emb, tmp_path / "o5")
    post = _write(tmp_path / "post", final_state="post_norm", norm=False)
    export_specforge(post, tmp_path / "o6")  # already post-norm: stored as is
    raw = torch.load(tmp_path / "o6" / "rows_0-2000" / "data_0.ckpt", weights_only=True)
    assert torch.equal(raw["hidden_state"][0], open_dataset(post)[0]["final_hidden_state"])


# ---------------------------------------------------------------------------- destination, resume, fp8
@pytest.mark.parametrize("export", [export_speculators, export_specforge])
def test_destination_with_other_data_is_refused_unless_overwrite(export, src: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty.*choose another") as err:  # no --overwrite hint: it would refuse too
        export(src, dest)
    assert "--overwrite" not in str(err.value)
    assert (dest / "notes.txt").read_text() == "mine"
    with pytest.raises(ExportError, match="deletes only an earlier hs_dataset export"):  # not ours: never deleted
        export(src, dest, ExportSettings(overwrite=True))
    assert (dest / "notes.txt").read_text() == "mine"
    (dest / "notes.txt").unlink()
    export(src, dest)
    other = _write(tmp_path / "other")
    with pytest.raises(ExportError, match="different export.*source_dataset_id"):
        export(other, dest)
    export(other, dest, ExportSettings(overwrite=True))  # an earlier export is ours: --overwrite replaces it
    export(src, dest, ExportSettings(overwrite=True))
    with pytest.raises(ExportError, match="overlaps"):
        export(src, src / "inside", ExportSettings(overwrite=True))
    with pytest.raises(ExportError, match="hs_dataset dataset directory"):
        export(src, other, ExportSettings(overwrite=True))
    assert open_dataset(other).manifest.num_samples == len(LENGTHS)


@pytest.mark.parametrize("target", ["speculators", "specforge"])
def test_interrupted_export_resumes(target: str, src: Path, tmp_path: Path, python_env: dict) -> None:
    export = {"speculators": export_speculators, "specforge": export_specforge}[target]
    reference = tmp_path / "reference"
    export(src, reference)
    dest = tmp_path / "dest"
    env = dict(python_env, HS_DATASET_CRASH_AT="export.mid_file:3")
    proc = subprocess.run(
        [PYTHON, "-m", "hs_dataset.cli.main", "export", target, str(src), str(dest)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -9, proc.stderr
    files = sorted(p for p in dest.rglob("*") if p.is_file())
    temps = [p for p in files if p.name.startswith(".hs-tmp-")]
    assert len(temps) == 1 and temps[0].name.endswith(".part")  # the half-written third file, under a name no reader globs
    assert not (dest / "state.json").exists()  # the Arrow index comes last: nothing half-exported is loadable
    assert json.loads((dest / EXPORT_RECORD_NAME).read_text())["status"] == "in_progress"
    if target == "speculators":  # a file truncated by some other accident is detected and rewritten
        victim = dest / "hidden_states" / "hs_1.safetensors"
        victim.write_bytes(victim.read_bytes()[:-7])
    report = export(src, dest)
    assert report.resumed
    if target == "speculators":
        assert (report.files_skipped, report.files_rewritten, report.files_written) == (1, 1, len(LENGTHS) - 1)
    else:
        assert (report.files_skipped, report.files_written) == (2, len(LENGTHS) - 2)
    assert not list(dest.rglob(".hs-tmp-*"))
    ours = {p.relative_to(dest): p.read_bytes() for p in dest.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".ckpt")}
    theirs = {
        p.relative_to(reference): p.read_bytes() for p in reference.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".ckpt")
    }
    assert ours.keys() == theirs.keys()
    assert ours == theirs  # byte-identical to an uninterrupted export (safetensors and torch.save zips are deterministic)
    assert json.loads((dest / EXPORT_RECORD_NAME).read_text())["status"] == "complete"


def test_fp8_dataset_exports_decoded_bf16(tmp_path: Path) -> None:
    src = _write(tmp_path / "fp8", storage="fp8")
    ds = open_dataset(src)
    assert ds.manifest.tensors["aux_hidden_states"]["encoding"] == "fp8_e4m3_per_token"
    export_speculators(src, tmp_path / "spec")
    export_specforge(src, tmp_path / "forge")
    weight, eps = ds.final_norm()
    for idx, sample in enumerate(ds):
        hs = load_file(tmp_path / "spec" / "hidden_states" / f"hs_{idx}.safetensors")["hidden_states"]
        assert hs.dtype == torch.bfloat16
        assert torch.equal(hs[:, :-1], sample["aux_hidden_states"]) and torch.equal(hs[:, -1], sample["final_hidden_state"])
        raw = torch.load(tmp_path / "forge" / "rows_0-2000" / f"data_{idx}.ckpt", weights_only=True)
        assert raw["aux_hidden_state"].dtype == torch.bfloat16
        assert torch.equal(raw["hidden_state"][0], derive_post_norm(sample["final_hidden_state"], weight, eps))


# ---------------------------------------------------------------------------- imports
def _samples(root: Path) -> list[dict]:
    return list(open_dataset(root))


def test_import_speculators_round_trip(src: Path, tmp_path: Path) -> None:
    export_speculators(src, tmp_path / "spec")
    report = import_speculators(tmp_path / "spec", tmp_path / "back", ImportSettings(config="unit-test"))
    assert report.samples_written == len(LENGTHS)
    back, orig = open_dataset(tmp_path / "back"), open_dataset(src)
    md = back.manifest.metadata.to_json()
    assert md["final_state"] == "pre_norm" and md["aux_layer_ids"] == [2, 3, 4] and md["num_hidden_layers"] == L
    for a, b in zip(back, orig):
        assert a["sample_id"] == b["sample_id"]
        for key in ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_state"):
            assert torch.equal(a[key], b[key]), key
    w1, e1 = back.final_norm()
    w2, e2 = orig.final_norm()
    assert torch.equal(w1, w2) and e1 == e2  # carried through final_norm.safetensors
    again = import_speculators(tmp_path / "spec", tmp_path / "back", ImportSettings(config="unit-test"))
    assert again.samples_written == 0 and again.skipped_existing == len(LENGTHS)
    with pytest.raises(ImportDataError, match="layer ids disagree"):
        import_speculators(tmp_path / "spec", tmp_path / "back2", ImportSettings(config="unit-test", aux_layer_ids=[1, 2, 3]))


def test_a_final_state_only_dataset_exports_the_final_alone_and_comes_back(tmp_path: Path) -> None:
    """``aux_layer_ids: []`` (the mtp preset): speculators gets hidden_states [T, 1, H]; SpecForge, which needs 3 aux layers, refuses in one line."""
    final_only = _write(tmp_path / "mtp", k=0, layer_preset={"name": "mtp", "taps": None, "ids_from": "preset"})
    report = export_speculators(final_only, tmp_path / "spec")
    assert any("only speculators' MTP trains on it" in note for note in report.notes)
    record = json.loads((tmp_path / "spec" / EXPORT_RECORD_NAME).read_text())["layers"]
    assert record["target_layer_ids"] == [] and record["hidden_states_layer_ids"] == [L]
    assert record["train_flags"][:2] == ["--speculator-type", "mtp"] and "--target-layer-ids" not in record["train_flags"]
    orig = open_dataset(final_only)
    for idx, sample in enumerate(orig):
        hs = load_file(str(tmp_path / "spec" / "hidden_states" / f"hs_{idx}.safetensors"))["hidden_states"]
        assert hs.shape == (sample["input_ids"].shape[0], 1, H) and torch.equal(hs[:, 0], sample["final_hidden_state"])
    import_speculators(tmp_path / "spec", tmp_path / "back", ImportSettings(config="unit-test"))
    back = open_dataset(tmp_path / "back")
    assert back.manifest.aux_layer_ids == [] and "aux_hidden_states" not in back.manifest.tensors
    for a, b in zip(back, orig):
        assert torch.equal(a["final_hidden_state"], b["final_hidden_state"]) and a["aux_hidden_states"].shape[1] == 0
    with pytest.raises(ExportMismatchError, match=r"holds the final state only .*layer preset mtp.*exactly 3 aux layers"):
        export_specforge(final_only, tmp_path / "forge")


def test_import_specforge_stores_post_norm(src: Path, tmp_path: Path) -> None:
    export_specforge(src, tmp_path / "forge")
    import_specforge(tmp_path / "forge", tmp_path / "back", ImportSettings(config="unit-test"))
    back, orig = open_dataset(tmp_path / "back"), open_dataset(src)
    assert back.manifest.metadata.to_json()["final_state"] == "post_norm"
    assert back.manifest.identity != orig.manifest.identity
    weight, eps = orig.final_norm()
    for a, b in zip(back, orig):
        assert a["sample_id"] == b["sample_id"] and torch.equal(a["aux_hidden_states"], b["aux_hidden_states"])
        assert torch.equal(a["final_hidden_state"], derive_post_norm(b["final_hidden_state"], weight, eps))
    # post-norm data cannot go to speculators; it can go back to SpecForge unchanged
    with pytest.raises(ExportMismatchError, match="post_norm"):
        export_speculators(tmp_path / "back", tmp_path / "spec")
    export_specforge(tmp_path / "back", tmp_path / "forge2")
    for p in (tmp_path / "forge").rglob("*.ckpt"):
        x, y = torch.load(p, weights_only=True), torch.load(tmp_path / "forge2" / p.relative_to(tmp_path / "forge"), weights_only=True)
        assert all(torch.equal(x[k], y[k]) for k in ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state"))


def test_import_foreign_layouts_and_refusals(tmp_path: Path) -> None:
    """Files as the peers write them (no record, no sample ids): layer ids must be stated; bad files are named."""
    from safetensors.torch import save_file

    forge = tmp_path / "forge" / "rows_0-2000"
    forge.mkdir(parents=True)
    for i, t in enumerate((6, 4)):
        s = make_sample(f"x{i}", t, k=3, h=H)
        torch.save(
            {
                "input_ids": s.input_ids,
                "loss_mask": s.loss_mask.long(),
                "aux_hidden_state": s.aux_hidden_states.reshape(1, t, 3 * H),
                "hidden_state": s.final_hidden_state[None],
            },
            forge / f"data_{i}.ckpt",
        )
    with pytest.raises(ImportDataError, match="nothing says which"):
        import_specforge(tmp_path / "forge", tmp_path / "a", ImportSettings(config="peer"))
    report = import_specforge(tmp_path / "forge", tmp_path / "b", ImportSettings(config="peer", num_hidden_layers=32))
    assert report.metadata.to_json()["aux_layer_ids"] == [2, 16, 29] and [s["sample_id"] for s in _samples(tmp_path / "b")] == [
        "specforge-00000000",
        "specforge-00000001",
    ]
    with pytest.raises(ImportDataError, match="hold 3 aux layers but the layer ids are"):
        import_specforge(tmp_path / "forge", tmp_path / "c", ImportSettings(config="peer", aux_layer_ids=[2, 3]))
    bad = make_sample("bad", 5, k=3, h=H)
    torch.save(
        {
            "input_ids": bad.input_ids,
            "loss_mask": bad.loss_mask.long(),
            "aux_hidden_state": bad.aux_hidden_states.reshape(1, 5, 3 * H)[:, :4],
            "hidden_state": bad.final_hidden_state[None],
        },
        forge / "data_2.ckpt",
    )
    with pytest.raises(ImportDataError, match=r"data_2\.ckpt: aux_hidden_state has shape"):
        import_specforge(tmp_path / "forge", tmp_path / "d", ImportSettings(config="peer", num_hidden_layers=32))
    (forge / "data_2.ckpt").write_bytes(b"not a zip")
    with pytest.raises(ImportDataError, match=r"data_2\.ckpt: cannot be read with torch\.load\(weights_only=True\)"):
        import_specforge(tmp_path / "forge", tmp_path / "e", ImportSettings(config="peer", num_hidden_layers=32))

    # speculators: token_ids that do not match the Arrow row are refused, naming the file
    src = _write(tmp_path / "src")
    export_speculators(src, tmp_path / "spec")
    hs_path = tmp_path / "spec" / "hidden_states" / "hs_2.safetensors"
    f = load_file(hs_path)
    f["token_ids"] = f["token_ids"].flip(0)
    save_file(f, hs_path)
    with pytest.raises(ImportDataError, match=r"hs_2\.safetensors: token_ids differ"):
        import_speculators(tmp_path / "spec", tmp_path / "f", ImportSettings(config="unit-test"))
    f["token_ids"] = f["token_ids"][:-1]
    save_file(f, hs_path)
    with pytest.raises(ImportDataError, match=r"hs_2\.safetensors: hidden_states has 5 tokens, token_ids 4"):
        import_speculators(tmp_path / "spec", tmp_path / "g", ImportSettings(config="unit-test"))
    hs_path.unlink()
    with pytest.raises(ImportDataError, match=r"hs_2\.safetensors: missing"):
        import_speculators(tmp_path / "spec", tmp_path / "h", ImportSettings(config="unit-test"))
    report = import_speculators(tmp_path / "spec", tmp_path / "i", ImportSettings(config="unit-test"), skip_missing=True)
    assert report.samples_written == len(LENGTHS) - 1 and len(report.skipped_missing) == 1
    # a destination holding another dataset is refused; --overwrite refuses to delete it too (as export does)
    with pytest.raises(Exception, match="different dataset"):
        import_speculators(tmp_path / "spec", tmp_path / "b", ImportSettings(config="unit-test"), skip_missing=True)
    with pytest.raises(ExportError, match="--overwrite will not delete it"):
        import_speculators(tmp_path / "spec", tmp_path / "b", ImportSettings(config="unit-test", overwrite=True), skip_missing=True)
    assert verify_dataset(tmp_path / "b").ok


def test_import_with_card_and_cli(tiny_card, hf_backend, tmp_path: Path) -> None:
    from hs_dataset.cli.main import main
    from hs_dataset.pipeline.build import build_dataset

    src = tmp_path / "tiny"
    build_dataset(tiny_card, src, num_samples=2, backend=hf_backend)
    assert main(["export", "speculators", str(src), str(tmp_path / "spec")]) == 0
    assert main(["export", "specforge", str(src), str(tmp_path / "forge16")]) == 0  # bfloat16: what SpecForge trains on
    with pytest.warns(UserWarning, match="cannot train"):  # float32 kept, so the float32 card's import accepts it
        assert main(["export", "specforge", str(src), str(tmp_path / "forge"), "--keep-dtype"]) == 0
    assert main(["import", "speculators", str(tmp_path / "spec"), str(tmp_path / "back"), "--config", "tiny-deepseek-hf"]) == 0
    back, orig = open_dataset(tmp_path / "back"), open_dataset(src)
    # same model, layers, pre-norm: every identity field the import records agrees; it records no tokenizer, source
    # or limits (an export keeps none), so its identity hash is its own
    from hs_dataset.formats.identity import identity_differences, identity_fields

    assert identity_differences(identity_fields(orig.manifest.metadata), identity_fields(back.manifest.metadata)) == []
    assert main(["import", "specforge", str(tmp_path / "forge"), str(tmp_path / "back2"), "--config", "tiny-deepseek-hf"]) == 0
    assert open_dataset(tmp_path / "back2").manifest.metadata.to_json()["final_state"] == "post_norm"
    # the CLI names refusals and exits 2
    assert main(["export", "speculators", str(tmp_path / "back2"), str(tmp_path / "x")]) == 2
    assert (
        main(
            [
                "import",
                "specforge",
                str(tmp_path / "forge"),
                str(tmp_path / "y"),
                "--config",
                "tiny-deepseek-hf",
                "--aux-layer-ids",
                "1",
                "2",
                "3",
            ]
        )
        == 2
    )
