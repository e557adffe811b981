"""The launch plan of an SGLang server with everything capture needs.

The server runs in its own environment (``make sglang-env`` -> ``.sglang-venv``);
this module builds its command line and environment from a card and checks the
installed SGLang against :data:`SUPPORTED`; :mod:`hs_dataset.sglang.launch.process` starts
it and waits for health.

Card keys read (``sglang:`` section unless noted; all optional except where said):

``python``            server interpreter (default ``$HS_SGLANG_PYTHON`` or ``<repo>/.sglang-venv/bin/python``)
``device``            ``cuda`` (default) or ``cpu`` (CPU test servers: adds the CPU support files)
``tp``                tensor-parallel size (default 1); a CPU server of several ranks gets one core range per
                      rank in ``SGLANG_CPU_OMP_THREADS_BIND`` unless ``env`` sets it (:mod:`.cpu_ranks`)
``host`` / ``port``   listen address (default 127.0.0.1:30000)
``module_path``       decoder-stack module (default ``model.text_module`` or ``model``)
``mechanism``         ``auto`` (default), ``aux_return`` or ``layer_hooks`` (refused where the installed
                      decoder layer's ``forward`` does not return the residual: read from its source)
``radix_cache``       keep SGLang's prefix cache on (default false: ``--disable-radix-cache``)
``chunked_prefill_size``  passed through when set (chunks are assembled into one dump)
``startup_timeout_s`` seconds to wait for ``/health`` (default 900)
``env``               extra environment variables for the server
``args``              extra SGLang arguments (list)
``staging``           ``dir``, ``max_bytes``, ``max_files``, ``max_wait_s``, ``writer_threads``,
                      ``pinned_pool_bytes``, ``orphan_ttl_s`` (see docs/SGLANG.md)
top level: ``model.path`` (or ``model.id``), ``layers.aux``, ``dtype``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hs_dataset.config import Card, card_from_dict
from hs_dataset.errors import HsDatasetError
from hs_dataset.sglang.launch import cpu_ranks
from hs_dataset.sglang.support import UnsupportedVersionError
from hs_dataset.sglang.support import support_for as _table_support_for
from hs_dataset.wire.layer_outputs import layer_hooks_problem

__all__ = [
    "SUPPORTED",
    "ServerPlan",
    "support_for",
    "plan_server",
    "default_server_python",
    "resolve_server_model_path",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
CPU_SUPPORT_DIR = Path(__file__).resolve().parents[1] / "cpu_support"
HOOKS_MODULE = "hs_dataset.sglang.server.hooks"
CPU_MLA_FACTORY = "hs_dataset.sglang.cpu_support.mla_torch_native:factory"
DATASETS_HOOK_OFF = "HS_DATASET_DATASETS_HOOK"  # hs_dataset.datasets_hook.OFF_SWITCH (a string: launch must not import the hook)

class ServeError(HsDatasetError, RuntimeError):
    """The server cannot be planned or started; the message says how to fix it."""


def support_for(version: str) -> tuple[str, str]:
    """(mechanism, status) for an SGLang version, from the protocol's table; :class:`ServeError` if unsupported."""
    try:
        return _table_support_for(version)
    except UnsupportedVersionError as exc:
        raise ServeError(str(exc)) from None


def default_server_python() -> str:
    return os.environ.get("HS_SGLANG_PYTHON") or str(REPO_ROOT / ".sglang-venv" / "bin" / "python")


def resolve_server_model_path(path: str | None) -> str:
    """The server's ``--model-path``: the one resolver in :mod:`hs_dataset.model.snapshot`."""
    from hs_dataset.model.snapshot import ModelPathError, resolve_model_path

    try:
        return str(resolve_model_path(path))
    except ModelPathError as exc:
        raise ServeError(str(exc)) from None


def _model_config(model_path: str) -> dict:
    cfg_path = Path(model_path) / "config.json"
    if not cfg_path.is_file():
        return {}
    from hs_dataset.model.snapshot import text_config

    cfg = json.loads(cfg_path.read_text())
    text = dict(text_config(cfg))  # multimodal wrappers (Kimi-K2.5): layers live in the text config
    text["architectures"] = cfg.get("architectures") or text.get("architectures")  # the served class is the wrapper's
    return text


