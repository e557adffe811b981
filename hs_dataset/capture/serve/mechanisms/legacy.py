"""``legacy`` as launched: the source patch of an SGLang without forward hooks (<= 0.5.5, ``hs-dataset patch apply``).

The patched forward has no place for a hook config: it reads the ``HS_CAPTURE_*``
variables (:data:`LEGACY_ENV`). Its batches carry no request ids, so dumps are keyed by
content, and whatever would split a prompt over passes (chunked prefill, the radix cache)
is refused; so is a final-state-only card (the patch always returns aux layers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hs_dataset.capture.serve.errors import ServeError
from hs_dataset.capture.serve.facts import SGLangFacts
from hs_dataset.capture.serve.mechanisms.base import Launch, MechanismPlan
from hs_dataset.server_patch.contract.mechanism import Mechanism

__all__ = ["LEGACY_ENV", "LegacyPlan"]

# capture config key -> the HS_CAPTURE_* variable the source patch's hook reads it from
# (hs_dataset.server_patch.config.CaptureConfig.from_sources; a unit test holds the two together)
LEGACY_ENV = (
    ("staging_dir", "HS_CAPTURE_STAGING_DIR"),
    ("hf_aux_layer_ids", "HS_CAPTURE_LAYER_IDS"),
    ("rid_prefix", "HS_CAPTURE_RID_PREFIX"),
    ("max_staging_bytes", "HS_CAPTURE_MAX_BYTES"),
    ("max_staging_files", "HS_CAPTURE_MAX_FILES"),
    ("max_wait_s", "HS_CAPTURE_MAX_WAIT_S"),
    ("writer_threads", "HS_CAPTURE_WRITERS"),
    ("pinned_pool_bytes", "HS_CAPTURE_PINNED_BYTES"),
    ("orphan_ttl_s", "HS_CAPTURE_ORPHAN_TTL_S"),
    ("storage", "HS_CAPTURE_STORAGE"),
)


class LegacyPlan(MechanismPlan):
    mechanism = Mechanism.LEGACY
    final_state_source = "(the patched forward)"

    def available(self, facts: SGLangFacts) -> bool:
        return not facts.forward_hooks and facts.source_patched

    def refuse(self, launch: Launch) -> None:
        """A final-state-only card, then what cannot be joined without request ids."""
        if not launch.hf_ids:
            raise ServeError(
                f"{launch.source_path}: layers: a final-state-only capture (no aux layers) needs SGLang's forward hooks; SGLang "
                f"{launch.version} captures through the source patch, which always returns aux layers: use SGLang >= 0.5.9"
            )
        why = f"SGLang {launch.version} captures through the source patch, whose batches carry no request ids"
        if launch.radix_cache:
            raise ServeError(
                f"{launch.source_path}: sglang.radix_cache: {why}, so a prefix-cache hit cannot be told apart; set it to false"
            )
        if launch.chunked_prefill_size is not None and launch.chunked_prefill_size > 0:
            raise ServeError(
                f"{launch.source_path}: sglang.chunked_prefill_size: {why}, so the chunks of one prompt cannot be joined; "
                "drop it (serve passes --chunked-prefill-size -1)"
            )

    def server_args(self, launch: Launch, sglang_ids: Sequence[int] | None) -> list[str]:
        """Chunked prefill off unless the card sets it (only to -1 or 0: :meth:`refuse`)."""
        return ["--chunked-prefill-size", "-1"] if launch.chunked_prefill_size is None else []

    def server_env(self, hook_config: Mapping[str, Any], launch: Launch, notes: list[str]) -> dict[str, str]:
        """The patched forward's configuration: the hook config as ``HS_CAPTURE_*`` variables, dumps keyed by content."""
        env = {"HS_CAPTURE_CONTENT_KEYS": "1"}
        for key, var in LEGACY_ENV:
            value = hook_config.get(key)
            if value is not None:
                env[var] = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        notes.append("legacy source patch: configured by HS_CAPTURE_* variables; dumps keyed by content; chunked prefill off")
        if launch.device == "cpu":
            notes.append(
                "legacy on CPU: no forward hooks to register the torch_native MLA handler; "
                "the server's PYTHONPATH must do it (tests/shims/sglang_legacy_shim)"
            )
        return env
