"""Regeneration on the embedded default (HF backend): the target rewrites every assistant turn, then states are captured.

Proved here: the turns equal a plain ``model.generate`` with the same greedy settings;
the loss mask covers exactly the ids the model returned (re-tokenizing the stored
conversation gives the same prompts); the states equal an independent transformers
forward over the regenerated ids; a build killed (SIGKILL) between stored windows and
resumed equals an uninterrupted one; the file is hashed in the manifest and pushed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hs_dataset.formats.metadata import RegeneratedFile
from tests.fixtures.reference import aux_and_prenorm

AUX = [2, 3, 4]
NEW_TOKENS = 6
CONVERSATIONS = [
    {"id": "one-turn", "messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]},
    {
        "id": "two-turns",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "And again?"},
            {"role": "assistant", "content": "Hello again."},
        ],
    },
    {"id": "sharegpt", "conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]},
    {"id": "pair", "prompt": "Say yes.", "response": "Yes."},
    {
        "id": "three-turns",
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
            {"role": "assistant", "content": "d"},
            {"role": "user", "content": "e"},
            {"role": "assistant", "content": "f"},
        ],
    },
]


def regen_card(tiny_card, **extra):
    return tiny_card.with_overrides(
        regenerate={"enabled": True, "max_new_tokens": NEW_TOKENS, "thinking": "off", "concurrency": 2, **extra},
        backend={"batch_size": 2},
    )


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("regen-src") / "chats.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    return path


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory, tiny_card, hf_backend, chats):
    from hs_dataset.pipeline.build import build_dataset

    out = tmp_path_factory.mktemp("regen") / "ds"
    report = build_dataset(regen_card(tiny_card), out, source=str(chats), backend=hf_backend)
    return out, report


def records(out: Path) -> dict[str, dict]:
    from hs_dataset.formats.regenerated import RegeneratedStore

    return RegeneratedStore(out).records


def test_every_turn_regenerated_and_counted(regenerated):
    out, report = regenerated
    rec = records(out)
    assert sorted(rec) == sorted(c["id"] for c in CONVERSATIONS)
    assert [len(rec[c["id"]]["turns"]) for c in CONVERSATIONS] == [1, 2, 1, 1, 3]
    assert report.regeneration["turns"] == 8 and report.regeneration["failed"] == 0
    assert report.regeneration["hit_max_new_tokens"] + sum(t["finish"] == "stop" for r in rec.values() for t in r["turns"]) == 8
    assert report.samples_written == 5 and report.source["shapes"] == {"openai": 3, "sharegpt": 1, "prompt_response": 1}
    meta = json.loads((out / "manifest.json").read_text())["metadata"]["regeneration"]
    assert meta["max_new_tokens"] == NEW_TOKENS and meta["temperature"] == 0.0 and meta["generator"]["engine"] == "transformers"
    assert meta["generator"]["model_fingerprint"] and meta["thinking"] == "off"
    from hs_dataset.formats.hashing import sha256_file

    assert meta["files"]["regenerated.jsonl"]["sha256"] == sha256_file(out / "regenerated.jsonl")


def test_the_manifest_records_the_structure_ids_beside_the_stop_ids_and_info_shows_them(regenerated, tiny_model_dir):
    """The ids an answer is refused for are the ones the run used (the template's role markers and separators)."""
    from transformers import AutoTokenizer

    from hs_dataset.cli.info import describe
    from hs_dataset.formats.manifest import Manifest
    from hs_dataset.regenerate.answers import structure_tokens
    from hs_dataset.sources.chat import ChatTokenizer
    from hs_dataset.sources.masking import resolve_mask_rule

    out, _ = regenerated
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)
    chat = ChatTokenizer(tok, resolve_mask_rule(tok))
    raw = json.loads((out / "manifest.json").read_text())["metadata"]["regeneration"]
    expected = sorted(structure_tokens(chat, raw["stop_token_ids"]))
    assert expected and raw["structure_token_ids"] == expected
    assert list(raw)[list(raw).index("stop_token_ids") + 1] == "structure_token_ids"  # same section, beside the stop ids
    assert {tok.convert_ids_to_tokens(i) for i in expected} >= {"<|im_user|>", "<|im_assistant|>"}
    shown = describe(Manifest.load(out))
    assert f"stop ids {raw['stop_token_ids']}; structure ids {expected}" in shown


