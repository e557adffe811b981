"""What the dataset repo already holds: the files under a config's folder, and its README.

Both are read once, before anything is uploaded, so a push only sends what differs
(:func:`hs_dataset.hub.files.same_bytes`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hs_dataset.hub.files import RemoteFile
from hs_dataset.hub.layout import README, REPO_TYPE

__all__ = ["remote_files", "remote_readme"]


def remote_files(api: Any, repo_id: str, folder: str, revision: str | None) -> dict[str, RemoteFile]:
    """{path: remote info} of every file under ``folder`` (one paginated tree listing)."""
    from huggingface_hub.errors import EntryNotFoundError
    from huggingface_hub.hf_api import RepoFile

    out: dict[str, RemoteFile] = {}
    try:
        for entry in api.list_repo_tree(repo_id, path_in_repo=folder, recursive=True, repo_type=REPO_TYPE, revision=revision):
            if isinstance(entry, RepoFile):
                lfs = entry.lfs
                out[entry.path] = RemoteFile(int(entry.size), entry.blob_id, lfs.sha256 if lfs is not None else None)
    except EntryNotFoundError:
        pass
    return out


def remote_readme(api: Any, repo_id: str, revision: str | None, work: Path) -> tuple[str | None, RemoteFile | None]:
    """The repo's README text (downloaded under ``work``) and its file info; (None, None) when it has none."""
    from huggingface_hub.errors import EntryNotFoundError
    from huggingface_hub.hf_api import RepoFile

    infos = [e for e in api.get_paths_info(repo_id, [README], repo_type=REPO_TYPE, revision=revision) if isinstance(e, RepoFile)]
    if not infos:
        return None, None
    info = infos[0]
    try:
        path = api.hf_hub_download(repo_id, README, repo_type=REPO_TYPE, revision=revision, local_dir=work / "remote")
    except EntryNotFoundError:
        return None, None
    remote = RemoteFile(int(info.size), info.blob_id, info.lfs.sha256 if info.lfs is not None else None)
    return Path(path).read_text(encoding="utf-8"), remote
