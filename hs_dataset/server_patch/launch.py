"""``python -m hs_dataset.server_patch.launch <sglang server args>``: SGLang's own server, with the decode-graph route.

The same arguments and the same server as ``python -m sglang.launch_server``: SGLang's
own launch module dispatches on the server mode, and its HTTP server launch is handed a
scheduler entry of ours (``run_scheduler_process_func``, an argument SGLang offers for
exactly this) that installs :mod:`.graph_capture` in each scheduler process before
SGLang's scheduler runs. On a server without decode CUDA graphs (CPU,
``--disable-cuda-graph``) the route changes nothing. Where this SGLang's launch cannot take
the entry (:func:`~.compat.server_entry`), the server starts as SGLang's own would and says
so: the hooks then report ``decode_capture: off`` where decode graphs are on.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Sequence

from hs_dataset.server_patch import compat
from hs_dataset.server_patch.graph_capture import run_scheduler_process

__all__ = ["main"]

logger = logging.getLogger("hs_dataset.server_patch")


def main(argv: Sequence[str] | None = None) -> None:
    """Start SGLang's server from its command-line arguments, each scheduler process with the route installed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    entry = compat.server_entry()
    if isinstance(entry, str):
        print(f"hs_dataset.server_patch.launch: starting SGLang's own launch without the decode-graph route: {entry}", file=sys.stderr)
        import runpy

        sys.argv = ["sglang.launch_server", *argv]
        runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
        return
    if entry.load_plugins is not None:
        entry.load_plugins()
    server_args = entry.prepare_server_args(argv)
    launch = entry.http_server.launch_server
    entry.http_server.launch_server = functools.partial(launch, run_scheduler_process_func=run_scheduler_process)
    try:
        entry.run_server(server_args)
    finally:
        entry.http_server.launch_server = launch
        entry.kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