def test_turns_equal_plain_model_generate(regenerated, hf_backend):
    from hs_dataset.regenerate.generator import GenerationParams, hf_generate_kwargs

    out, _ = regenerated
    manifest = json.loads((out / "manifest.json").read_text())["metadata"]["regeneration"]
    params = GenerationParams(NEW_TOKENS, stop_token_ids=tuple(manifest["stop_token_ids"]))
    checked = 0
    for rec in records(out).values():
        for turn in rec["turns"]:
            prompt = torch.tensor([rec["input_ids"][: turn["prompt_tokens"]]])
            with torch.inference_mode():
                plain = hf_backend.model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), **hf_generate_kwargs(params, 0))
            new = plain[0, prompt.shape[1] :].tolist()
            stops = [k for k, t in enumerate(new) if t in params.stop_token_ids]
            assert turn["token_ids"] == (new[: stops[0] + 1] if stops else new)
            checked += 1
    assert checked == 8


def test_loss_mask_is_exactly_the_generated_ids(regenerated, tiny_model_dir):
    """Re-tokenize the stored conversation: its prompts are the sample's prefixes, and the mask selects the returned ids."""
    from transformers import AutoTokenizer

    import hs_dataset

    out, _ = regenerated
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    data = hs_dataset.open_dataset(out)
    rows = {data[i]["sample_id"]: data[i] for i in range(len(data))}
    for sid, rec in records(out).items():
        row = rows[sid]
        ids, mask = row["input_ids"].tolist(), row["loss_mask"].tolist()
        assert ids == rec["input_ids"]
        assert [t for t, m in zip(ids, mask) if m] == [t for turn in rec["turns"] for t in turn["token_ids"]]
        first = rec["messages"][: next(k for k, m in enumerate(rec["messages"]) if m["role"] == "assistant")]
        prompt = tok.apply_chat_template(first, add_generation_prompt=True, thinking=False, tokenize=True, return_dict=True)["input_ids"]
        assert list(prompt) == ids[: rec["turns"][0]["prompt_tokens"]]  # the first prompt, re-tokenized
        for turn in rec["turns"]:
            start, n = turn["prompt_tokens"], len(turn["token_ids"])
            assert ids[start : start + n] == turn["token_ids"] and all(mask[start : start + n]) and not mask[start - 1]
        # the whole sample is the template's rendering of the stored (decoded) conversation, up to its last answer
        text = tok.apply_chat_template(rec["messages"], thinking=False, tokenize=False)
        last = rec["turns"][-1]
        cut = "" if last["token_ids"][-1] in (129284,) else "<|im_end|>"
        assert tok.decode(ids, skip_special_tokens=False) + cut == text


def test_states_equal_an_independent_forward(regenerated, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    import hs_dataset

    out, _ = regenerated
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32, local_files_only=True).eval()
    data = hs_dataset.open_dataset(out)
    worst = 0.0
    for i in range(len(data)):
        row = data[i]
        aux, pre = aux_and_prenorm(model, row["input_ids"], AUX)
        for got, want in ((row["aux_hidden_states"], aux), (row["final_hidden_state"], pre)):
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
    print(f"regenerated states vs transformers: max relative error {worst:.2e}")
    assert worst < 1e-6


