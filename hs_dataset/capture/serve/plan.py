"""The launch plan of an SGLang server with everything capture needs.

The server runs in its own environment (``make sglang-env`` -> ``.sglang-venv``);
this module builds its command line and environment from a card and from what the
installed SGLang provides, read from its source (:mod:`hs_dataset.capture.serve.facts`,
located by :mod:`hs_dataset.capture.serve.probe`): the mechanism, the layer ids, the
prefill-graph flag. :func:`hs_dataset.capture.sglang.support.verification` says whether a test
ran that release; :mod:`hs_dataset.capture.serve.process` starts it and waits for health.

:func:`plan_server` goes step by step: where the server runs and what it serves
(:func:`_target`), the probe of its Python, whether SGLang can load its own class for the
model there (:mod:`hs_dataset.capture.serve.model_import`), the mechanism and the layer ids
(:func:`_capture`), the hook config and specs, the argv, the environment.

Card keys read (``sglang:`` section unless noted; all optional except where said):

``python``            server interpreter (default ``$HS_SGLANG_PYTHON`` or ``<repo>/.sglang-venv/bin/python``)
``device``            ``cuda`` (default) or ``cpu`` (CPU test servers: adds the CPU support files)
``tp``                tensor-parallel size (default 1); a CPU server of several ranks gets one core range per
                      rank in ``SGLANG_CPU_OMP_THREADS_BIND`` unless ``env`` sets it (:mod:`.cpu_ranks`)
``host`` / ``port``   listen address (default 127.0.0.1:30000)
``module_path``       decoder-stack module (default ``model.text_module`` or ``model``)
``mechanism``         ``auto`` (default) or a :class:`~hs_dataset.server_patch.contract.mechanism.Mechanism`;
                      what each needs and refuses is its object in :mod:`hs_dataset.capture.serve.mechanisms`
                      (``layer_hooks`` is refused where the installed decoder layer's ``forward`` does not return
                      the residual; an SGLang without forward hooks whose ``deepseek_v2.py`` carries the source
                      patch gets ``legacy``, configured by ``HS_CAPTURE_*`` variables)
``radix_cache``       keep SGLang's prefix cache on (default: on for a regeneration server, else ``--disable-radix-cache``)
``chunked_prefill_size``  passed through when set (chunks are assembled into one dump)
``startup_timeout_s`` seconds to wait for ``/health`` (default 900)
``env``               extra environment variables for the server
``args``              extra SGLang arguments (list)
``staging``           ``dir``, ``max_bytes``, ``max_files``, ``max_wait_s``, ``writer_threads``,
                      ``pinned_pool_bytes``, ``orphan_ttl_s`` (see docs/SGLANG.md)
top level: ``model.path`` (or ``model.id``), ``layers.aux`` (or ``layers.preset``: ids for the model's layer count), ``dtype``.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hs_dataset.capture.serve import cpu_ranks, mechanisms, model_import, probe
from hs_dataset.capture.serve.errors import ServeError
from hs_dataset.capture.serve.facts import SGLangFacts, read_facts
from hs_dataset.capture.serve.layer_ids import LayerIdError, model_family, sglang_eagle3_ids, validate_hf_ids
from hs_dataset.capture.serve.mechanisms import Launch, MechanismPlan
from hs_dataset.capture.serve.sizing import refuse_samples_that_cannot_fit
from hs_dataset.capture.sglang.support import UnsupportedVersionError, verification
from hs_dataset.codecs.registry import ENCODED_STORAGES
from hs_dataset.config import Card, SGLangServerSection, card_from_dict
from hs_dataset.server_patch.contract.decode_capture import LAUNCHER_MODULE
from hs_dataset.server_patch.contract.dump import HOOKS_MODULE
from hs_dataset.server_patch.contract.mechanism import Mechanism

__all__ = [
    "ServerPlan",
    "default_server_python",
    "default_staging_dir",
    "plan_server",
    "resolve_server_model_path",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
# the CPU server support (hs_dataset.server_patch.cpu_support), named by path: the client never imports it
CPU_SUPPORT_DIR = Path(__file__).resolve().parents[2] / "server_patch" / "cpu_support"
CPU_MLA_FACTORY = "hs_dataset.server_patch.cpu_support.mla_torch_native:factory"
DATASETS_HOOK_OFF = "HS_DATASET_DATASETS_HOOK"  # hs_dataset.datasets_hook.OFF_SWITCH (a string: launch must not import the hook)

# card ``sglang.staging`` key -> capture config key (hs_dataset.server_patch.config.CaptureConfig)
_STAGING_KEYS = (
    ("max_bytes", "max_staging_bytes"),
    ("max_files", "max_staging_files"),
    ("max_wait_s", "max_wait_s"),
    ("writer_threads", "writer_threads"),
    ("pinned_pool_bytes", "pinned_pool_bytes"),
    ("orphan_ttl_s", "orphan_ttl_s"),
    ("rid_prefix", "rid_prefix"),
)


MIXED_CHUNK_FLAG = "--enable-mixed-chunk"
# Why serve warns: mixed batches (a prefill riding inside a decode batch) run without the decode CUDA graphs.
MIXED_CHUNK_WARNING = (
    "--enable-mixed-chunk: mixed batches decode without CUDA graphs; with it, plain generation on the lent H100 "
    "(SGLang 0.5.16, a Kimi-wide model, decode graphs on, 2026-12-06) fell from 7,561 to about 2,240 tok/s, 3.4x slower, "
    "and a regenerating build to 0.50-0.52 of that: leave it off for regeneration (docs/GPU.md)"
)


def default_server_python() -> str:
    return os.environ.get("HS_SGLANG_PYTHON") or str(REPO_ROOT / ".sglang-venv" / "bin" / "python")


def resolve_server_model_path(path: str | None) -> str:
    """The server's ``--model-path``: the one resolver in :mod:`hs_dataset.model.snapshot`."""
    from hs_dataset.model.snapshot import ModelPathError, resolve_model_path

    try:
        return str(resolve_model_path(path))
    except ModelPathError as exc:
        raise ServeError(str(exc)) from None


