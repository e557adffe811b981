"""The server side: runs INSIDE SGLang scheduler processes.

Modules here import the standard library, torch and sglang, and of hs_dataset only
:mod:`hs_dataset.wire` (the contract both sides share) and the stdlib-only leaves
``errors``, ``dtypes`` and ``libc`` -- never transformers, datasets or the client
side, because the server runs in its own environment (``make sglang-env``);
``pyproject.toml``'s import-linter contracts enforce it. The package ``__init__``
imports nothing.

* :mod:`.hooks` -- ``--forward-hooks`` factories (SGLang 0.5.9+), one runtime per process;
* :mod:`.core` -- the capture core (EXTEND filter, per-request split, chunk assembly,
  refusals, writer threads);
* :mod:`.staging` -- the private staging directory, atomic writes, the budget;
* :mod:`.copier` -- device -> host copies (pinned pool + side stream on CUDA).

The SGLang <= 0.5.5 source patch calls the same core through :mod:`hs_dataset.sglang.legacy.hook`.
"""