def test_kill_during_regeneration_then_resume_equals_uninterrupted(tmp_path, regenerated, chats, python_env):
    """SIGKILL after the second stored window (of three), resume: same records, same ids, masks and states."""
    import hs_dataset

    out = tmp_path / "killed"
    script = (
        "import sys; from hs_dataset.config import load_card; from hs_dataset.pipeline.build import build_dataset\n"
        "card = load_card('tiny-deepseek-hf').with_overrides(regenerate={'enabled': True, "
        f"'max_new_tokens': {NEW_TOKENS}, "
        "'thinking': 'off', 'concurrency': 2}, backend={'batch_size': 2}, model={'path': sys.argv[3]})\n"
        "build_dataset(card, sys.argv[1], source=sys.argv[2], device='cpu')\n"
    )
    from hs_dataset.demo.tiny_model import build_tiny_deepseek

    argv = [sys.executable, "-c", script, str(out), str(chats), str(build_tiny_deepseek())]
    killed = subprocess.run(argv, env={**python_env, "HS_DATASET_CRASH_AT": "regenerate.after_chunk:2"}, capture_output=True, timeout=600)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert len(records(out)) == 4  # two windows of two stored, nothing captured yet
    with open(out / "regenerated.jsonl", "ab") as f:  # a torn chunk, as a kill mid-append leaves it
        f.write(b'{"records":[{"sample_id":"three-turns","tu')
    env = {k: v for k, v in python_env.items() if k != "HS_DATASET_CRASH_AT"}
    done = subprocess.run(argv, env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    ref_dir, _ = regenerated
    assert records(out) == records(ref_dir)
    a, b = hs_dataset.open_dataset(out), hs_dataset.open_dataset(ref_dir)
    rows_a = {a[i]["sample_id"]: a[i] for i in range(len(a))}
    rows_b = {b[i]["sample_id"]: b[i] for i in range(len(b))}
    assert sorted(rows_a) == sorted(rows_b)
    for sid, row in rows_a.items():
        for key in ("input_ids", "loss_mask"):  # what was regenerated and supervised: identical
            assert torch.equal(row[key], rows_b[sid][key]), (sid, key)
        for key in ("aux_hidden_states", "final_hidden_state"):
            # states: same forward, but this process and the child may run torch with different
            # thread counts, which changes float32 reduction order in the last bits
            got, want = row[key].double(), rows_b[sid][key].double()
            rel = float((got - want).norm() / want.norm().clamp_min(1e-12))
            assert rel <= 1e-6, (sid, key, rel)


def test_resume_refuses_a_record_with_an_id_just_above_the_models_vocabulary(tmp_path, regenerated, tiny_card, hf_backend, chats):
    """An edited record whose id is the model's vocab_size + 1 (far below the 16,777,216 ceiling) is refused on resume,
    naming the file, the line and the model's bound: a resumed build captures stored records as they are."""
    import shutil

    from hs_dataset.errors import FormatError
    from hs_dataset.pipeline.build import build_dataset

    ref_dir, _ = regenerated
    out = tmp_path / "edited"
    shutil.copytree(ref_dir, out)
    vocab = json.loads((out / "manifest.json").read_text())["metadata"]["vocab_size"]
    path = out / "regenerated.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    chunk = json.loads(lines[1])
    chunk["records"][0]["input_ids"][0] = vocab + 1
    lines[1] = json.dumps(chunk) + "\n"
    path.write_text("".join(lines))
    with pytest.raises(FormatError) as caught:
        build_dataset(regen_card(tiny_card), out, source=str(chats), backend=hf_backend)
    message = str(caught.value)
    assert message.startswith(f"{path}: line 2 records[0]: sample {chunk['records'][0]['sample_id']!r}: "), message
    assert f"input_ids[0] = {vocab + 1} is outside the vocabulary [0, {vocab});" in message and "\n" not in message


def test_verify_refuses_a_rehashed_record_with_an_id_just_above_the_models_vocabulary(tmp_path, regenerated):
    """A record edited to the model's vocab_size + 1 and its sha256 re-recorded is self-consistent: verify checks its ids
    against the vocabulary the manifest records, not only the 16,777,216 ceiling."""
    from hs_dataset.formats.hashing import sha256_file
    from hs_dataset.formats.manifest import Manifest

    path = tampered_copy(regenerated[0], tmp_path / "ds")
    vocab = Manifest.load(path.parent).metadata.vocab_size
    lines = path.read_text().splitlines(keepends=True)
    chunk = json.loads(lines[0])
    chunk["records"][0]["turns"][0]["token_ids"][0] = vocab + 1
    lines[0] = json.dumps(chunk) + "\n"
    path.write_text("".join(lines))
    manifest = Manifest.load(path.parent)
    entry = manifest.metadata.regeneration
    fixed = entry.with_file("regenerated.jsonl", replace(entry.files["regenerated.jsonl"], sha256=sha256_file(path)))
    manifest.metadata = replace(manifest.metadata, regeneration=fixed)
    manifest.save(path.parent)
    text = problems(path.parent)
    sid = chunk["records"][0]["sample_id"]
    assert f"{path}: line 1 records[0]: sample {sid!r}: turns[0].token_ids[0] = {vocab + 1} is outside the vocabulary [0, {vocab})" in text


def test_push_publishes_the_regenerated_conversations(regenerated):
    from hs_dataset.formats.manifest import Manifest
    from hs_dataset.hub.upload import _regenerated_files

    out, _ = regenerated
    assert _regenerated_files(Manifest.load(out).metadata) == ["regenerated.jsonl"]


def test_drop_policy_counts_and_drops(tmp_path, tiny_card, hf_backend, chats):
    from hs_dataset.pipeline.build import build_dataset

    report = build_dataset(
        regen_card(tiny_card, policy="drop", max_new_tokens=2), tmp_path / "d", source=str(chats), backend=hf_backend, num_samples=2
    )
    regen = report.regeneration
    assert regen["hit_max_new_tokens"] == 2 and regen["dropped"] == 2 and report.samples_written == 0
    assert "regenerated" in report.summary() and "dropped 2" in report.summary()


# ---------------------------------------------------------------------------- verify and merge of regenerated files
def tampered_copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst / "regenerated.jsonl"


def problems(out: Path) -> str:
    from hs_dataset.formats.verify import verify_dataset

    result = verify_dataset(out, check_values=False)
    assert not result.ok, "SILENT: verify passed a tampered regenerated file"
    return "\n".join(result.problems)


def test_verify_accepts_the_regenerated_build(regenerated):
    from hs_dataset.formats.verify import verify_dataset

    result = verify_dataset(regenerated[0])
    assert result.ok, result.problems


@pytest.mark.parametrize("damage", ["flipped byte", "truncated line", "extra record", "missing file", "symlinked file"])
def test_verify_reports_a_tampered_regenerated_file(tmp_path, regenerated, damage):
    path = tampered_copy(regenerated[0], tmp_path / "ds")
    data = path.read_bytes()
    if damage == "flipped byte":
        at = data.index(b'"sample_id"') + 2
        path.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :])
        expect = "sha256"
    elif damage == "truncated line":
        path.write_bytes(data[:-20])
        expect = "sha256"
    elif damage == "extra record":
        extra = {
            "sample_id": "planted",
            "turns": [],
            "messages": [],
            "input_ids": [1, 2],
            "loss_spans": [[1, 2]],
            "supervised_turns": [],
            "dropped": None,
        }
        path.write_bytes(data + json.dumps({"records": [extra]}).encode() + b"\n")
        expect = "sha256"
    elif damage == "missing file":
        path.unlink()
        expect = "missing"
    else:
        moved = tmp_path / "elsewhere.jsonl"
        path.rename(moved)
        path.symlink_to(moved)
        expect = "symbolic link"
    text = problems(path.parent)
    assert "regenerated.jsonl" in text and "metadata.regeneration.files" in text and expect in text, text


