"""One-pass assembly on the client, without a server: pieces planted in a staging dir, checked and placed by position.

The real-server path (generations, repairs, the version matrix, kill -9) is tests/capture/sglang/test_one_pass.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hs_dataset.capture.sglang.dumps import ExpectedDump
from hs_dataset.capture.sglang.one_pass import Assembly, SharedPrefixes, Source, common_prefix, missing_ranges
from hs_dataset.capture.sglang.pieces import MAX_STEPS_PAST, PieceError, list_pieces
from hs_dataset.regenerate.generator import OnePassTrace, TracedGeneration
from hs_dataset.sample import TokenizedSample
from hs_dataset.server_patch.contract.dump import DUMP_FORMAT, DUMP_VERSION, ONE_PASS_PATH, piece_name
from hs_dataset.server_patch.contract.rid import make_one_pass_rid

K, H = 2, 8
EXPECTED = ExpectedDump((1, 2), torch.float32, H)


def states_for(ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Made-up states that name their token and position, so a misplaced row shows."""
    base = (ids[positions].double() * 1000 + positions.double()).float()
    aux = base[:, None, None].expand(len(positions), K, H).clone()
    return aux, base[:, None].expand(len(positions), H).clone()


def plant(stage: Path, rid: str, k: int, ids: torch.Tensor, positions: list[int], **changes) -> Path:
    """A piece file as the server writes it; ``changes``: header metadata to change (None: leave the key out),
    ``tensors`` to replace."""
    changes = dict(changes.pop("meta", {}), **changes)
    pos = torch.tensor(positions, dtype=torch.int64)
    inside = pos.clamp(max=len(ids) - 1)
    aux, final = states_for(ids, inside)
    tensors = {"input_ids": ids[inside].clone(), "positions": pos, "aux_hidden_states": aux, "final_hidden_state": final}
    tensors.update(changes.pop("tensors", {}))
    meta = {
        "format": DUMP_FORMAT,
        "version": DUMP_VERSION,
        "rid": rid,
        "hf_aux_layer_ids": json.dumps(list(EXPECTED.aux_layer_ids)),
        "final_state": "pre_norm",
        "sglang_version": "test",
        "dtype": "float32",
        "capture_path": ONE_PASS_PATH,
        "piece": str(k),
    }
    meta = {key: value for key, value in {**meta, **changes}.items() if value is not None}
    path = stage / piece_name(rid, k)
    save_file(tensors, str(path), metadata=meta)
    return path


def sample_of(ids: list[int]) -> TokenizedSample:
    t = torch.tensor(ids, dtype=torch.int64)
    return TokenizedSample("s", t, torch.ones(len(ids), dtype=torch.bool))


def generation(rid: str, ids: list[int], cached: int | None) -> TracedGeneration:
    return TracedGeneration(OnePassTrace(rid, "http://x", cached), tuple(ids))


def test_rows_placed_by_position_first_kept_and_late_steps_dropped(tmp_path):
    ids = list(range(10, 30))  # 20 tokens: a 12-token prompt, an 8-token answer
    sample = sample_of(ids)
    rid = make_one_pass_rid("r1", 1, 12)
    src = Source.of_generation(generation(rid, ids, 4), str(tmp_path), sample.input_ids)
    assert src.expected == range(4, 19)  # after the cache hit, before the last (never fed) token
    plant(tmp_path, rid, 7, sample.input_ids, [4, 5, 6, 7, 8, 9, 10, 11])  # the prefill after the hit
    plant(tmp_path, rid, 9, sample.input_ids, [12, 13, 13, 14])  # a position twice: the first row wins
    plant(tmp_path, rid, 11, sample.input_ids, [15, 16, 17, 18, 19, 20])  # 19: the overlap step; 20: past the answer
    assembly = Assembly(sample, EXPECTED)
    assert [Path(p).name for p in list_pieces(str(tmp_path), rid)] == [piece_name(rid, k) for k in (7, 9, 11)]
    for path in src.new_pieces():
        assembly.take(src, path)
    assert assembly.covers([src]) and assembly.missing() == [(0, 4)]
    assert list_pieces(str(tmp_path), rid) == []  # handed back
    want_aux, want_final = states_for(sample.input_ids, torch.arange(4, 20))
    assert torch.equal(assembly.tensors["final_hidden_state"][4:], want_final)
    assert torch.equal(assembly.tensors["aux_hidden_states"][4:], want_aux)


