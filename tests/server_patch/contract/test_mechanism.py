"""The capture mechanism is one enum, with one launch object and one server object per member, and the SGLang
release quirks are detected once: what keeps adding a mechanism or a release to a few files."""

from __future__ import annotations

import json
from typing import get_args

import pytest
import torch

from hs_dataset.capture.serve import mechanisms as launch_side
from hs_dataset.capture.serve.facts import SGLangFacts
from hs_dataset.capture.serve.layer_ids import layer_hook_targets
from hs_dataset.capture.serve.mechanisms import Launch
from hs_dataset.capture.serve.mechanisms.legacy import LEGACY_ENV
from hs_dataset.capture.sglang.support import VERIFIED, UnsupportedVersionError
from hs_dataset.config import SGLangServerSection
from hs_dataset.server_patch import compat
from hs_dataset.server_patch.config import CaptureConfig
from hs_dataset.server_patch.contract.mechanism import AUTO, CARD_CHOICES, CapturePath, Mechanism
from hs_dataset.server_patch.mechanisms import SERVER_MECHANISMS, check_server_args, server_mechanism
from hs_dataset.server_patch.mechanisms.base import PassCapture

HOOKS = SGLangFacts("0.5.19", forward_hooks=True)
AUX = SGLangFacts("0.5.23", forward_hooks=True, aux_return=True)
PATCHED = SGLangFacts("0.5.5", source_patched=True)


def _launch(**changes) -> Launch:
    values = {
        "source_path": "card.yaml",
        "version": "0.5.19",
        "device": "cpu",
        "architectures": ("DeepseekV3ForCausalLM",),
        "module_path": "model",
        "num_layers": 8,
        "hf_ids": (2, 3, 4),
        "tp": 1,
        "args": (),
        "radix_cache": False,
        "chunked_prefill_size": None,
        "sglang_dir": None,
    }
    return Launch(**{**values, **changes})


# ---------------------------------------------------------------------------- one type


def test_the_card_accepts_auto_and_exactly_the_mechanisms_of_the_enum():
    assert get_args(SGLangServerSection.model_fields["mechanism"].annotation) == CARD_CHOICES
    assert (AUTO, *(m.value for m in Mechanism)) == CARD_CHOICES
    assert SGLangServerSection(mechanism="legacy").mechanism == "legacy"  # a card may ask for it: choose() says where it exists
    with pytest.raises(ValueError):
        SGLangServerSection(mechanism="hooks")


def test_every_mechanism_has_one_launch_object_and_one_server_object():
    assert list(launch_side.PLANS) == list(Mechanism) == list(SERVER_MECHANISMS)
    for mechanism in Mechanism:
        assert launch_side.plan_for(mechanism.value).mechanism is mechanism
        assert server_mechanism(mechanism.value).mechanism is mechanism
        assert CapturePath.PREFILL in launch_side.PLANS[mechanism].paths and CapturePath.PREFILL in SERVER_MECHANISMS[mechanism].paths
    assert {m for _v, m, _d in VERIFIED} <= set(Mechanism)
    assert [m for m in Mechanism if not m.uses_forward_hooks] == [Mechanism.LEGACY]  # every member has its traits row
    assert [m.server_flag for m in Mechanism] == ["enable_return_aux_hidden_states", None, None]


def test_a_mechanism_reads_as_its_value_in_messages_logs_and_json():
    assert str(Mechanism.LEGACY) == f"{Mechanism.LEGACY}" == "legacy" and json.dumps(Mechanism.LEGACY) == '"legacy"'
    assert Mechanism.AUX_RETURN == "aux_return" and "%s" % Mechanism.LAYER_HOOKS == "layer_hooks"  # noqa: UP031  (%-format on purpose: logging formats messages that way)


