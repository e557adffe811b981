"""What differs between SGLang releases, as the server side needs it: each fact detected once, then plain calls.

The hooks run inside whatever SGLang the server has installed (0.5.5 with the source patch,
0.5.9 - 0.5.23 with forward hooks), and a few accessors moved between releases. Every such
probe lives here, so the hooks and the mechanisms read one answer:

* :func:`sglang_version` -- the installed distribution's version (cached);
* :func:`server_args` -- the resolved server arguments: ``runtime_context.get_server_args``
  (0.5.23) or ``server_args.get_global_server_args`` (0.5.9 - 0.5.19); the first that answers is kept;
* :func:`attention_ranks` -- this process's attention-TP and attention-DP ranks, from
  ``runtime_context`` (0.5.23), ``dp_attention`` or plain tensor parallelism; the first reader
  that answers is kept;
* :func:`forward_batch_rids` -- whether the loaded ``ForwardBatch`` carries request ids (cached);
* :func:`prefill_cuda_graph`, :func:`decode_cuda_graph` -- the CUDA-graph state of each phase as the server args spell it;
* :func:`graph_route` -- where decode graphs are captured and replayed, for one-pass capture inside them;
* :func:`forward_hook_lists` -- the lists of hook specs SGLang registers after graph capture;
* :func:`server_entry` -- SGLang's own HTTP server launch, for a launcher that hands it a scheduler entry;
* :func:`tp_size` and :func:`loaded_source`.

Stdlib only (SGLang is imported lazily, inside the server).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = [
    "GraphRoute",
    "ServerEntry",
    "attention_ranks",
    "decode_cuda_graph",
    "forward_batch_rids",
    "forward_hook_lists",
    "graph_route",
    "loaded_source",
    "prefill_cuda_graph",
    "reset",
    "server_args",
    "server_entry",
    "sglang_version",
    "tp_size",
]


@functools.cache
def sglang_version() -> str:
    """The installed SGLang's version (``unknown`` where neither its metadata nor the module says)."""
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        try:
            import sglang

            return str(getattr(sglang, "__version__", "unknown"))
        except Exception:
            return "unknown"


class _FirstAnswer:
    """Readers tried in release order until one answers; that one is kept for every later call.

    Why not the first that imports: a reader can import and still fail until the server has set
    its state (the ranks before the parallel groups exist), where an older accessor answers.
    """

    def __init__(self, readers: tuple[tuple[str, Callable[[], Any]], ...]) -> None:
        self._readers = readers
        self._kept: tuple[str, Callable[[], Any]] | None = None

    def __call__(self) -> tuple[Any, str]:
        """(the answer, the reader's name); the last reader's error where none answers."""
        if self._kept is not None:
            name, reader = self._kept
            return reader(), name
        for i, (name, reader) in enumerate(self._readers):
            try:
                answer = reader()
            except Exception:
                if i == len(self._readers) - 1:
                    raise
                continue
            self._kept = (name, reader)
            return answer, name
        raise LookupError("no reader")

    def forget(self) -> None:
        self._kept = None


def _args_from_runtime_context() -> Any:
    from sglang.srt.runtime_context import get_server_args  # 0.5.23

    return get_server_args()


def _args_from_global() -> Any:
    from sglang.srt.server_args import get_global_server_args  # 0.5.9 - 0.5.19

    return get_global_server_args()


_SERVER_ARGS = _FirstAnswer((("runtime_context", _args_from_runtime_context), ("server_args", _args_from_global)))


def server_args() -> Any | None:
    """The server's resolved arguments (``None`` outside a server or before they are set)."""
    try:
        return _SERVER_ARGS()[0]
    except Exception:
        return None


def _ranks_from_runtime_context() -> tuple[int, int]:
    from sglang.srt.runtime_context import get_parallel  # 0.5.23

    p = get_parallel()
    tp = int(p.attn_tp_rank)
    try:
        dp = int(p.attn_dp_rank)
    except Exception:
        dp = 0
    return tp, dp


def _ranks_from_dp_attention() -> tuple[int, int]:
    from sglang.srt.layers.dp_attention import get_attention_dp_rank, get_attention_tp_rank

    return int(get_attention_tp_rank()), int(get_attention_dp_rank())