def _probe_server_env(python: str) -> dict:
    code = (
        "import importlib.metadata as m, importlib.util as u, json, os\n"
        "out = {'sglang': None}\n"
        "try:\n    out['sglang'] = m.version('sglang')\nexcept m.PackageNotFoundError:\n    pass\n"
        "out['hs_dataset'] = u.find_spec('hs_dataset') is not None\n"
        "s = u.find_spec('sgl_kernel')\nout['sgl_kernel'] = s.origin if s else None\n"
        "s = u.find_spec('sglang')\nout['sglang_dir'] = os.path.dirname(s.origin) if s and s.origin else None\n"
        "print(json.dumps(out))\n"
    )
    if not os.path.exists(python):
        raise ServeError(f"server Python {python} does not exist: run `make sglang-env` (or set HS_SGLANG_PYTHON)")
    try:
        res = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServeError(f"cannot run the server Python {python}: {exc}") from None
    if res.returncode != 0:
        raise ServeError(f"the server Python {python} failed: {res.stderr.strip()[-500:]}")
    info = json.loads(res.stdout.strip().splitlines()[-1])
    if not info.get("sglang"):
        raise ServeError(f"sglang is not installed in {python}: run `make sglang-env`")
    return info


def _installed_source(sglang_dir: str | None) -> Callable[[str, str], str | None]:
    """``read_source`` for :func:`~hs_dataset.wire.layer_outputs.layer_hooks_problem`: a module's file in the server env, unimported."""

    def read(module: str, class_name: str) -> str | None:
        if not sglang_dir or not module.startswith("sglang."):
            return None
        path = Path(sglang_dir, *module.split(".")[1:]).with_suffix(".py")
        try:
            return path.read_text(encoding="utf-8")
        except OSError:
            return None

    return read


