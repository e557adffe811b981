"""The server side: runs INSIDE SGLang scheduler processes.

Modules here import the standard library, torch and sglang, and of hs_dataset only
:mod:`hs_dataset.wire` (the contract both sides share) and the stdlib-only leaves
``errors``, ``dtypes`` and ``libc`` -- never transformers, datasets or the client
side, because the server runs in its own environment (``make sglang-env``);
``pyproject.toml``'s import-linter contracts enforce it. The package ``__init__``
imports nothing.

* :mod:`.hooks` -- ``--forward-hooks`` factories (SGLang 0.5.9+), one runtime per process;
* :mod:`.config` -- :class:`~.config.CaptureConfig`, from the hook config or ``HS_CAPTURE_*`` env vars;
* :mod:`.core` -- the capture core (EXTEND filter, chunk assembly, refusals, flush/close);
* :mod:`.batch` -- a forward pass as the core sees it, split into per-request rows;
* :mod:`.states` -- the pass's states checked into one layout (and fp8-quantized);
* :mod:`.dump_writer` -- the writer threads: header + tensor bytes in one ``writev``;
* :mod:`.staging` -- the private staging directory: atomic writes, spares, refusals, sweeping;
* :mod:`.budget` -- the bounded staging budget and its background meter;
* :mod:`.copier` -- device -> host copies (pinned pool + side stream on CUDA).

The SGLang <= 0.5.5 source patch calls the same core through :mod:`hs_dataset.server_patch.legacy.hook`.
"""
