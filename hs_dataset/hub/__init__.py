"""The Hugging Face Hub: push a dataset (index, shards, manifest, card) and read it back.

One module per job: :mod:`~hs_dataset.hub.upload` (``push_to_hub``, ``PushOptions``),
:mod:`~hs_dataset.hub.download` (``open_pushed``, ``download_pushed``),
:mod:`~hs_dataset.hub.index` (the parquet index), :mod:`~hs_dataset.hub.readme` and
:mod:`~hs_dataset.hub.front_matter` (the README), :mod:`~hs_dataset.hub.config_card`
(which config card describes the dataset), :mod:`~hs_dataset.hub.public` (what may leave
the machine), :mod:`~hs_dataset.hub.files` and :mod:`~hs_dataset.hub.repo_state` (what to
upload), :mod:`~hs_dataset.hub.layout` (the repo layout), :mod:`~hs_dataset.hub.repo_id` (the id, checked first) and
:mod:`~hs_dataset.hub.timeouts`. Import what you need from its module; importing this
package loads nothing (huggingface_hub only when used).
"""
