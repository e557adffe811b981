"""Server-side code: runs INSIDE SGLang scheduler processes.

Modules here may import only the standard library, torch, sglang and safetensors
(never transformers, datasets or the rest of hs_dataset, except the stdlib-only leaf
``hs_dataset.errors`` for the shared error base class), because the server runs in
its own environment (``make sglang-env``). The package ``__init__`` imports nothing.

* :mod:`.protocol` -- the contract shared with the client (rids, file names, dump
  header, layer-id mapping, the fp8 quantizer): the one module the client imports;
* :mod:`.staging` -- the private staging directory, atomic writes, the budget;
* :mod:`.copier` -- device -> host copies (pinned pool + side stream on CUDA);
* :mod:`.capture` -- the capture core (EXTEND filter, per-request split, chunk
  assembly, refusals, writer threads);
* :mod:`.layer_outputs` -- whether the installed SGLang's layers return the residual;
* :mod:`.sglang_hooks` -- ``--forward-hooks`` factories (SGLang 0.5.9+);
* :mod:`.legacy_hook` -- adapter for the SGLang <= 0.5.5 source patch (``legacy_patch``);
* ``cpu_support/`` -- CPU-test-only support files for running a real server without GPU.
"""