def default_staging_dir(host: str, port: int) -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return os.path.join(base, f"hs_dataset-{os.geteuid()}", f"{host.replace(':', '_')}-{port}")


@dataclass
class ServerPlan:
    """Everything needed to start one capture server (``--check`` prints it)."""

    python: str
    argv: list[str]
    env: dict[str, str]
    url: str
    host: str
    port: int
    model_path: str
    staging_dir: str
    sglang_version: str
    mechanism: Mechanism
    support_status: str  # "verified by <test>" or "unverified: ..." (hs_dataset.capture.sglang.support.verification)
    hf_aux_layer_ids: list[int]
    sglang_aux_layer_ids: list[int] | None
    hook_config: dict
    startup_timeout_s: float = 900.0
    notes: list[str] = field(default_factory=list)

    def command_line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join([self.python, *self.argv])}".strip()

    def describe(self) -> str:
        lines = [
            f"SGLang {self.sglang_version}: {self.support_status}",
            f"mechanism: {self.mechanism}",
            f"model: {self.model_path}",
            f"aux layers: HF hidden_states {self.hf_aux_layer_ids}"
            + (f" -> --return-aux-hidden-state-layer-ids {self.sglang_aux_layer_ids}" if self.sglang_aux_layer_ids else ""),
            "final state: pre-norm " + mechanisms.plan_for(self.mechanism).final_state_source,
            f"staging dir: {self.staging_dir}",
            f"url: {self.url}",
            *[f"note: {n}" for n in self.notes],
            "command:",
            "  " + self.command_line(),
        ]
        return "\n".join(lines)


