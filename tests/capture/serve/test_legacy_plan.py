"""`hs-dataset serve` for an SGLang without forward hooks whose source carries the patch (SGLang <= 0.5.5), and what
the patch's hook and the client make of it; without a server (the probe of the server Python is faked).

The real server runs in tests/server_patch/legacy/test_patched_server.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hs_dataset.capture.serve import plan as serve, probe
from hs_dataset.capture.serve.errors import ServeError
from hs_dataset.capture.serve.mechanisms.legacy import LEGACY_ENV
from hs_dataset.errors import ServerValidationError
from hs_dataset.server_patch.contract.legacy_header import BEGIN, carries_patch
from tests.fixtures.fake_sglang import ALWAYS, OLD_LAYER, fake_sglang

PATCHED_SOURCE = f"{BEGIN}{'0' * 64} (added by `hs-dataset patch apply`)\n" + OLD_LAYER


@pytest.fixture
def card():
    from hs_dataset.config import load_card

    return load_card("tiny-deepseek-sglang")


@pytest.fixture
def patched_env(monkeypatch, tmp_path):
    info = {
        "sglang": "0.5.5",
        "hs_dataset": True,
        "sgl_kernel": None,
        "sglang_dir": fake_sglang(tmp_path / "env", PATCHED_SOURCE, args=(), rids=False, eagle3=ALWAYS),
    }
    monkeypatch.setattr(probe, "probe_server_env", lambda python: dict(info))
    return info


def test_a_patched_release_without_hooks_is_served_through_the_patch(card, patched_env, tmp_path):
    from hs_dataset.server_patch.config import CaptureConfig

    card = card.with_overrides(sglang={"staging": {**card.sglang.staging.model_dump(), "max_files": 77, "rid_prefix": "hs-x"}})
    plan = serve.plan_server(card, port=31998, staging_dir=str(tmp_path / "st"))
    assert plan.mechanism == "legacy" and plan.sglang_version == "0.5.5"
    assert plan.support_status.startswith("verified by tests/server_patch/legacy/test_patched_server.py"), plan.support_status
    assert "--forward-hooks" not in plan.argv and "--disable-radix-cache" in plan.argv
    assert plan.argv[:2] == ["-m", "sglang.launch_server"]  # the source patch has no hooks for the launcher to move
    assert plan.argv[plan.argv.index("--chunked-prefill-size") + 1] == "-1"
    # what the patched forward reads is what the plan meant: every variable, through the hook's own config reader
    config = CaptureConfig.from_sources({"mechanism": "legacy"}, environ=plan.env)
    assert config.staging_dir == plan.staging_dir and list(config.hf_aux_layer_ids) == [2, 3, 4]
    assert config.content_keys and config.max_staging_files == 77 and config.rid_prefix == "hs-x"
    assert config.max_staging_bytes == card.sglang.staging.max_bytes and config.writer_threads == card.sglang.staging.writer_threads
    assert all(var in plan.env for key, var in LEGACY_ENV if key in plan.hook_config)


def test_the_patch_always_returns_aux_layers_so_a_final_only_card_is_refused(card, patched_env, tmp_path):
    with pytest.raises(ServeError, match="final-state-only capture.*needs SGLang's forward hooks.*use SGLang >= 0.5.9"):
        serve.plan_server(card.with_overrides(layers={"aux": []}), staging_dir=str(tmp_path / "st"))


def test_the_patch_cannot_join_partial_prompts_so_the_plan_refuses_them(card, patched_env, tmp_path):
    with pytest.raises(ServeError, match="chunked_prefill_size.*cannot be joined"):
        serve.plan_server(card.with_overrides(sglang={"chunked_prefill_size": 64}), staging_dir=str(tmp_path / "st"))
    with pytest.raises(ServeError, match="radix_cache"):
        serve.plan_server(card.with_overrides(sglang={"radix_cache": True}), staging_dir=str(tmp_path / "st"))


def test_an_unpatched_release_without_hooks_names_the_patch_command(card, patched_env, tmp_path):
    patched_env["sglang_dir"] = fake_sglang(tmp_path / "unpatched", OLD_LAYER, args=(), rids=False, eagle3=ALWAYS)
    with pytest.raises(ServeError, match="hs-dataset patch apply"):
        serve.plan_server(card, staging_dir=str(tmp_path / "st"))
    assert carries_patch(PATCHED_SOURCE) and not carries_patch(OLD_LAYER)


def test_the_patch_hook_refuses_server_arguments_that_split_prompts():
    from hs_dataset.server_patch.mechanisms.legacy import legacy_problems

    problems = legacy_problems(SimpleNamespace(chunked_prefill_size=64, disable_radix_cache=False))
    assert len(problems) == 2 and "--chunked-prefill-size -1" in problems[0] and "--disable-radix-cache" in problems[1]
    assert legacy_problems(SimpleNamespace(chunked_prefill_size=-1, disable_radix_cache=True)) == []
    assert legacy_problems(SimpleNamespace(chunked_prefill_size=None, disable_radix_cache=True)) == []
    assert legacy_problems(None) == []


def test_the_client_reads_a_patched_server_s_config_from_its_hook_status(tmp_path):
    from hs_dataset.capture.sglang.validate import capture_hook_config
    from hs_dataset.server_patch.contract.status import write_status

    staging = tmp_path / "st"
    staging.mkdir(mode=0o700)
    info = {"version": "0.5.5", "forward_hooks": None}
    with pytest.raises(ServerValidationError, match="no status of the source patch's hook in"):
        capture_hook_config("http://s", info, str(staging))
    with pytest.raises(ServerValidationError, match="set backend.staging_dir to its HS_CAPTURE_STAGING_DIR"):
        capture_hook_config("http://s", info, None)
    write_status(str(staging), "dp0", {"mechanism": "legacy", "hf_aux_layer_ids": [2, 3, 4], "rid_prefix": "hs-", "content_keys": True})
    config = capture_hook_config("http://s", info, str(staging))
    assert config == {
        "mechanism": "legacy",
        "hf_aux_layer_ids": [2, 3, 4],
        "rid_prefix": "hs-",
        "content_keys": True,
        "staging_dir": str(staging),
    }
    with pytest.raises(ServerValidationError, match="without hs_dataset's forward hooks"):  # hooks of someone else: not ours
        capture_hook_config("http://s", {"forward_hooks": [{"hook_factory": "other:factory"}]}, str(staging))