def _ranks_from_tensor_parallel() -> tuple[int, int]:
    from sglang.srt.distributed import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank()), 0


_RANKS = _FirstAnswer(
    (
        ("runtime_context", _ranks_from_runtime_context),
        ("dp_attention", _ranks_from_dp_attention),
        ("tensor_parallel", _ranks_from_tensor_parallel),
    )
)


def attention_ranks() -> tuple[int, int, str]:
    """(attention-TP rank, attention-DP rank, the reader's name) of this process.

    Raises where no reader answers (the parallel state is not ready yet: the caller asks again later).
    """
    (tp, dp), name = _RANKS()
    return tp, dp, name


@functools.cache
def forward_batch_rids() -> bool | None:
    """Whether the loaded ``ForwardBatch`` carries request ids (a field ``rids``); ``None`` if it cannot be found.

    Read from the class this server imported, not from its version: without rids the
    hooks key dumps by content, and the client must know which (the status file says).
    """
    try:
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    except Exception:
        return None
    fields = getattr(ForwardBatch, "__dataclass_fields__", None)
    return "rids" in (fields if fields is not None else getattr(ForwardBatch, "__annotations__", {}))


def prefill_cuda_graph(args: Any) -> str:
    """``on``, ``off``, ``absent`` (this SGLang has no prefill CUDA graph) or ``unknown``, from the resolved server args.

    A prefill replayed in a CUDA graph runs no Python hook at all (SGLang 0.5.14 by default)
    or only the outer model's (0.5.15+: no final-norm or layer hook), so capture cannot work.
    The ``cuda_graph_config.prefill.backend`` of newer releases is read first, then the
    ``disable_prefill_cuda_graph`` flag of 0.5.14 - 0.5.19.
    """
    if args is None:
        return "unknown"
    backend = getattr(getattr(getattr(args, "cuda_graph_config", None), "prefill", None), "backend", None)
    if backend is not None:
        return "off" if str(getattr(backend, "value", backend)).lower() in ("disabled", "backend.disabled") else "on"
    if hasattr(args, "disable_prefill_cuda_graph"):
        off = bool(getattr(args, "disable_prefill_cuda_graph", False) or getattr(args, "disable_cuda_graph", False))
        return "off" if off else "on"
    return "absent"


def decode_cuda_graph(args: Any) -> str:
    """``on``, ``off`` or ``unknown``: whether decode steps replay in a CUDA graph, from the resolved server args.

    Only a CUDA (or MUSA) device captures CUDA graphs; a CPU server's decode graphs, where
    torch.compile makes them, are compiled code, not replays, and counted ``on`` too: no
    Python hook of ours runs per step there either. ``cuda_graph_config.decode.backend`` of
    0.5.16+ is read first, then the ``disable_cuda_graph`` flag every release has.
    """
    if args is None:
        return "unknown"
    device = str(getattr(args, "device", "cuda") or "cuda")
    if device.startswith("cpu"):
        return "on" if getattr(args, "enable_torch_compile", False) else "off"
    if getattr(args, "disable_cuda_graph", False):
        return "off"
    backend = getattr(getattr(getattr(args, "cuda_graph_config", None), "decode", None), "backend", None)
    if backend is not None and str(getattr(backend, "value", backend)).lower() in ("disabled", "backend.disabled"):
        return "off"
    return "on"


class GraphRoute(NamedTuple):
    """Where one-pass capture hooks into SGLang's decode graphs (found in the installed code, never by version)."""

    model_runner: type  # its ``init_cuda_graphs`` captures every graph, then registers ``--forward-hooks``
    graph_runner: type  # the decode graph runner; ``replay_method`` replays one batch
    replay_method: str  # takes the ForwardBatch as its first argument
    register_hooks: Callable[[Any, list[Any]], None]  # SGLang's own ``register_forward_hooks(model, specs)``


# (module, class, replay method) of the decode graph runner, newest layout first: 0.5.14+ split the runners
# into ``runner/``; earlier releases had one ``CudaGraphRunner`` whose ``replay`` took the batch.
_GRAPH_RUNNERS = (
    ("sglang.srt.model_executor.runner.decode_cuda_graph_runner", "DecodeCudaGraphRunner", "execute"),
    ("sglang.srt.model_executor.cuda_graph_runner", "CudaGraphRunner", "replay"),
)


