"""One-pass capture inside SGLang's decode CUDA graphs: the hooks go on before the graphs are captured, and are read after each replay.

SGLang 0.5.14 - 0.5.19 register ``--forward-hooks`` after capturing their decode graphs, on
purpose, so no hook runs on a replayed decode step, and one-pass capture (the states of
every generated token, computed by the decode step that makes it) would see no decode
step at all with graphs on. :func:`install`, run first in each scheduler process by the
launcher (:mod:`.launch`), wraps two methods in memory, no file edited:

* ``ModelRunner.init_cuda_graphs`` (every graph's capture): the hs_dataset hook specs (a
  ``hook_factory`` under ``hs_dataset.server_patch``) are registered on the model first, so
  their copies into static buffers are recorded in every decode graph
  (:mod:`.graph_buffers`), and hidden from SGLang's own registration after capture, so
  they are not registered twice; the spec lists are restored afterwards. Then the hooks
  learn whether decode graphs were made (``decode_capture``: ``graph`` or ``eager``).
* the decode graph runner's replay (``DecodeCudaGraphRunner.execute``): after each replay
  the hooks' runtime reads the replayed rows (``on_graph_replay``).

Which methods exist is read from the installed SGLang (:func:`~.compat.graph_route`), not
from its version; where they are not found nothing is wrapped and the reason is recorded
(:mod:`.decode_route`): the hooks then report ``decode_capture: off: <reason>`` where decode
graphs are on, and refuse one-pass requests. Where no decode CUDA graph will be captured (a
CPU server, ``--disable-cuda-graph``) the wrapper changes nothing: the hooks see every step.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from hs_dataset.server_patch import compat, decode_route, hooks

__all__ = ["HOOK_FACTORY_PREFIX", "install", "is_ours", "run_scheduler_process"]

logger = logging.getLogger("hs_dataset.server_patch")

HOOK_FACTORY_PREFIX = "hs_dataset.server_patch"  # the hook specs whose factories are ours
_GRAPH_DEVICES = ("cuda", "musa")  # where decode graphs are CUDA graphs a copy can be recorded in


def is_ours(spec: Any) -> bool:
    """Whether a ``--forward-hooks`` spec is one of the hs_dataset capture hooks."""
    return isinstance(spec, dict) and str(spec.get("hook_factory", "")).startswith(HOOK_FACTORY_PREFIX)


def install() -> decode_route.Route:
    """Wrap the graph capture and the decode replay of the installed SGLang (once per process); the route's state."""
    if decode_route.ROUTE.installed or decode_route.ROUTE.reason is not None:
        return decode_route.ROUTE
    route = compat.graph_route()
    if isinstance(route, str):
        decode_route.ROUTE.reason = f"the decode-graph route is not installed: {route}"
        logger.warning("hs_dataset capture: %s", decode_route.ROUTE.reason)
        return decode_route.ROUTE
    setattr(route.model_runner, _INIT, _wrap_init(getattr(route.model_runner, _INIT), route))
    setattr(route.graph_runner, route.replay_method, _wrap_replay(getattr(route.graph_runner, route.replay_method)))
    decode_route.ROUTE.installed = True
    logger.info(
        "hs_dataset capture: decode-graph route installed (%s.init_cuda_graphs, %s.%s)",
        route.model_runner.__name__,
        route.graph_runner.__name__,
        route.replay_method,
    )
    return decode_route.ROUTE


_INIT = "init_cuda_graphs"  # ModelRunner's method that captures the graphs (a name: the class is found at run time)