def plan_server(
    card: Card | Mapping[str, Any],
    *,
    port: int | None = None,
    host: str | None = None,
    staging_dir: str | None = None,
    model_path: str | None = None,
    python: str | None = None,
    extra_args: Sequence[str] = (),
    sglang_overrides: Mapping[str, Any] | None = None,
) -> ServerPlan:
    """Build the server command for a card (a :class:`hs_dataset.config.Card` or a mapping validated as one).

    ``sglang_overrides`` are merged into the card's ``sglang`` section (and validated with it).
    """
    card = card if isinstance(card, Card) else card_from_dict(card)
    if sglang_overrides:
        card = card.with_overrides(sglang=dict(sglang_overrides))
    target = _target(card, host=host, port=port, python=python, model_path=model_path, extra_args=extra_args)
    if target.hidden_size:
        refuse_samples_that_cannot_fit(card, target.hidden_size, len(card.aux_layers_for(target.num_layers)))
    notes: list[str] = []
    info = probe.probe_server_env(target.python)
    capture = _capture(card, target, info, extra_args, notes)
    staging_dir = os.path.abspath(staging_dir or card.sglang.staging.dir or default_staging_dir(target.host, target.port))
    hook_config = _hook_config(card, target, capture, staging_dir)
    specs = _hook_specs(card.sglang.device, target, capture, hook_config) if capture.mechanism.uses_forward_hooks else []
    argv = _server_argv(card, target, capture, specs, extra_args, notes)
    env = _server_env(card, info, target.python, argv, notes)
    env.update(capture.plan.server_env(hook_config, capture.launch, notes))
    return ServerPlan(
        python=target.python,
        argv=argv,
        env=env,
        url=f"http://{target.host}:{target.port}",
        host=target.host,
        port=target.port,
        model_path=target.model_path,
        staging_dir=staging_dir,
        sglang_version=capture.version,
        mechanism=capture.mechanism,
        support_status=capture.status,
        hf_aux_layer_ids=capture.hf_ids,
        sglang_aux_layer_ids=capture.sglang_ids,
        hook_config=hook_config,
        startup_timeout_s=card.sglang.startup_timeout_s,
        notes=notes,
    )


# --------------------------------------------------------------------------- where and what


@dataclass(frozen=True)
class _Target:
    """Where the server runs and what it serves."""

    python: str
    host: str
    port: int
    module_path: str  # the decoder stack the hooks go on
    model_path: str
    architectures: Sequence[str]
    num_layers: int
    hidden_size: int | None  # from config.json; None where the card names the layers by hand


def _target(
    card: Card, *, host: str | None, port: int | None, python: str | None, model_path: str | None, extra_args: Sequence[str] = ()
) -> _Target:
    sg, model = card.sglang, card.model
    host = host or sg.host
    port = int(port or sg.port)
    python = python or sg.python or default_server_python()
    if not os.path.isabs(python) and os.sep in python:
        python = str(REPO_ROOT / python)
    module_path = sg.module_path or model.text_module or "model"
    mpath = resolve_server_model_path(model_path or os.environ.get("HS_DATASET_MODEL_PATH") or model.path or model.id)
    mcfg = _model_config(mpath, loads_weights=not _dummy_weights([*sg.args, *extra_args]))
    architectures = mcfg.get("architectures") or sg.architectures or []
    num_layers = mcfg.get("num_hidden_layers") or sg.num_hidden_layers
    if not num_layers:
        raise ServeError(
            f"cannot read num_hidden_layers for {mpath}: point model.path at a local snapshot with config.json "
            "(or set sglang.num_hidden_layers and sglang.architectures in the card)"
        )
    hidden = mcfg.get("hidden_size")
    return _Target(python, host, port, module_path, mpath, architectures, int(num_layers), int(hidden) if hidden else None)


def _dummy_weights(args: Sequence[str]) -> bool:
    """``--load-format dummy`` among the server's arguments: it loads no weights (a throughput rehearsal)."""
    for i, arg in enumerate(args):
        if arg == "--load-format" and i + 1 < len(args):
            return args[i + 1] == "dummy"
        if arg.startswith("--load-format="):
            return arg.split("=", 1)[1] == "dummy"
    return False


