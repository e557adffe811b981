"""One-pass rows through the capture core, without SGLang: prefill and decode passes in, each request's pieces out.

The forward thread reuses the last decode step's plan (which rows belong to which one-pass request) while the
next step is the same batch; these tests change the batch between steps in every way a scheduler does -- the same
requests again, reordered, one refused, one finished, one prefilled meanwhile -- and check every row of every piece
against what was sent: its request, its position, its token and its states.
"""

from __future__ import annotations

import os

import torch
from hypothesis import example, given, settings, strategies as st
from safetensors import safe_open

from hs_dataset.server_patch.batch import BatchView
from hs_dataset.server_patch.contract.dump import parse_piece_name
from hs_dataset.server_patch.contract.rid import make_one_pass_rid
from tests.fixtures.capture_core import H, K, make_core

PROMPT = 4


def rid(k: int) -> str:
    return make_one_pass_rid("t", k, PROMPT)


def token(k: int, position: int) -> int:
    return 1000 * k + position


def rows_for(ks: list[int], positions: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, aux [N, K*H] and final [N, H] of rows of requests ``ks`` at ``positions``: every value names its row."""
    ids = torch.tensor([token(k, p) for k, p in zip(ks, positions, strict=True)], dtype=torch.int64)
    aux = ids.double().view(-1, 1).expand(-1, K * H).float().contiguous()
    return ids, aux, ids.float().view(-1, 1).expand(-1, H).contiguous()


def prefill(core, ks: list[int]) -> None:
    """One extend pass: the PROMPT rows of each request in ``ks``."""
    req = [k for k in ks for _ in range(PROMPT)]
    pos = [p for _ in ks for p in range(PROMPT)]
    ids, aux, final = rows_for(req, pos)
    batch = BatchView(
        mode="EXTEND", extend_seq_lens=[PROMPT] * len(ks), extend_prefix_lens=[0] * len(ks), rids=[rid(k) for k in ks], input_ids=ids
    )
    core.process(batch, aux=aux, final_prenorm=final)


def decode(core, ks: list[int], at: dict[int, int], foreign: int = 0) -> None:
    """One decode step of requests ``ks`` (each at its next position ``at[k]``), after ``foreign`` other clients' rows."""
    pos = [at[k] for k in ks]
    ids, aux, final = rows_for(ks, pos)
    if foreign:
        ids = torch.cat([torch.full((foreign,), 7), ids])
        aux = torch.cat([torch.zeros(foreign, K * H), aux])
        final = torch.cat([torch.zeros(foreign, H), final])
        pos = [0] * foreign + pos
    rids = [f"other-{i}" for i in range(foreign)] + [rid(k) for k in ks]
    batch = BatchView(mode="DECODE", extend_seq_lens=None, rids=rids, input_ids=ids, positions=torch.tensor(pos, dtype=torch.int64))
    core.process(batch, aux=aux, final_prenorm=final)
    for k in ks:
        at[k] += 1


def pieces(core) -> dict[str, list[tuple[int, int, float, float]]]:
    """(position, token, aux value, final value) of every row of every piece, by request, in piece order."""
    out: dict[str, list] = {}
    stage = core.config.staging_dir
    for name in sorted(os.listdir(stage), key=lambda n: (parse_piece_name(n) or ("", 0))[1]):
        parsed = parse_piece_name(name)
        if parsed is None:
            continue
        with safe_open(os.path.join(stage, name), "pt") as f:
            t = {k: f.get_tensor(k) for k in f.keys()}
        aux, final = t["aux_hidden_states"], t["final_hidden_state"]
        assert aux.shape[1:] == (K, H) and bool((aux == aux[:, :1, :1]).all()) and bool((final == final[:, :1]).all())
        for i, (p, tok) in enumerate(zip(t["positions"].tolist(), t["input_ids"].tolist(), strict=True)):
            out.setdefault(parsed[0], []).append((p, tok, float(aux[i, 0, 0]), float(final[i, 0])))
    return out


def expected(k: int, positions) -> list[tuple[int, int, float, float]]:
    return [(p, token(k, p), float(token(k, p)), float(token(k, p))) for p in positions]


def test_every_row_reaches_its_request_however_the_decode_batch_changes(tmp_path):
    core = make_core(tmp_path, one_pass_piece_rows=5)
    try:
        at = dict.fromkeys(range(5), PROMPT)
        prefill(core, [0, 1, 2])
        for _ in range(4):  # the same batch: the plan is reused
            decode(core, [0, 1, 2], at)
        plan = core._plan
        decode(core, [0, 1, 2], at)
        assert core._plan is plan  # reused, not made again
        decode(core, [2, 0, 1], at)  # reordered
        assert core._plan is not plan
        decode(core, [2, 0, 1], at, foreign=2)  # other clients' requests join in front
        core.collector.refuse(rid(1), "test")  # refused: its later rows are dropped
        decode(core, [2, 0, 1], at, foreign=2)
        dropped_at = at[1] - 1
        prefill(core, [3])  # a new request prefilled between two steps of the same batch
        decode(core, [2, 0, 1, 3], at, foreign=2)
        decode(core, [2, 0, 3], at)  # 1 finished
        decode(core, [2, 0, 3], at)
        assert core.flush(10)
    finally:
        core.close()
    got = pieces(core)
    assert got[rid(0)] == expected(0, range(at[0]))
    assert got[rid(2)] == expected(2, range(at[2]))
    assert got[rid(3)] == expected(3, range(at[3]))
    # a refused request's rows are useless (its client captures it by prefill): rows filed after the refusal are
    # dropped, and none from the step after it is ever written
    assert got.get(rid(1), []) == expected(1, range(len(got.get(rid(1), [])))) and len(got.get(rid(1), [])) <= dropped_at
    assert core.stats["one_pass_rows"] == sum(len(v) for v in got.values())


def test_a_refusal_between_steps_of_the_same_batch_is_seen_at_the_next_step(tmp_path):
    core = make_core(tmp_path, one_pass_piece_rows=64)
    try:
        at = {0: PROMPT, 1: PROMPT}
        prefill(core, [0, 1])
        decode(core, [0, 1], at)
        decode(core, [0, 1], at)
        core.collector.refuse(rid(0), "test")
        decode(core, [0, 1], at)
        assert [r.key for r in core._plan.kept] == [rid(1)]
        assert core.flush(10)
    finally:
        core.close()
    got = pieces(core)
    assert got.get(rid(0), []) == expected(0, range(len(got.get(rid(0), [])))) and len(got.get(rid(0), [])) <= PROMPT + 2
    assert got[rid(1)] == expected(1, range(at[1]))


def test_a_request_prefilled_between_steps_of_the_same_batch_is_known_gone_at_the_next_step(tmp_path):
    """A repair (prefill rows only, no decode step) between two steps of an unchanged batch: the next step tells the
    collector it is gone, so its rows go out at once rather than after the idle wait."""
    core = make_core(tmp_path, one_pass_piece_rows=64)
    try:
        at = {0: PROMPT}
        prefill(core, [0])
        decode(core, [0], at)
        prefill(core, [9])  # never decodes
        decode(core, [0], at)
        assert not core.collector._extended  # the step was planned anew: rid 9 was handed over as gone
        assert core.flush(10)
    finally:
        core.close()
    assert pieces(core)[rid(9)] == expected(9, range(PROMPT))


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), min_size=1, max_size=8))
@settings(max_examples=200, deadline=None)
@example([(0, 4), (0, 4)])  # one run
@example([(1, 1), (0, 1), (2, 1)])  # a decode step with gaps
@example([(0, 0), (3, 0)])  # no rows at all
def test_a_passes_block_layout_selects_each_requests_rows_in_order(spans):
    """Requests at ``gap`` rows after the last one's end, ``length`` rows each: the block is their rows, in order."""
    from hs_dataset.server_patch.batch import RequestSlice
    from hs_dataset.server_patch.core import _BlockLayout

    slices, offset = [], 0
    for k, (gap, length) in enumerate(spans):
        offset += gap
        slices.append(RequestSlice(f"r{k}", offset, length, 0, True))
        offset += length
    layout = _BlockLayout.of(slices, torch.device("cpu"))
    pass_rows = torch.arange(offset + 3) * 10
    block = pass_rows[layout.rows] if isinstance(layout.rows, slice) else pass_rows.index_select(0, layout.rows)
    expected = [10 * row for r in slices for row in range(r.offset, r.offset + r.length)]
    assert block.tolist() == expected
    starts = [sum(r.length for r in slices[:k]) for k in range(len(slices))]
    assert layout.owners == [(r.key, start, r.length) for r, start in zip(slices, starts, strict=True)]
