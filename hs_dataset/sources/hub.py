"""``hf:ORG/NAME`` sources: a Hub dataset read through ``datasets.load_dataset``.

Streaming is tried first (rows arrive while the split downloads, and a huge split
never has to fit on disk); a dataset that cannot stream, or a machine that is offline
(``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``), reads the split non-streaming, which
``datasets`` serves from its local cache when offline. Errors name the dataset, the
subset/split/revision asked for and the flag that changes them.

Before anything is asked of ``datasets``, one request checks that the Hub answers at all:
without a network, ``datasets`` and ``huggingface_hub`` retry with backoff (20 retry lines
over 52 s, measured) before the same failure. An unreachable Hub is one line in seconds,
naming the offline flag that reads a cached copy instead.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

from hs_dataset.errors import SourceError

__all__ = ["HF_PREFIX", "load_hub_rows"]

HF_PREFIX = "hf:"
REACH_TIMEOUT_S = 5.0  # the Hub answers a HEAD in well under a second where there is a network


def _unreachable() -> str | None:
    """Why the Hub endpoint does not answer (a connection refused, a timeout, no route), or None when it answers at all.

    Any HTTP status counts as an answer; proxies from the environment are used, as ``huggingface_hub`` uses them.
    """
    from huggingface_hub import constants

    endpoint = str(constants.ENDPOINT)
    try:
        with urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=REACH_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"the Hub ({endpoint}) does not answer: {reason}"


def _offline() -> bool:
    import datasets.config
    from huggingface_hub import constants

    return bool(getattr(datasets.config, "HF_DATASETS_OFFLINE", False) or getattr(constants, "HF_HUB_OFFLINE", False))


def load_hub_rows(
    repo: str,
    *,
    subset: str | None = None,
    split: str | None = None,
    revision: str | None = None,
    streaming: bool = True,
) -> Any:
    """The rows of one split of Hub dataset ``repo`` (a ``Dataset`` or ``IterableDataset``)."""
    import datasets

    if not repo or repo.count("/") > 1:
        raise SourceError(f"hf:{repo}: name a Hub dataset as hf:ORG/NAME (or hf:NAME)")
    split = split or "train"
    what = f"hf:{repo} (subset {subset!r}, split {split!r}, revision {revision or 'main'!r})"
    if not _offline() and (why := _unreachable()) is not None:
        raise SourceError(f"{what} cannot be loaded: {why}; connect, or set HF_HUB_OFFLINE=1 to read a copy in the local datasets cache")
    attempts = [True, False] if streaming and not _offline() else [False]
    last: Exception | None = None
    for stream in attempts:
        try:
            return datasets.load_dataset(repo, subset, split=split, revision=revision, streaming=stream)
        except (ValueError, KeyError) as exc:  # bad split or subset: no point retrying without streaming
            raise SourceError(f"{what}: {exc} (pick another with --subset/--split)") from None
        except Exception as exc:  # noqa: BLE001 - datasets raises many types; the next attempt or the message decides
            last = exc
    hint = "it is not in the local datasets cache (offline)" if _offline() else "check the name, --revision and the network"
    raise SourceError(f"{what} cannot be loaded: {type(last).__name__}: {last}; {hint}") from None