def test_verify_reports_a_kept_conversation_missing_from_the_shards(tmp_path, regenerated):
    """A consistent file (manifest re-hashed) naming a kept conversation that no shard stores."""
    from hs_dataset.formats.hashing import sha256_file
    from hs_dataset.formats.manifest import Manifest

    path = tampered_copy(regenerated[0], tmp_path / "ds")
    extra = {
        "sample_id": "never-captured",
        "turns": [],
        "messages": [],
        "input_ids": [1, 2],
        "loss_spans": [[1, 2]],
        "supervised_turns": [],
        "dropped": None,
    }
    with open(path, "ab") as f:
        f.write(json.dumps({"records": [extra]}).encode() + b"\n")
    manifest = Manifest.load(path.parent)
    entry = manifest.metadata.regeneration.with_file("regenerated.jsonl", RegeneratedFile(sha256=sha256_file(path), records=6))
    manifest.metadata = replace(manifest.metadata, regeneration=entry)
    manifest.save(path.parent)
    assert "'never-captured'" in problems(path.parent)


@pytest.fixture(scope="module")
def rank_parts(tmp_path_factory, tiny_card, hf_backend, chats) -> list[Path]:
    from hs_dataset.pipeline.build import build_dataset

    root = tmp_path_factory.mktemp("regen-ranks")
    for rank in range(2):
        build_dataset(regen_card(tiny_card), root / f"rank{rank}", source=str(chats), backend=hf_backend, rank=rank, world_size=2)
    return [root / "rank0", root / "rank1"]


