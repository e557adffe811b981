"""Any chat dataset in: each conversation shape from every local container, ``hf:`` through the local Hub stand-in,
unknown shapes counted with their keys, mixed shapes in one file, ``--columns``."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch

from tests.fixtures.hub_standin import HubStandIn

pytestmark = pytest.mark.filterwarnings("ignore:Use .content=<...>. to upload raw bytes:DeprecationWarning")

SHAPES = {
    "openai": [
        {
            "id": "o1",
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "call it",
                    "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}],
                },
                {"role": "tool", "content": "rain", "tool_call_id": "c0"},
                {"role": "assistant", "content": "Rain in Oslo."},
            ],
        }
    ],
    "ultrachat": [
        {
            "id": "u1",
            "prompt": "hi",
            "prompt_id": "p1",
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        }
    ],
    "sharegpt": [
        {
            "id": "s1",
            "conversations": [
                {"from": "system", "value": "be kind"},
                {"from": "human", "value": "weather?"},
                {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Oslo"}}'},
                {"from": "observation", "value": "rain"},
                {"from": "gpt", "value": "Rain in Oslo."},
            ],
        }
    ],
    "prompt_response": [{"id": "p1", "prompt": "Say yes.", "response": "Yes."}],
}
EXPECTED_TURNS = {"openai": 2, "ultrachat": 1, "sharegpt": 2, "prompt_response": 1}


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def read(source, tok, **opts):
    from hs_dataset.sources import SampleRules, SourceReport, iter_samples, open_source

    report = SourceReport()
    hub = opts.pop("hub", None)
    rows = open_source(source, hub=hub) if hub is not None else source
    samples = list(iter_samples(rows, tok, SampleRules(max_length=1024, **opts), report=report))
    return samples, report


def write_all_containers(rows: list[dict], root: Path, name: str) -> list[Path]:
    import datasets

    root.mkdir(parents=True, exist_ok=True)
    ds = datasets.Dataset.from_list(rows)
    jsonl = root / f"{name}.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds.save_to_disk(str(root / f"{name}-saved"))
    ds.to_parquet(str(root / f"{name}.parquet"))
    arrow = next((root / f"{name}-saved").glob("*.arrow"))
    return [jsonl, root / f"{name}-saved", root / f"{name}.parquet", arrow]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_shape_from_each_container(shape, tmp_path, tok):
    reference = None
    for path in write_all_containers(SHAPES[shape], tmp_path, shape):
        samples, report = read(path, tok)
        assert report.shapes == {shape: 1} and not report.issues, (path, report.to_dict())
        [sample] = samples
        assert sample.meta["shape"] == shape and sample.meta["assistant_messages"] == EXPECTED_TURNS[shape]
        if reference is None:
            reference = sample
        assert torch.equal(sample.input_ids, reference.input_ids) and torch.equal(sample.loss_mask, reference.loss_mask), path


def test_sharegpt_tools_render_like_openai(tok):
    """function_call/observation become a tool call and its result: the supervised tokens match the OpenAI form."""
    (s,), _ = read(SHAPES["sharegpt"], tok)
    text = tok.decode(s.input_ids[s.loss_mask].tolist())
    assert "get_weather" in text and "Rain in Oslo." in text
    assert "## Return of functions.get_weather:0" in tok.decode(s.input_ids.tolist())


def test_mixed_shapes_and_unknown_rows_in_one_file(tmp_path, tok):
    rows = [r for shape in sorted(SHAPES) for r in SHAPES[shape]]
    rows += [{"id": "x1", "text": "plain"}, {"id": "x2", "text": "again"}, {"id": "x3", "dialog": 5, "extra": 1}]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples, report = read(path, tok)
    assert len(samples) == 4
    assert report.shapes == {"openai": 1, "ultrachat": 1, "sharegpt": 1, "prompt_response": 1, "unknown": 3}
    assert report.unknown_keys == {"id,text": 2, "dialog,extra,id": 1}
    assert sorted(report.malformed) == [4, 5, 6] and "unknown shape, keys ['id', 'text']" in report.malformed[4]
    assert report.to_dict()["shapes"]["unknown"] == 3


def test_columns_map_other_names(tmp_path, tok):
    rows = [{"uid": "d1", "dialog": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    (plain,), _ = read([{"id": "d1", "messages": rows[0]["dialog"]}], tok)
    (mapped,), report = read(rows, tok, columns={"messages": "dialog", "id": "uid"})
    assert mapped.sample_id == "d1" and torch.equal(mapped.input_ids, plain.input_ids) and report.shapes == {"openai": 1}
    _, unmapped = read(rows, tok)
    assert unmapped.unknown_keys == {"dialog,uid": 1}


def test_split_of_a_saved_datasetdict(tmp_path, tok):
    import datasets

    dd = datasets.DatasetDict(
        {"train_sft": datasets.Dataset.from_list(SHAPES["prompt_response"]), "test_sft": datasets.Dataset.from_list(SHAPES["ultrachat"])}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    samples, _report = read(tmp_path / "dd", tok, hub={"split": "test_sft"})
    assert [s.sample_id for s in samples] == ["u1"]
    from hs_dataset.errors import SourceError

    with pytest.raises(SourceError, match="holds splits"):
        read(tmp_path / "dd", tok)


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The hub tests' stand-in Hub, with huggingface_hub and datasets pointed at it; every other host refused."""
    import datasets.config
    from huggingface_hub import constants

    real = socket.getaddrinfo

    def local_only(host, *args, **kwargs):
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise OSError(f"refusing to resolve {host!r}: only the local stand-in Hub may be contacted")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", local_only)
    hub = HubStandIn(tmp_path / "hub-server")
    for name, value in {
        "ENDPOINT": hub.url,
        "HUGGINGFACE_CO_URL_TEMPLATE": hub.url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_CACHE": str(tmp_path / "hub-cache"),
    }.items():
        monkeypatch.setattr(constants, name, value)
    for name, value in {
        "HF_ENDPOINT": hub.url,
        "HUB_DATASETS_URL": hub.url + "/datasets/{repo_id}/resolve/{revision}/{path}",
        "HF_HUB_OFFLINE": False,
        "HF_DATASETS_OFFLINE": False,
        "USE_PARQUET_EXPORT": False,
        "HF_DATASETS_CACHE": tmp_path / "ds-cache",
    }.items():
        monkeypatch.setattr(datasets.config, name, value)
    yield hub
    hub.close()


@pytest.mark.parametrize("streaming", [True, False])
def test_hf_source_through_the_local_hub(standin, tmp_path, tok, streaming):
    import datasets
    from huggingface_hub import HfApi

    api = HfApi(endpoint=standin.url, token=False)
    api.create_repo("me/chats", repo_type="dataset")
    train = tmp_path / "up" / "data" / "train_sft-00000-of-00001.parquet"
    train.parent.mkdir(parents=True)
    rows = [dict(r, id=f"r{i}") for i, r in enumerate(SHAPES["sharegpt"] * 3)]
    datasets.Dataset.from_list(rows).to_parquet(str(train))
    api.upload_folder(folder_path=str(tmp_path / "up"), repo_id="me/chats", repo_type="dataset")
    samples, report = read("hf:me/chats", tok, hub={"split": "train_sft", "streaming": streaming})
    assert [s.sample_id for s in samples] == ["r0", "r1", "r2"] and report.shapes == {"sharegpt": 3}
    assert report.total_rows in (3, None if streaming else 3)
    from hs_dataset.errors import SourceError

    with pytest.raises(SourceError, match="split 'nope'"):
        read("hf:me/chats", tok, hub={"split": "nope", "streaming": streaming})