def graph_route() -> GraphRoute | str:
    """The decode-graph route of the installed SGLang, or why there is none (a sentence)."""
    try:
        from sglang.srt.model_executor.hook_manager import register_forward_hooks
        from sglang.srt.model_executor.model_runner import ModelRunner
    except Exception as exc:
        return f"SGLang's ModelRunner or hook_manager.register_forward_hooks cannot be imported ({type(exc).__name__}: {exc})"
    if not callable(getattr(ModelRunner, "init_cuda_graphs", None)):
        return "SGLang's ModelRunner has no init_cuda_graphs"
    for module, name, method in _GRAPH_RUNNERS:
        try:
            runner = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if callable(getattr(runner, method, None)):
            return GraphRoute(ModelRunner, runner, method, register_forward_hooks)
    return "no decode graph runner found (" + ", ".join(f"{m}.{c}.{r}" for m, c, r in _GRAPH_RUNNERS) + ")"


def forward_hook_lists(args: Any) -> list[list[Any]] | str:
    """Every list of hook specs SGLang may register from after graph capture, or why one cannot be edited in place.

    0.5.9 - 0.5.19 read ``server_args.forward_hooks``; 0.5.23 reads its observability config
    (``runtime_context.get_observability().forward_hooks``), which may be another object.
    """
    lists: list[list[Any]] = []
    for source, specs in (("server_args.forward_hooks", getattr(args, "forward_hooks", None)), _observability_hooks()):
        if specs is None or any(specs is known for known in lists):
            continue
        if not isinstance(specs, list):
            return f"{source} is a {type(specs).__name__}, not a list that can be edited in place"
        lists.append(specs)
    return lists


def _observability_hooks() -> tuple[str, Any]:
    try:
        from sglang.srt.runtime_context import get_observability  # 0.5.23

        return "observability.forward_hooks", get_observability().forward_hooks
    except Exception:
        return "observability.forward_hooks", None


class ServerEntry(NamedTuple):
    """SGLang's own ``python -m sglang.launch_server``, taken apart so a launcher can hand it a scheduler entry."""

    prepare_server_args: Callable[[list[str]], Any]
    run_server: Callable[[Any], None]  # the launch module's dispatch on the server mode
    http_server: Any  # the module whose ``launch_server`` takes ``run_scheduler_process_func``
    load_plugins: Callable[[], None] | None  # 0.5.14+: what ``__main__`` runs before reading the args
    kill_process_tree: Callable[..., None]


def server_entry() -> ServerEntry | str:
    """SGLang's launch entry, or why it cannot take a scheduler entry of ours (a sentence)."""
    try:
        from sglang import launch_server as entry
        from sglang.srt.entrypoints import http_server
        from sglang.srt.server_args import prepare_server_args
        from sglang.srt.utils import kill_process_tree
    except Exception as exc:
        return f"SGLang's launch modules cannot be imported ({type(exc).__name__}: {exc})"
    params = inspect.signature(http_server.launch_server).parameters
    if "run_scheduler_process_func" not in params:
        return "this SGLang's http_server.launch_server takes no run_scheduler_process_func"
    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:
        load_plugins = None
    run_server = getattr(entry, "run_server", None)
    if not callable(run_server):
        return "this SGLang's sglang.launch_server has no run_server"
    return ServerEntry(prepare_server_args, run_server, http_server, load_plugins, kill_process_tree)


def tp_size() -> int:
    """The server's tensor-parallel size (1 where its arguments cannot be read)."""
    args = server_args()
    return int(getattr(args, "tp_size", 1) or 1) if args is not None else 1


def loaded_source(module: str, class_name: str) -> str | None:
    """Source of a class this server actually imports (``None`` if it cannot be found)."""
    try:
        return inspect.getsource(getattr(importlib.import_module(module), class_name))
    except (ImportError, AttributeError, OSError, TypeError):
        return None


def reset() -> None:
    """Forget every detected fact (tests; a server detects once)."""
    sglang_version.cache_clear()
    forward_batch_rids.cache_clear()
    _SERVER_ARGS.forget()
    _RANKS.forget()