def test_the_capture_config_holds_the_enum_and_its_json_the_value():
    config = CaptureConfig.from_sources({"staging_dir": "/x", "hf_aux_layer_ids": [2], "mechanism": "layer_hooks"}, environ={})
    assert config.mechanism is Mechanism.LAYER_HOOKS
    out = config.to_json()
    assert type(out["mechanism"]) is str and out["mechanism"] == "layer_hooks"
    assert CaptureConfig.from_sources(json.loads(json.dumps(out)), environ={}) == config
    older = CaptureConfig.from_sources({"staging_dir": "/x", "hf_aux_layer_ids": [2]}, environ={})  # written before the key
    assert older.mechanism is Mechanism.AUX_RETURN
    assert CaptureConfig(staging_dir="/x", hf_aux_layer_ids=(2,), mechanism="legacy").mechanism is Mechanism.LEGACY
    with pytest.raises(ValueError, match=r"capture config: mechanism must be one of \['aux_return', 'layer_hooks', 'legacy'\], got 'x'"):
        CaptureConfig(staging_dir="/x", hf_aux_layer_ids=(2,), mechanism="x")


# ---------------------------------------------------------------------------- the launch side


def test_the_mechanism_follows_what_the_installed_source_provides():
    assert launch_side.available(AUX) == [Mechanism.AUX_RETURN, Mechanism.LAYER_HOOKS]
    assert launch_side.available(HOOKS) == [Mechanism.LAYER_HOOKS]
    assert launch_side.available(PATCHED) == [Mechanism.LEGACY]
    assert launch_side.choose(AUX).mechanism is Mechanism.AUX_RETURN
    assert launch_side.choose(AUX, "layer_hooks").mechanism is Mechanism.LAYER_HOOKS
    assert launch_side.choose(PATCHED, "legacy").mechanism is Mechanism.LEGACY
    with pytest.raises(UnsupportedVersionError, match="mechanism 'legacy' is not available on SGLang 0.5.23 .use 'aux_return'."):
        launch_side.choose(AUX, "legacy")
    with pytest.raises(UnsupportedVersionError, match="hs-dataset patch apply"):
        launch_side.choose(SGLangFacts("0.5.5"))


def test_aux_return_asks_sglang_for_the_aux_states_only_when_there_are_some():
    plan = launch_side.plan_for(Mechanism.AUX_RETURN)
    assert plan.wants_sglang_ids and plan.layer_specs(_launch(), {}, "m") == []
    assert plan.server_args(_launch(), [3, 4, 5]) == [
        "--enable-return-aux-hidden-states",
        "--speculative-algorithm",
        "EAGLE3",
        "--return-aux-hidden-state-layer-ids",
        "3",
        "4",
        "5",
    ]
    assert plan.server_args(_launch(hf_ids=()), None) == [] and plan.server_env({"staging_dir": "/x"}, _launch(), []) == {}


def test_layer_hooks_adds_one_layer_hook_per_aux_layer():
    plan = launch_side.plan_for(Mechanism.LAYER_HOOKS)
    specs = plan.layer_specs(_launch(), {"staging_dir": "/x"}, "hs_dataset.server_patch.hooks")
    targets = layer_hook_targets([2, 3, 4], "model", 8)
    assert [s["target_modules"] for s in specs] == [[layer] for layer in targets]
    assert [s["config"] for s in specs] == [{"staging_dir": "/x", "hook_hf_id": hf} for hf in targets.values()]
    assert all(s["hook_factory"] == "hs_dataset.server_patch.hooks:layer_hook" for s in specs)
    assert not plan.wants_sglang_ids and plan.server_args(_launch(), None) == []
    assert plan.notes(_launch(), AUX, "layer_hooks") == ["mechanism forced to layer_hooks by the card"]
    plan.refuse(_launch(hf_ids=()))  # no aux layer: no layer hook, nothing to read


def test_legacy_configures_the_patched_forward_by_environment_and_refuses_partial_prompts():
    from hs_dataset.capture.serve.errors import ServeError

    plan = launch_side.plan_for(Mechanism.LEGACY)
    assert not Mechanism.LEGACY.uses_forward_hooks and plan.final_state_source == "(the patched forward)"
    assert (
        plan.server_args(_launch(), None) == ["--chunked-prefill-size", "-1"]
        and plan.server_args(_launch(chunked_prefill_size=-1), None) == []
    )
    notes: list[str] = []
    env = plan.server_env({"staging_dir": "/x", "hf_aux_layer_ids": [2, 3], "max_staging_files": 7}, _launch(device="cuda"), notes)
    assert env == {
        "HS_CAPTURE_CONTENT_KEYS": "1",
        "HS_CAPTURE_STAGING_DIR": "/x",
        "HS_CAPTURE_LAYER_IDS": "2,3",
        "HS_CAPTURE_MAX_FILES": "7",
    }
    assert len(notes) == 1 and {var for _key, var in LEGACY_ENV} >= set(env) - {"HS_CAPTURE_CONTENT_KEYS"}
    for bad, field in (
        ({"hf_ids": ()}, "layers"),
        ({"radix_cache": True}, "sglang.radix_cache"),
        ({"chunked_prefill_size": 64}, "sglang.chunked_prefill_size"),
    ):
        with pytest.raises(ServeError, match=f"card.yaml: {field}"):
            plan.refuse(_launch(**bad))


