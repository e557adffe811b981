"""The ``decode_capture`` fact: whether a server's hooks see its decode steps, so one-pass capture can work there.

One-pass requests (:func:`~hs_dataset.server_patch.contract.rid.make_one_pass_rid`) need the
states of every decode step. With SGLang's decode CUDA graphs on, a replayed step runs no
Python hook: only a server started through ``python -m hs_dataset.server_patch.launch``
(``hs-dataset serve`` does) has copies into static buffers recorded in its decode graphs
and reads them after each replay. The hooks report which case holds in their status file
(``facts["decode_capture"]``), and refuse one-pass requests where none does:

* ``graph`` -- decode graphs were captured with the hooks' copies in them;
* ``eager`` -- no decode graph (a CPU server, ``--disable-cuda-graph``): the hooks see every step;
* ``off: <reason>`` -- decode graphs are on and no route covers them; one-pass requests are refused with the reason.

Stdlib only: the server writes the fact, the client reads it.
"""

from __future__ import annotations

__all__ = ["DECODE_CAPTURE", "EAGER", "GRAPH", "LAUNCHER_MODULE", "OFF", "off", "one_pass_refusal"]

LAUNCHER_MODULE = "hs_dataset.server_patch.launch"  # ``python -m`` it instead of sglang.launch_server: the route is installed

DECODE_CAPTURE = "decode_capture"  # the key in the status file's facts
GRAPH = "graph"
EAGER = "eager"
OFF = "off"


def off(reason: str) -> str:
    """The fact for a server whose decode steps escape the hooks, with the reason."""
    return f"{OFF}: {reason}"


def one_pass_refusal(fact: object) -> str | None:
    """Why one-pass capture cannot work under this fact (``None``: it can).

    A missing or unknown fact is a reason too: a reader must not assume decode steps
    reach hooks that never said so.
    """
    if fact in (GRAPH, EAGER):
        return None
    if isinstance(fact, str) and fact.startswith(f"{OFF}: "):
        return fact[len(OFF) + 2 :]
    if fact is None:
        return "the server's hooks did not report whether decode steps reach them (an older hs_dataset on the server)"
    return f"the server's hooks report an unknown decode_capture fact {str(fact)[:80]!r}"
