"""The contract between the server side (inside SGLang) and the client side: stdlib only.

Both sides import these modules and nothing else of each other (``pyproject.toml``'s
import-linter contracts): what a request id looks like (:mod:`.rid`), what a dump file
holds (:mod:`.dump`, :mod:`.safetensors_header`, :mod:`.fp8`), where it appears
(:mod:`.private_dir`) and goes back (:mod:`.spares`, :mod:`.mapped_files`), and what the
layer ids mean on each SGLang (:mod:`.layer_ids`, :mod:`.layer_outputs`,
:mod:`.sglang_version`). docs/SGLANG.md describes the contract for people.
"""
