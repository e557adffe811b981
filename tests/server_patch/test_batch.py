"""The split of a forward pass into our requests' rows: which rids are ours, remembered per rid."""

from __future__ import annotations

from hs_dataset.server_patch.batch import FOREIGN, INVALID, ONE_PASS, OURS, BatchView, RidKinds, split_decode
from hs_dataset.server_patch.contract.rid import make_one_pass_rid


def test_each_rid_is_classified_once_and_the_memory_starts_over_at_its_limit():
    kinds = RidKinds("hs-", limit=3)
    one_pass, plain = make_one_pass_rid("r1", 1, 4), "hs-r1-2-4"
    assert [kinds.of(k) for k in (one_pass, plain, "hs-bad", "HEALTH_CHECK_1", None, 7)] == [
        ONE_PASS,
        OURS,
        INVALID,
        FOREIGN,
        FOREIGN,
        FOREIGN,
    ]
    assert len(kinds._known) <= 3 and kinds.of(one_pass) == ONE_PASS


def test_a_decode_step_keeps_each_of_our_rows_in_batch_order():
    one_pass = make_one_pass_rid("r1", 1, 4)
    batch = BatchView(mode="DECODE", extend_seq_lens=None, rids=["other", one_pass, "hs-r1-2-4", "hs-nope"])
    split = split_decode(batch, RidKinds("hs-"))
    assert [(r.key, r.offset, r.one_pass) for r in split.ours] == [(one_pass, 1, True), ("hs-r1-2-4", 2, False)]
    assert (split.requests, split.foreign, split.foreign_rids, split.invalid_rids) == (4, 1, ["other"], ["hs-nope"])
