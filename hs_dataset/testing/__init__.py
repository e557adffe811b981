"""Test fixtures that must stay out of production imports: the tiny model and its tokenizer.

Production code reaches the tiny model only through the ``hs_dataset.builtin_models``
entry point (``builtin:tiny-deepseek-v3``), never by importing this package.
"""
