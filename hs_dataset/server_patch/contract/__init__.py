"""What the server side and the client side agree on: stdlib only.

The capture client (:mod:`hs_dataset.capture.sglang`) and ``hs-dataset serve``
(:mod:`hs_dataset.capture.serve`) import these modules and nothing else of the
server side (``pyproject.toml``'s import-linter contracts): what a request id looks
like (:mod:`.rid`), what a dump file holds and what a refusal says (:mod:`.dump`),
where dumps appear (:mod:`.private_dir`) and go back (:mod:`.spares`,
:mod:`.mapped_files`), the server's status file (:mod:`.status`), what a decoder
layer returns on the installed SGLang (:mod:`.layer_outputs`), SGLang versions
(:mod:`.sglang_version`) and the legacy patch's header line (:mod:`.legacy_header`).
The encodings a dump's states may use are the codec registry's
(:mod:`hs_dataset.codecs`). docs/SGLANG.md describes the contract for people.
"""
