"""What runs inside the SGLang server process, and nothing else.

Modules here import the standard library, torch (triton, sglang) and, of hs_dataset,
only their own :mod:`.contract` (what the client reads), the codec registry
(:mod:`hs_dataset.codecs`) and the stdlib leaves ``errors``, ``dtypes`` and ``libc`` --
never transformers, datasets or the client side, because the server runs in its own
environment (``make sglang-env``); ``pyproject.toml``'s import-linter contracts enforce
it. The package ``__init__`` imports nothing.

* :mod:`.hooks` -- ``--forward-hooks`` factories (SGLang 0.5.9+), one runtime per process;
* :mod:`.mechanisms` -- one object per capture mechanism: the server arguments it refuses, how
  the model hook obtains a pass's aux states;
* :mod:`.compat` -- what differs between SGLang releases (server args, ranks, request ids ...),
  each detected once;
* :mod:`.setup_error` -- :class:`~.setup_error.SetupError`, a server set-up refused at start-up;
* :mod:`.config` -- :class:`~.config.CaptureConfig`, from the hook config or ``HS_CAPTURE_*`` env vars;
* :mod:`.core` -- the capture core (prefill-pass filter, chunk assembly, refusals, flush/close);
* :mod:`.batch` -- a forward pass as the core sees it, split into per-request rows;
* :mod:`.states` -- the pass's states checked into one layout (and quantized on the device);
* :mod:`.dump_writer` -- the writer threads: header + tensor bytes in one ``writev``;
* :mod:`.staging` -- the private staging directory: atomic writes, spares, refusals, sweeping;
* :mod:`.budget` -- the bounded staging budget and its background meter;
* :mod:`.copier`, :mod:`.copy_pump` -- device -> host copies (pinned slab, slices on a side stream);
* :mod:`.one_pass` -- one-pass capture: each generated token's row filed by request, written as pieces;
* :mod:`.graph_capture`, :mod:`.graph_buffers`, :mod:`.row_record` -- one pass inside decode CUDA graphs:
  the hooks registered before capture, their static rows packed one record a row, read after each replay;
* :mod:`.reporter` -- the status file the client reads when a dump is late;
* :mod:`.legacy` -- the source patch of SGLang <= 0.5.5 and the hook it calls (the same core);
* :mod:`.cpu_support` -- what every CPU server needs (an ``sgl_kernel`` stand-in, shims, the MLA handler);
* :mod:`.contract` -- the dump and status contract both sides share, and the one
  :class:`~.contract.mechanism.Mechanism` enum.
"""
