"""A Hub repository id, checked before any work or request.

Why: huggingface_hub checks the id only when the first request is built, after a push
has read and hashed the dataset, and its ``HFValidationError`` is no error of ours, so
the CLI reported a mistyped id (``a/b/c``) as an internal error (exit 70). Checking it
up front with huggingface_hub's own validator keeps the rule the Hub's and the answer
one line.
"""

from __future__ import annotations

from hs_dataset.errors import UsageError

__all__ = ["check_repo_id"]


def check_repo_id(repo_id: object, *, what: str = "repo_id") -> str:
    """``repo_id`` when it is a valid ``name`` or ``namespace/name``; else a one-line UsageError saying the form."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(repo_id, str):
        raise UsageError(f"{what} must be a string such as user/my-eagle3-data, got {type(repo_id).__name__}")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        reason = " ".join(str(exc).split()).removesuffix(" Use `repo_type` argument if needed.").rstrip(".")
        raise UsageError(
            f"{what} {repo_id[:120]!r} is not a Hub repository id ({reason[:200]}); give NAME or NAMESPACE/NAME, e.g. user/my-eagle3-data"
        ) from None
    return repo_id
