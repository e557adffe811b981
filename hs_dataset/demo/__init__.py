"""What the embedded default ships: the tiny DeepseekV3 built locally, its tokenizer and the bundled conversations.

The card ``tiny-deepseek-hf`` names the model ``builtin:tiny-deepseek-v3``, which the one
model resolver (:func:`hs_dataset.model.snapshot.resolve_model_path`) builds through the
``hs_dataset.builtin_models`` entry point; ``data/`` holds the 42 bundled conversations
(``builtin:conversations``) and the Kimi-K2.5-shaped chat template.
"""