def test_an_earlier_turn_counts_only_up_to_where_it_differs(tmp_path):
    final_ids = [1, 2, 3, 4, 5, 6, 7, 8]
    earlier = [1, 2, 3, 9, 9]  # the template rendered the earlier answer differently from position 3 on
    rid = make_one_pass_rid("r1", 1, 3)
    sample = sample_of(final_ids)
    src = Source.of_generation(generation(rid, earlier, 0), str(tmp_path), sample.input_ids)
    assert src.usable == 3 and src.expected == range(3)
    plant(tmp_path, rid, 0, torch.tensor(earlier), [0, 1, 2, 3])
    assembly = Assembly(sample, EXPECTED)
    assembly.take(src, src.new_pieces()[0])
    assert assembly.filled.tolist() == [True] * 3 + [False] * 5


@pytest.mark.parametrize(
    "change, words",
    [
        ({"meta": {"rid": "hs-r1-2-g5"}}, "names request"),
        ({"meta": {"capture_path": "prefill"}}, "names request"),
        ({"meta": {"hf_aux_layer_ids": "[1, 3]"}}, "HF layers"),
        ({"tensors": {"input_ids": torch.tensor([1, 2, 99])}}, "holds token 99"),
        ({"tensors": {"positions": torch.tensor([0, 1, 5 + MAX_STEPS_PAST])}}, "outside the request"),
        ({"tensors": {"positions": torch.tensor([-1, 0, 1])}}, "outside the request"),
        ({"tensors": {"extra": torch.zeros(3)}}, "holds tensors"),
        ({"tensors": {"final_hidden_state": torch.zeros(3, H + 1)}}, "states"),
    ],
)
def test_a_piece_that_is_not_its_requests_rows_is_refused(tmp_path, change, words):
    ids = [1, 2, 3, 4, 5]
    rid = make_one_pass_rid("r1", 1, 5)
    sample = sample_of(ids)
    src = Source.of_generation(generation(rid, ids, 0), str(tmp_path), sample.input_ids)
    path = plant(tmp_path, rid, 0, sample.input_ids, [0, 1, 2], **change)
    with pytest.raises(PieceError, match=words) as err:
        Assembly(sample, EXPECTED).take(src, str(path))
    assert "\n" not in str(err.value) and piece_name(rid, 0) in str(err.value)
    assert not path.exists()  # handed back whatever it held


@pytest.mark.parametrize(
    "meta, says",
    [
        ({"version": "0"}, "has format 'hs_dataset.dump' v'0', expected hs_dataset.dump v1: update hs_dataset on the server"),
        ({"rid": "hs-r1-2-g5"}, "names request 'hs-r1-2-g5' ('one_pass'), not {rid}"),
        ({"final_state": "post_norm"}, "holds a 'post_norm' final state, expected pre_norm"),
        ({"hf_aux_layer_ids": "[1, 3]"}, "holds HF layers [1, 3], expected [1, 2]"),
    ],
    ids=["format", "request", "final-state", "layers"],
)
def test_a_piece_and_a_dump_share_one_header_metadata_check_and_its_words(tmp_path, meta, says):
    """The one-pass piece and the prefill dump are checked by one function (``dumps.metadata_problem``): the same
    words after each file's name."""
    from hs_dataset.capture.base import CaptureFailure
    from hs_dataset.capture.sglang.dumps import check_dump
    from hs_dataset.server_patch.contract.dump import dump_name

    ids = [1, 2, 3, 4, 5]
    rid = make_one_pass_rid("r1", 1, 5)
    sample = sample_of(ids)
    src = Source.of_generation(generation(rid, ids, 0), str(tmp_path), sample.input_ids)
    path = plant(tmp_path, rid, 0, sample.input_ids, [0, 1, 2], meta=meta)
    with pytest.raises(PieceError) as err:
        Assembly(sample, EXPECTED).take(src, str(path))
    assert str(err.value) == f"one-pass piece {piece_name(rid, 0)} {says.format(rid=rid)}"  # named once
    key = "hs-r1-1-5"  # a prefill request's dump with the same header metadata
    dump = plant(tmp_path, key, 0, sample.input_ids, [0, 1, 2, 3, 4], meta={"rid": key, "capture_path": None, "piece": None, **meta})
    dump = dump.rename(tmp_path / dump_name(key))
    failed = check_dump(str(dump), key, sample, EXPECTED)
    wording = says.replace(" ('one_pass')", "").format(rid=key)
    assert isinstance(failed, CaptureFailure) and failed.reason == f"dump {key} {wording}"


def test_a_piece_declaring_more_rows_than_its_request_can_hold_is_refused_unread(tmp_path):
    ids = [1, 2, 3]
    rid = make_one_pass_rid("r1", 1, 3)
    sample = sample_of(ids)
    src = Source.of_generation(generation(rid, ids, 0), str(tmp_path), sample.input_ids)
    path = plant(tmp_path, rid, 0, sample.input_ids, [0, 1, 2] * 5)  # 15 rows for a 3-token request
    with pytest.raises(PieceError, match="rows, expected 1 to 12"):
        Assembly(sample, EXPECTED).take(src, str(path))


