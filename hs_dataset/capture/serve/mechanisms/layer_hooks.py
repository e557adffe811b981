"""``layer_hooks`` as launched: one forward hook per aux layer records ``hidden + residual`` (SGLang 0.5.9 - 0.5.19).

Refused where the installed decoder layer's ``forward`` does not return the residual or
its output is a partial sum under tensor parallelism (read from its source, before start).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hs_dataset.capture.serve import cpu_ranks, probe
from hs_dataset.capture.serve.errors import ServeError
from hs_dataset.capture.serve.facts import SGLangFacts
from hs_dataset.capture.serve.layer_ids import layer_hook_targets, model_family
from hs_dataset.capture.serve.mechanisms.base import Launch, MechanismPlan
from hs_dataset.server_patch.contract.layer_outputs import layer_hooks_problem
from hs_dataset.server_patch.contract.mechanism import Mechanism

__all__ = ["LayerHooksPlan"]


class LayerHooksPlan(MechanismPlan):
    mechanism = Mechanism.LAYER_HOOKS

    def available(self, facts: SGLangFacts) -> bool:
        return facts.forward_hooks

    def refuse(self, launch: Launch) -> None:
        """Wrong layer outputs on this SGLang; without aux layers no layer hook is set, so they do not matter."""
        if not launch.hf_ids:
            return
        tp_size = cpu_ranks.parallel_sizes(["--tp-size", str(launch.tp), *launch.args])[0]["tp"]
        problem = layer_hooks_problem(launch.architectures, probe.installed_source(launch.sglang_dir), tp_size)
        if problem:
            raise ServeError(f"mechanism '{self.mechanism}' on SGLang {launch.version}: {problem}")

    def notes(self, launch: Launch, facts: SGLangFacts, requested: str) -> list[str]:
        notes = []
        if requested == self.mechanism and facts.aux_return:
            notes.append(f"mechanism forced to {self.mechanism} by the card")
        if launch.hf_ids and model_family(launch.architectures) != "deepseek":
            notes.append(f"{self.mechanism} on a non-DeepseekV2/V3 model: hook outputs are (hidden, residual) pairs as read from source")
        return notes

    def layer_specs(self, launch: Launch, hook_config: Mapping[str, Any], hooks_module: str) -> list[dict[str, Any]]:
        """One ``layer_hook`` per aux layer, on the module whose output is that HF hidden state."""
        return [
            {
                "name": f"hs_capture_aux_{hf_id}",
                "target_modules": [layer],
                "hook_factory": f"{hooks_module}:layer_hook",
                "config": {**hook_config, "hook_hf_id": hf_id},
            }
            for layer, hf_id in layer_hook_targets(list(launch.hf_ids), launch.module_path, launch.num_layers).items()
        ]