def _wrap_init(original, route: compat.GraphRoute):
    @functools.wraps(original)
    def init_cuda_graphs(runner, *args, **kwargs):
        lists = _early_specs(runner)
        if isinstance(lists, str):
            if lists:
                decode_route.ROUTE.reason = lists
                logger.warning("hs_dataset capture: hooks left to SGLang's registration after graph capture: %s", lists)
            return original(runner, *args, **kwargs)
        if decode_route.ROUTE.captured is not None:  # graphs captured again (a recapture): the hooks are on already
            with _hidden(lists):
                return original(runner, *args, **kwargs)
        ours = [spec for spec in lists[0] if is_ours(spec)]
        decode_route.ROUTE.early = True
        try:
            with _hidden(lists):
                route.register_hooks(runner.model, ours)
                result = original(runner, *args, **kwargs)
        finally:
            decode_route.ROUTE.early = False
        decode_route.ROUTE.captured = isinstance(getattr(runner, "decode_cuda_graph_runner", None), route.graph_runner)
        rt = hooks.route_runtime()
        if rt is not None:
            rt.graphs_captured(decode_route.ROUTE.captured)
        return result

    return init_cuda_graphs


def _early_specs(runner) -> list[list] | str:
    """The spec lists to register ours from before capture, or why not ("" where nothing is to be done: no graph, no hook of ours)."""
    if getattr(runner, "is_draft_worker", False):
        return ""  # the draft model: the capture hooks are the target's
    args = getattr(runner, "server_args", None)
    device = str(getattr(runner, "device", getattr(args, "device", "")))
    if not device.startswith(_GRAPH_DEVICES) or compat.decode_cuda_graph(args) != "on":
        return ""  # no decode CUDA graph: SGLang's own registration after capture sees every step
    lists = compat.forward_hook_lists(args)
    if isinstance(lists, str):
        return lists
    if not lists or not any(is_ours(spec) for spec in lists[0]):
        return ""
    return lists


@contextlib.contextmanager
def _hidden(lists: list[list]) -> Iterator[None]:
    """Our specs out of every list SGLang registers from after capture (in place: it may hold the same object), then back."""
    saved = [list(specs) for specs in lists]
    for specs in lists:
        specs[:] = [spec for spec in specs if not is_ours(spec)]
    try:
        yield
    finally:
        for specs, before in zip(lists, saved, strict=True):
            specs[:] = before


def _wrap_replay(original):
    @functools.wraps(original)
    def replay(graph_runner, forward_batch, *args, **kwargs):
        out = original(graph_runner, forward_batch, *args, **kwargs)
        rt = hooks.route_runtime()
        if rt is not None and rt.graph is not None and not getattr(getattr(graph_runner, "model_runner", None), "is_draft_worker", False):
            took = rt.guard(rt.on_graph_replay, forward_batch)
            if rt.core is not None:  # of the hooks' time, the replays' (the status file's replay_hook_wall_ns)
                rt.core.stats["replay_hook_wall_ns"] += took
        return out

    return replay


SWITCH_INTERVAL_ENV = "HS_CAPTURE_SWITCH_INTERVAL_S"


def _switch_interval() -> None:
    """``sys.setswitchinterval`` from :data:`SWITCH_INTERVAL_ENV`, where set (an experiment, not a default).

    Why: capture's threads (the copy pump, the one-pass collector, the writers) share the
    scheduler process's GIL; a thread that wants it back waits up to the switch interval
    (5 ms) for one that runs Python. Whether a shorter interval shortens the decode step
    under one-pass capture is measured by ``scripts/gpu/run_one_pass_profile.sh``.
    """
    raw = os.environ.get(SWITCH_INTERVAL_ENV)
    if not raw:
        return
    try:
        seconds = float(raw)
        if not 0 < seconds <= 1:
            raise ValueError
    except ValueError:
        logger.warning("hs_dataset capture: %s=%r ignored: expected seconds in (0, 1]", SWITCH_INTERVAL_ENV, raw)
        return
    sys.setswitchinterval(seconds)
    logger.info("hs_dataset capture: switch interval %.4f s (%s)", seconds, SWITCH_INTERVAL_ENV)


def run_scheduler_process(*args, **kwargs):
    """SGLang's scheduler process with the route installed first (the launcher hands this to SGLang; it runs in the child)."""
    _switch_interval()
    install()
    from sglang.srt.managers.scheduler import run_scheduler_process as original

    return original(*args, **kwargs)