def _model_config(model_path: str, *, loads_weights: bool = True) -> dict:
    cfg_path = Path(model_path) / "config.json"
    if not cfg_path.is_file():
        return {}
    from hs_dataset.model.model_config import read_model_config, text_config
    from hs_dataset.model.weights import check_weights

    cfg = read_model_config(model_path)  # bounded read, sizes range-checked: a hostile config.json is one line
    if loads_weights:  # ... and against the weights the server would load, before it is started
        check_weights(model_path, cfg)
    text = dict(text_config(cfg))  # multimodal wrappers (Kimi-K2.5): layers live in the text config
    text["architectures"] = cfg.get("architectures") or text.get("architectures")  # the served class is the wrapper's
    return text


# --------------------------------------------------------------------------- how it captures


@dataclass(frozen=True)
class _Capture:
    """How the server captures: the installed SGLang, the mechanism, the layers."""

    facts: SGLangFacts  # what the installed source provides
    plan: MechanismPlan  # the chosen mechanism's launch side
    launch: Launch  # what it planned for
    status: str  # verified by which test, or unverified (hs_dataset.capture.sglang.support)
    hf_ids: list[int]
    sglang_ids: list[int] | None  # --return-aux-hidden-state-layer-ids (aux_return only)

    @property
    def version(self) -> str:
        return self.facts.version

    @property
    def mechanism(self) -> Mechanism:
        return self.plan.mechanism


def _capture(card: Card, target: _Target, info: dict, extra_args: Sequence[str], notes: list[str]) -> _Capture:
    facts = read_facts(info.get("sglang_dir"), info["sglang"])
    notes.append(f"SGLang {facts.version} {facts.describe()}")
    # before anything is started: a model SGLang would serve through its Transformers fallback is refused
    model_import.refuse_unloadable_model(
        facts.version,
        info.get("sglang_dir"),
        target.architectures,
        info.get("absent") or (),
        python=target.python,
        device=card.sglang.device,
    )
    try:
        hf_ids = validate_hf_ids(card.aux_layers_for(target.num_layers), target.num_layers)
    except LayerIdError as exc:
        raise ServeError(str(exc)) from None
    launch = _launch(card, target, info, facts, hf_ids, extra_args)
    plan = _choose_mechanism(card.sglang, launch, facts, notes)
    if not hf_ids:
        notes.append("final state only (no aux layers): no aux-return flags and no layer hooks; the norm hook captures the final state")
    _verified, status = verification(facts.version, plan.mechanism, card.sglang.device)
    shift = facts.eagle3_shift.get(model_family(target.architectures), "unknown")
    try:
        wants_ids = plan.wants_sglang_ids and hf_ids
        sglang_ids = sglang_eagle3_ids(hf_ids, target.architectures, shift, target.num_layers) if wants_ids else None
    except LayerIdError as exc:
        raise ServeError(str(exc)) from None
    return _Capture(facts, plan, launch, status, hf_ids, sglang_ids)


def _launch(card: Card, target: _Target, info: dict, facts: SGLangFacts, hf_ids: Sequence[int], extra_args: Sequence[str]) -> Launch:
    """What the mechanisms plan for: the card's choices, the served model and the installed SGLang."""
    sg = card.sglang
    return Launch(
        source_path=str(card.source_path),
        version=facts.version,
        device=sg.device,
        architectures=tuple(target.architectures),
        module_path=target.module_path,
        num_layers=target.num_layers,
        hf_ids=tuple(hf_ids),
        tp=sg.tp,
        args=(*sg.args, *map(str, extra_args)),
        radix_cache=sg.keeps_radix_cache(card.regenerate),
        chunked_prefill_size=sg.chunked_prefill_size,
        sglang_dir=info.get("sglang_dir"),
    )