# ---------------------------------------------------------------------------- the server side


def test_each_server_mechanism_obtains_the_aux_states_of_a_pass_its_own_way():
    aux = torch.randn(3, 2, 4)
    got, missing = server_mechanism(Mechanism.AUX_RETURN).aux_states((torch.randn(3, 4), aux), PassCapture(), (2, 3))
    assert got is aux and missing is None
    got, missing = server_mechanism(Mechanism.AUX_RETURN).aux_states(torch.randn(3, 4), PassCapture(), (2, 3))
    assert got is None and "--enable-return-aux-hidden-states" in missing
    layers = server_mechanism(Mechanism.LAYER_HOOKS)
    assert layers.aux_states(None, PassCapture(packed=aux, layers={2, 3}), (2, 3)) == (aux, None)
    got, missing = layers.aux_states(None, PassCapture(packed=aux, layers={2}), (2, 3))
    assert got is None and "HF hidden_states [3] recorded nothing" in missing
    assert layers.takes_layer_hooks and not server_mechanism(Mechanism.AUX_RETURN).takes_layer_hooks
    with pytest.raises(NotImplementedError):
        server_mechanism(Mechanism.LEGACY).aux_states(None, PassCapture(), (2,))


def test_the_legacy_server_refuses_what_layer_hooks_refuses_and_partial_prompts():
    from types import SimpleNamespace

    args = SimpleNamespace(moe_a2a_backend="deepep", chunked_prefill_size=64, disable_radix_cache=False)
    assert check_server_args(args, Mechanism.LEGACY)[:1] == check_server_args(args, Mechanism.LAYER_HOOKS)
    assert len(check_server_args(args, Mechanism.LEGACY)) == 3 and check_server_args(args, Mechanism.AUX_RETURN) == []


# ---------------------------------------------------------------------------- the release quirks, detected once


def test_a_release_quirk_is_detected_once_by_the_first_reader_that_answers():
    calls = {"new": 0, "old": 0}

    def new():
        calls["new"] += 1
        raise ImportError("not this release")

    def old():
        calls["old"] += 1
        return (1, 0)

    reader = compat._FirstAnswer((("new", new), ("old", old)))
    assert reader() == ((1, 0), "old") and reader() == ((1, 0), "old")
    assert calls == {"new": 1, "old": 2}  # the failing probe is not repeated
    with pytest.raises(ImportError):
        compat._FirstAnswer((("new", new),))()


def test_the_version_and_the_batch_fields_are_read_once(monkeypatch):
    compat.reset()
    try:
        compat.sglang_version(), compat.sglang_version()
        compat.forward_batch_rids(), compat.forward_batch_rids()
        assert compat.sglang_version.cache_info().misses == 1 and compat.forward_batch_rids.cache_info().misses == 1
        assert compat.server_args() is None and compat.tp_size() == 1  # no SGLang here: nothing to read
        assert compat.prefill_cuda_graph(None) == "unknown"
    finally:
        compat.reset()


def test_a_mechanism_without_its_object_or_with_two_fails_at_import_naming_it():
    from hs_dataset.server_patch.contract.mechanism import one_per_mechanism

    class Base:
        mechanism: Mechanism

    class Hooks(Base):
        mechanism = Mechanism.LAYER_HOOKS

    with pytest.raises(TypeError, match=r"pkg: no Base for mechanism\(s\) \['aux_return', 'legacy'\]"):
        one_per_mechanism("pkg", [], Base)

    class MoreHooks(Base):
        mechanism = Mechanism.LAYER_HOOKS

    with pytest.raises(TypeError, match="pkg: two objects for mechanism layer_hooks: Hooks and MoreHooks"):
        one_per_mechanism("pkg", [], Base)