def test_shared_prefix_rows_fill_only_a_sample_with_the_same_tokens_before(tmp_path):
    first, second, other = [5, 6, 7, 8, 9], [5, 6, 7, 1, 2, 3], [4, 6, 7, 1]
    store = SharedPrefixes(entries=2, tokens=4)
    done = Assembly(sample_of(first), EXPECTED)
    rid = make_one_pass_rid("r1", 1, 5)
    src = Source.of_generation(generation(rid, first, 0), str(tmp_path), done.sample.input_ids)
    done.take(src, str(plant(tmp_path, rid, 0, done.sample.input_ids, [0, 1, 2, 3, 4])))
    store.remember(done)
    target = Assembly(sample_of(second), EXPECTED)
    assert store.fill(target, 0, 3) and target.filled.tolist() == [True] * 3 + [False] * 3
    assert torch.equal(target.tensors["final_hidden_state"][:3], done.tensors["final_hidden_state"][:3])
    assert not store.fill(target, 0, 4)  # position 3 differs
    assert not store.fill(Assembly(sample_of(other), EXPECTED), 0, 2)  # position 0 differs


def test_helpers():
    assert common_prefix(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4, 5])) == 2
    assert common_prefix(torch.tensor([1, 2]), torch.tensor([1, 2, 4])) == 2
    assert missing_ranges(torch.tensor([False, True, False, False, True, False])) == [(0, 1), (2, 4), (5, 6)]


def test_the_generations_and_the_repairs_of_one_run_never_share_a_request_id(tmp_path, monkeypatch):
    """A repair and a generation of one run once drew ids from two counters: equal length, equal id, mixed pieces
    (seen on a CPU benchmark with 16 conversations in flight). One counter per run now serves both."""
    import asyncio

    from hs_dataset.capture.base import CaptureTarget
    from hs_dataset.capture.sglang import backend as backend_module
    from hs_dataset.capture.sglang.backend import SGLangBackend
    from hs_dataset.config import SGLangBackendSection, load_card

    be = SGLangBackend(
        SGLangBackendSection(name="sglang"), CaptureTarget(model_path=str(tmp_path), aux_layer_ids=[1]), servers=["http://127.0.0.1:9"]
    )
    be.endpoints[0].staging_dir = str(tmp_path)
    monkeypatch.setattr(SGLangBackend, "info", lambda self: type("Info", (), {"model_fingerprint": "f", "vocab_size": 100})())
    monkeypatch.setattr(SGLangBackend, "_choose_one_pass", lambda self, capture: True)
    sent: list[str] = []

    async def post(self, ep, rid, ids, recompute_from=None):
        sent.append(rid)
        raise backend_module.BadResponseError("not sent")

    monkeypatch.setattr(SGLangBackend, "_post_generate", post)
    try:
        gen = be.generator(load_card("tiny-deepseek-sglang").regenerate, tokenizer=None)
        sample = sample_of(list(range(1, 47)))
        for _ in range(3):
            sent.append(gen.body(list(range(1, 47)), params=_params())["rid"])
            assembly = Assembly(sample, ExpectedDump((1,), torch.float32, 8))
            asyncio.run(be._repair(assembly, [], be.endpoints[0], 40, 46))
        assert len(sent) == 6 and len(set(sent)) == 6, sent
    finally:
        be.close()


def _params():
    from hs_dataset.regenerate.generator import GenerationParams

    return GenerationParams(max_new_tokens=4)


def test_one_shared_listing_finds_each_requests_pieces_in_order(tmp_path):
    from hs_dataset.capture.sglang.pieces import PieceListing

    a, b = make_one_pass_rid("r1", 1, 5), make_one_pass_rid("r1", 2, 5)
    for rid, k in ((a, 2), (a, 0), (b, 1), (a, 10)):
        (tmp_path / piece_name(rid, k)).write_bytes(b"")
    (tmp_path / f".{piece_name(a, 3)}").write_bytes(b"")  # in progress: not yet a piece
    (tmp_path / f"{a}.refused").write_bytes(b"")
    listing = PieceListing(str(tmp_path), max_age_s=60)
    assert [Path(p).name for p in listing.pieces(a)] == [piece_name(a, k) for k in (0, 2, 10)]
    assert [Path(p).name for p in listing.pieces(b)] == list_pieces_names(tmp_path, b)
    (tmp_path / piece_name(b, 4)).write_bytes(b"")
    assert len(listing.pieces(b)) == 1  # within max_age_s the listing is reused
    assert len(PieceListing(str(tmp_path), max_age_s=0).pieces(b)) == 2
    assert PieceListing(str(tmp_path / "gone")).pieces(a) == []


def list_pieces_names(stage: Path, rid: str) -> list[str]:
    return [Path(p).name for p in list_pieces(str(stage), rid)]