def _choose_mechanism(sg: SGLangServerSection, launch: Launch, facts: SGLangFacts, notes: list[str]) -> MechanismPlan:
    """The card's mechanism where the installed SGLang allows it, else what it allows; refused (:class:`ServeError`)
    where it cannot capture this launch (its :meth:`~hs_dataset.capture.serve.mechanisms.MechanismPlan.refuse`)."""
    try:
        plan = mechanisms.choose(facts, sg.mechanism)
    except UnsupportedVersionError as exc:
        raise ServeError(str(exc)) from None
    plan.refuse(launch)
    notes.extend(plan.notes(launch, facts, sg.mechanism))
    return plan


# --------------------------------------------------------------------------- the hooks


def _hook_config(card: Card, target: _Target, capture: _Capture, staging_dir: str) -> dict[str, Any]:
    """The ``config`` every hook spec carries (:class:`hs_dataset.server_patch.config.CaptureConfig`'s keys)."""
    hook_config: dict[str, Any] = {
        "staging_dir": staging_dir,
        "hf_aux_layer_ids": capture.hf_ids,
        "mechanism": capture.mechanism.value,
        "module_path": target.module_path,
        "architectures": list(target.architectures),
        "num_hidden_layers": target.num_layers,
    }
    if capture.sglang_ids is not None:
        hook_config["sglang_aux_layer_ids"] = capture.sglang_ids
    staging = card.sglang.staging
    for key, cfg_key in _STAGING_KEYS:
        if getattr(staging, key) is not None:
            hook_config[cfg_key] = getattr(staging, key)
    if card.shards.storage in ENCODED_STORAGES:  # the server's capture core encodes every one of them on the device
        # quantized on the GPU before the copy: half (fp8) or about a quarter (4-bit) of the PCIe, staging and disk bytes
        hook_config["storage"] = card.shards.storage
    return hook_config


def _hook_specs(device: str, target: _Target, capture: _Capture, hook_config: dict[str, Any]) -> list[dict]:
    """The ``--forward-hooks`` specs: the final norm, the mechanism's own (one per aux layer for ``layer_hooks``), then the decoder stack."""
    module_path = target.module_path
    specs: list[dict] = []
    if device == "cpu" and model_family(target.architectures) == "deepseek":
        specs.append({"name": "hs_cpu_mla", "target_modules": [module_path], "hook_factory": CPU_MLA_FACTORY, "config": {}})
    specs.append(
        {
            "name": "hs_capture_final",
            "target_modules": [f"{module_path}.norm"],
            "hook_factory": f"{HOOKS_MODULE}:norm_hook",
            "config": hook_config,
        }
    )
    specs += capture.plan.layer_specs(capture.launch, hook_config, HOOKS_MODULE)
    specs.append(
        {"name": "hs_capture", "target_modules": [module_path], "hook_factory": f"{HOOKS_MODULE}:model_hook", "config": hook_config}
    )
    return specs


# --------------------------------------------------------------------------- the command line and the environment


def _launch_module(specs: list[dict]) -> str:
    """The module the server starts from: hs_dataset's launcher wherever hooks capture, so decode CUDA graphs carry the
    one-pass capture (it starts SGLang's own server); SGLang's own entry for the source patch, which has no hooks."""
    return LAUNCHER_MODULE if specs else "sglang.launch_server"


