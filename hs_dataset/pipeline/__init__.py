"""The build pipeline: what a run opens from a card, the build over it, and what the build did.

``session`` opens a card once (capture backend, tokenizer, manifest metadata, sample
stream) for both ``build_dataset`` and ``stream``; ``build`` drives that session's
samples through regeneration and capture into the shard writer; ``run_report`` is the
account of every input row a build leaves in ``run_report.json``. The Hugging Face
``datasets`` builder stays at :mod:`hs_dataset.builder`.
"""