def _refuse_wrong_layer_outputs(architectures: Sequence[str], info: dict, version: str, tp_size: int = 1) -> None:
    """Refuse ``layer_hooks`` where the installed decoder layers do not return the residual (read from source)."""
    problem = layer_hooks_problem(architectures, _installed_source(info.get("sglang_dir")), tp_size)
    if problem:
        raise ServeError(f"mechanism 'layer_hooks' on SGLang {version}: {problem}")


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
    mechanism: str
    support_status: str
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
            f"SGLang {self.sglang_version} ({self.support_status})",
            f"mechanism: {self.mechanism}",
            f"model: {self.model_path}",
            f"aux layers: HF hidden_states {self.hf_aux_layer_ids}"
            + (f" -> --return-aux-hidden-state-layer-ids {self.sglang_aux_layer_ids}" if self.sglang_aux_layer_ids else ""),
            "final state: pre-norm (hook on the final norm)",
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
    from hs_dataset.wire.layer_ids import LayerIdError, layer_hook_targets, model_family, sglang_eagle3_ids, validate_hf_ids

    card = card if isinstance(card, Card) else card_from_dict(card)
    if sglang_overrides:
        card = card.with_overrides(sglang=dict(sglang_overrides))
    sg, model = card.sglang, card.model
    aux = list(card.layers.aux)
    dtype = card.dtype
    host = host or sg.host
    port = int(port or sg.port)
    python = python or sg.python or default_server_python()
    if not os.path.isabs(python) and os.sep in python:
        python = str(REPO_ROOT / python)
    device = sg.device
    module_path = sg.module_path or model.text_module or "model"

    mpath = model_path or os.environ.get("HS_DATASET_MODEL_PATH") or model.path or model.id
    mpath = resolve_server_model_path(mpath)
    mcfg = _model_config(mpath)
    architectures = mcfg.get("architectures") or sg.architectures or []
    num_layers = mcfg.get("num_hidden_layers") or sg.num_hidden_layers
    if not num_layers:
        raise ServeError(
            f"cannot read num_hidden_layers for {mpath}: point model.path at a local snapshot with config.json "
            "(or set sglang.num_hidden_layers and sglang.architectures in the card)"
        )
    notes: list[str] = []

    info = _probe_server_env(python)
    version = info["sglang"]
    mechanism, status = support_for(version)
    if sg.mechanism not in ("auto", mechanism):
        requested = sg.mechanism
        if requested == "layer_hooks" and mechanism == "aux_return":
            mechanism = "layer_hooks"
            notes.append("mechanism forced to layer_hooks by the card")
        else:
            raise ServeError(f"mechanism {requested!r} is not available on SGLang {version} (use {mechanism!r})")
    if mechanism == "layer_hooks":
        tp_size = cpu_ranks.parallel_sizes(["--tp-size", str(sg.tp), *sg.args, *extra_args])[0]["tp"]
        _refuse_wrong_layer_outputs(architectures, info, version, tp_size)
    if model_family(architectures) != "deepseek" and mechanism == "layer_hooks":
        notes.append("layer_hooks on a non-DeepseekV2/V3 model: hook outputs are (hidden, residual) pairs as read from source")

    try:
        hf_ids = validate_hf_ids(aux, int(num_layers))
        sglang_ids = sglang_eagle3_ids(hf_ids, architectures, version, int(num_layers)) if mechanism == "aux_return" else None
    except LayerIdError as exc:
        raise ServeError(str(exc)) from None

    staging = sg.staging
    staging_dir = os.path.abspath(staging_dir or staging.dir or default_staging_dir(host, port))
    hook_config: dict[str, Any] = {
        "staging_dir": staging_dir,
        "hf_aux_layer_ids": hf_ids,
        "mechanism": mechanism,
        "module_path": module_path,
        "architectures": list(architectures),
        "num_hidden_layers": int(num_layers),
    }
    if sglang_ids is not None:
        hook_config["sglang_aux_layer_ids"] = sglang_ids
    for key, cfg_key in (
        ("max_bytes", "max_staging_bytes"),
        ("max_files", "max_staging_files"),
        ("max_wait_s", "max_wait_s"),
        ("writer_threads", "writer_threads"),
        ("pinned_pool_bytes", "pinned_pool_bytes"),
        ("orphan_ttl_s", "orphan_ttl_s"),
        ("rid_prefix", "rid_prefix"),
    ):
        if getattr(staging, key) is not None:
            hook_config[cfg_key] = getattr(staging, key)
    if card.shards.storage != "native":
        # quantized on the GPU before the copy: half the PCIe, staging and disk bytes
        hook_config["storage"] = card.shards.storage

    specs: list[dict] = []
    if device == "cpu" and model_family(architectures) == "deepseek":
        specs.append({"name": "hs_cpu_mla", "target_modules": [module_path], "hook_factory": CPU_MLA_FACTORY, "config": {}})
    specs.append(
        {"name": "hs_capture_final", "target_modules": [f"{module_path}.norm"], "hook_factory": f"{HOOKS_MODULE}:norm_hook", "config": hook_config}
    )
    if mechanism == "layer_hooks":
        for target, hf_id in layer_hook_targets(hf_ids, module_path, int(num_layers)).items():
            specs.append(
                {
                    "name": f"hs_capture_aux_{hf_id}",
                    "target_modules": [target],
                    "hook_factory": f"{HOOKS_MODULE}:layer_hook",
                    "config": {**hook_config, "hook_hf_id": hf_id},
                }
            )
    specs.append({"name": "hs_capture", "target_modules": [module_path], "hook_factory": f"{HOOKS_MODULE}:model_hook", "config": hook_config})

    argv = ["-m", "sglang.launch_server", "--model-path", mpath, "--host", host, "--port", str(port)]
    argv += ["--dtype", dtype, "--skip-tokenizer-init"]
    if sg.tp != 1:
        argv += ["--tp-size", str(sg.tp)]
    if device == "cpu":
        argv += ["--device", "cpu", "--disable-cuda-graph"]
    if mechanism == "aux_return":
        argv += ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3", "--return-aux-hidden-state-layer-ids"]
        argv += [str(i) for i in sglang_ids]
    from hs_dataset.sglang.support import parse_version

    if parse_version(version) >= (0, 5, 15):
        argv += ["--disable-prefill-cuda-graph"]  # the final-norm hook must run at prefill
    if not sg.radix_cache:
        argv += ["--disable-radix-cache"]
    else:
        notes.append("radix cache ON: prompts that hit the prefix cache are refused unless the client forces a full prefill")
    if sg.chunked_prefill_size is not None:
        argv += ["--chunked-prefill-size", str(sg.chunked_prefill_size)]
    argv += list(sg.args)
    if model.trust_remote_code and "--trust-remote-code" not in argv:
        argv += ["--trust-remote-code"]  # the card allows the snapshot's own code (tokenizer, processor)
    argv += ["--forward-hooks", json.dumps(specs, separators=(",", ":"))]
    argv += [str(a) for a in extra_args]

    env = dict(sg.env)
    env.setdefault(DATASETS_HOOK_OFF, "0")  # nothing in the server patches `datasets` (docs/DATASETS.md)
    pypath: list[str] = []
    if not info.get("hs_dataset"):
        if (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "hs_dataset").is_dir():
            pypath.append(str(REPO_ROOT))
            notes.append(f"hs_dataset is not installed in the server env: using the checkout {REPO_ROOT} via PYTHONPATH")
        else:
            raise ServeError(f"hs_dataset is not importable by {python}: install it there with `pip install --no-deps hs_dataset`")
    if device == "cpu":
        env.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        env.setdefault("TORCHDYNAMO_DISABLE", "1")
        if not info.get("sgl_kernel"):
            pypath.append(str(CPU_SUPPORT_DIR))
        _bind_cpu_ranks(card, argv, env, notes)
    if pypath:
        env["PYTHONPATH"] = os.pathsep.join(pypath + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return ServerPlan(
        python=python,
        argv=argv,
        env=env,
        url=f"http://{host}:{port}",
        host=host,
        port=port,
        model_path=mpath,
        staging_dir=staging_dir,
        sglang_version=version,
        mechanism=mechanism,
        support_status=status,
        hf_aux_layer_ids=hf_ids,
        sglang_aux_layer_ids=sglang_ids,
        hook_config=hook_config,
        startup_timeout_s=sg.startup_timeout_s,
        notes=notes,
    )
