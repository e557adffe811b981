"""kill -9 a regenerating build on the REAL SGLang server at three points, resume it: nothing stored is regenerated, nothing is lost.

The build (``tiny-deepseek-sglang``, regeneration through the shared CPU capture server,
several conversations in flight, capture overlapping generation) runs in a child process
that SIGKILLs itself at a crash point of :mod:`hs_dataset.faults`:

* ``regenerate.after_turn`` -- an answer arrived; conversations are half regenerated, others in flight;
* ``regenerate.mid_chunk`` -- half a line of finished conversations is in ``regenerated.jsonl``;
* ``regenerate.after_chunk`` -- a line is stored, its conversations not yet captured.

After each kill: every stored record is a whole conversation (all its turns) and the file
has no torn line once opened. The resumed build (in this process) must then: read back
every stored record (counted ``from_store``) and regenerate only the others (counted
``regenerated``), leave the stored lines byte for byte, store every source conversation
once, verify, and hold for every sample exactly the ids and loss mask of its stored record.
Needs ``.sglang-venv``, like the other real-server tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hs_dataset.capture.sglang.backend import SGLangBackend
from hs_dataset.formats.regenerated import RegeneratedStore
from tests.fixtures.chat_rows import multi_turn_chats
from tests.fixtures.sglang_server import staged_files

pytestmark = pytest.mark.sglang

NEW_TOKENS = 8


def conversations() -> list[dict]:
    """14 chats of 1 to 3 user turns, each answered (the answers are rewritten)."""
    return multi_turn_chats(14)


def regen_card(tiny_model: str):
    from hs_dataset.config import load_card

    return load_card("tiny-deepseek-sglang").with_overrides(
        regenerate={"enabled": True, "max_new_tokens": NEW_TOKENS, "thinking": "off", "concurrency": 4},
        model={"path": tiny_model},
    )


CHILD = (
    "import sys; from hs_dataset.config import load_card; from hs_dataset.pipeline.build import build_dataset\n"
    "card = load_card('tiny-deepseek-sglang').with_overrides(regenerate={'enabled': True, "
    f"'max_new_tokens': {NEW_TOKENS}, 'thinking': 'off', "
    "'concurrency': 4}, model={'path': sys.argv[3]})\n"
    "build_dataset(card, sys.argv[1], source=sys.argv[2], servers=[sys.argv[4]])\n"
)


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("regen-kill-src") / "chats.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in conversations()))
    return path


@pytest.mark.parametrize("point", ["regenerate.after_turn:6", "regenerate.mid_chunk:2", "regenerate.after_chunk:2"])
def test_kill_during_regeneration_then_resume(point, tmp_path, chats, capture_server, tiny_model, python_env):
    import hs_dataset
    from hs_dataset.formats.verify import verify_dataset
    from hs_dataset.pipeline.build import build_dataset

    out = tmp_path / "ds"
    argv = [sys.executable, "-c", CHILD, str(out), str(chats), tiny_model, capture_server.url]
    killed = subprocess.run(argv, env={**python_env, "HS_DATASET_CRASH_AT": point}, capture_output=True, timeout=600)
    assert killed.returncode == -9, killed.stderr.decode()[-3000:]

    turns = {row["id"]: len(row["messages"]) // 2 for row in conversations()}
    raw = (out / "regenerated.jsonl").read_bytes() if (out / "regenerated.jsonl").exists() else b""
    stored = RegeneratedStore(out).records  # opening cuts a torn last line, as the resumed build does
    kept = (out / "regenerated.jsonl").read_bytes() if stored else b""
    if point.startswith("regenerate.mid_chunk"):
        assert len(raw) > len(kept) and not raw.endswith(b"\n"), "the kill left no torn line"
    assert len(stored) < len(turns), f"the child stored every conversation before {point}"
    for sid, record in stored.items():  # never half a conversation
        assert len(record["turns"]) == turns[sid] and record["input_ids"], (sid, record["turns"])

    card = regen_card(tiny_model)
    backend = SGLangBackend.from_card(card, servers=[capture_server.url])
    try:
        report = build_dataset(card, out, source=str(chats), backend=backend)
    finally:
        backend.close()
    # the killed child's captures in flight were dumped for nobody: the shared server's later tests must not see them
    leftovers = staged_files(capture_server.staging_dir)
    assert not [n for n in leftovers if n.startswith(f"hs-{backend.run_id}")], leftovers
    for name in leftovers:
        (Path(capture_server.staging_dir) / name).unlink(missing_ok=True)
    regen = report.regeneration
    print(
        f"\n{point}: {len(stored)} conversations stored before the kill; the resumed build read {regen['from_store']} back, "
        f"regenerated {regen['regenerated']} ({regen['generated_tokens']} tokens)"
    )
    assert regen["from_store"] == len(stored) and regen["regenerated"] == len(turns) - len(stored), regen
    assert regen["failed"] == 0 and not report.capture_failures, report.summary()
    assert (out / "regenerated.jsonl").read_bytes().startswith(kept), "a stored line changed"
    final = RegeneratedStore(out).records
    assert sorted(final) == sorted(turns) and all(final[sid] == record for sid, record in stored.items())
    result = verify_dataset(out)
    assert result.ok, result.problems
    data = hs_dataset.open_dataset(out)
    assert sorted(data.sample_ids) == sorted(turns), "a conversation was lost or stored twice"
    for item in data:
        record = final[item["sample_id"]]
        assert item["input_ids"].tolist() == record["input_ids"], item["sample_id"]
        mask = [any(a <= i < b for a, b in record["loss_spans"]) for i in range(len(record["input_ids"]))]
        assert item["loss_mask"].tolist() == mask, item["sample_id"]