def _server_argv(
    card: Card, target: _Target, capture: _Capture, specs: list[dict], extra_args: Sequence[str], notes: list[str]
) -> list[str]:
    sg = card.sglang
    argv = ["-m", _launch_module(specs), "--model-path", target.model_path, "--host", target.host, "--port", str(target.port)]
    argv += ["--dtype", card.dtype, "--skip-tokenizer-init"]
    if sg.tp != 1:
        argv += ["--tp-size", str(sg.tp)]
    if sg.device == "cpu":
        argv += ["--device", "cpu", "--disable-cuda-graph"]
    argv += capture.plan.server_args(capture.launch, capture.sglang_ids)
    if capture.facts.prefill_graph_flag:
        argv += ["--disable-prefill-cuda-graph"]  # a prefill replayed in a CUDA graph runs no hook (decode graphs stay on)
    if not sg.keeps_radix_cache(card.regenerate):
        argv += ["--disable-radix-cache"]
    else:
        notes.append(
            "radix cache ON (a regeneration server): one-pass capture keeps what each pass computes; prefill captures "
            "make the server recompute every prompt token (backend.force_full_prefill)"
        )
    if sg.chunked_prefill_size is not None:
        argv += ["--chunked-prefill-size", str(sg.chunked_prefill_size)]
    argv += list(sg.args)
    if card.model.trust_remote_code and "--trust-remote-code" not in argv:
        argv += ["--trust-remote-code"]  # the card allows the snapshot's own code (tokenizer, processor)
    if specs:
        argv += ["--forward-hooks", json.dumps(specs, separators=(",", ":"))]
    argv += [str(a) for a in extra_args]
    if MIXED_CHUNK_FLAG in argv:
        notes.append(MIXED_CHUNK_WARNING)
    return argv


def _server_env(card: Card, info: dict, python: str, argv: Sequence[str], notes: list[str]) -> dict[str, str]:
    """The card's ``sglang.env`` plus what the server needs: the checkout on ``PYTHONPATH`` where hs_dataset is
    not installed, and on a CPU server the CPU engine, the CPU support files and one core range per rank."""
    env = dict(card.sglang.env)
    env.setdefault(DATASETS_HOOK_OFF, "0")  # nothing in the server patches `datasets` (docs/DATASETS.md)
    pypath: list[str] = []
    if not info.get("hs_dataset"):
        if (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "hs_dataset").is_dir():
            pypath.append(str(REPO_ROOT))
            notes.append(f"hs_dataset is not installed in the server env: using the checkout {REPO_ROOT} via PYTHONPATH")
        else:
            raise ServeError(f"hs_dataset is not importable by {python}: install it there with `pip install --no-deps hs_dataset`")
    if card.sglang.device == "cpu":
        env.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        env.setdefault("TORCHDYNAMO_DISABLE", "1")
        if not info.get("sgl_kernel"):
            pypath.append(str(CPU_SUPPORT_DIR))
        _bind_cpu_ranks(card, argv, env, notes)
    if pypath:
        env["PYTHONPATH"] = os.pathsep.join(pypath + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _bind_cpu_ranks(card: Card, argv: Sequence[str], env: dict[str, str], notes: list[str]) -> None:
    """Give every rank of a multi-rank CPU server its own cores (SGLang refuses to start otherwise).

    A value in the card's ``sglang.env`` or in this process's environment is kept as is.
    """
    ranks = cpu_ranks.cpu_rank_count(argv)
    key = cpu_ranks.OMP_BIND_ENV
    if ranks <= 1:
        return
    if key in env or key in os.environ:
        notes.append(f"{key}={env.get(key, os.environ.get(key))} kept from the {'card' if key in env else 'environment'}")
        return
    cores = cpu_ranks.usable_cores()
    if len(cores) < ranks:
        raise ServeError(
            f"{card.source_path}: sglang: this CPU server runs {ranks} ranks (tp x pp x DP replicas, from sglang.tp and "
            f"sglang.args) but this process may use only {len(cores)} core(s) {cores} (os.sched_getaffinity), and "
            f"each rank needs its own: lower sglang.tp / --dp-size / --pp-size, run on more cores, or set "
            f"sglang.env.{key} yourself (one '|'-separated core list per rank)"
        )
    env[key] = cpu_ranks.format_bind(cpu_ranks.split_cores(cores, ranks))
    notes.append(f"{key}={env[key]}: one core range per rank ({ranks} ranks, cores {cores})")