def test_merge_of_regenerated_ranks_verifies_and_keeps_every_record(tmp_path, rank_parts, regenerated):
    from hs_dataset.formats.merge import merge_datasets
    from hs_dataset.formats.regenerated import RegeneratedStore
    from hs_dataset.formats.verify import verify_dataset

    manifest = merge_datasets(rank_parts, tmp_path / "merged")
    files = manifest.metadata.regeneration.files
    assert sorted(files) == ["part-00000/rank00000-regenerated.jsonl", "part-00001/rank00001-regenerated.jsonl"]
    assert "file" not in manifest.metadata.regeneration.to_json()
    result = verify_dataset(tmp_path / "merged")
    assert result.ok and result.samples == len(CONVERSATIONS), result.problems
    merged = {}
    for name in files:
        part, _, base = name.partition("/")
        merged.update(RegeneratedStore(tmp_path / "merged" / part, base).records)
    assert sorted(merged) == sorted(records(regenerated[0]))


def _part_like(src: Path, dst: Path, change) -> Path:
    """A copy of part ``src`` whose regeneration record is ``change(record)``, identity recomputed (as a build wrote it)."""
    import shutil

    from hs_dataset.formats.identity import identity_fingerprint
    from hs_dataset.formats.manifest import Manifest

    shutil.copytree(src, dst)
    manifest = Manifest.load(dst)
    manifest.metadata = replace(manifest.metadata, regeneration=change(manifest.metadata.regeneration))
    manifest.identity = identity_fingerprint(manifest.metadata)
    manifest.save(dst)
    return dst


def test_merge_takes_a_part_that_predates_structure_ids_but_refuses_other_ones(tmp_path, rank_parts):
    """Structure ids follow from the chat template (in the identity): a part that does not record them still merges,
    a part that records others does not."""
    from hs_dataset.errors import ForeignDatasetError
    from hs_dataset.formats.merge import merge_datasets

    older = _part_like(rank_parts[1], tmp_path / "older", lambda entry: entry.without("structure_token_ids"))
    merged = merge_datasets([rank_parts[0], older], tmp_path / "merged")
    assert merged.metadata.regeneration.structure_token_ids  # the first part's record
    other = _part_like(rank_parts[1], tmp_path / "other", lambda entry: replace(entry, structure_token_ids=entry.structure_token_ids[1:]))
    with pytest.raises(ForeignDatasetError, match="metadata.regeneration.structure_token_ids"):
        merge_datasets([rank_parts[0], other], tmp_path / "out")


@pytest.mark.parametrize("change", ["max_new_tokens", "seed", "temperature", "model_fingerprint", "no regeneration"])
def test_merge_refuses_parts_regenerated_differently(tmp_path, rank_parts, change):
    """Other generation settings (identity fields) or another engine behind them: refused before the output exists.

    Made here by editing a copy's manifest and recomputing its identity, as another build would have written it.
    """
    import shutil

    from hs_dataset.errors import ForeignDatasetError
    from hs_dataset.formats.identity import identity_fingerprint
    from hs_dataset.formats.manifest import Manifest
    from hs_dataset.formats.merge import merge_datasets

    other = tmp_path / "rank1-other"
    shutil.copytree(rank_parts[1], other)
    manifest = Manifest.load(other)
    entry = manifest.metadata.regeneration
    if change == "model_fingerprint":
        manifest.metadata = replace(
            manifest.metadata, regeneration=replace(entry, generator={**entry.generator, "model_fingerprint": "f" * 64})
        )
    elif change == "no regeneration":
        manifest.metadata = manifest.metadata.without("regeneration")
    else:
        value = {"max_new_tokens": NEW_TOKENS + 1, "seed": 1234, "temperature": 0.7}[change]
        manifest.metadata = replace(manifest.metadata, regeneration=replace(entry, **{change: value}))
    manifest.identity = identity_fingerprint(manifest.metadata)  # a part of another build, not an edited manifest
    manifest.save(other)
    # the generation settings are part of the identity (formats/identity.py); the engine behind them is compared apart
    field = {"model_fingerprint": "metadata.regeneration.*generator", "no regeneration": r"regenerate\.enabled: true"}.get(
        change, rf"regenerate\.{change}: "
    )
    with pytest.raises(ForeignDatasetError, match=field):
        merge_datasets([rank_parts[0], other], tmp_path / "out")
    assert not (tmp_path / "out").exists()
