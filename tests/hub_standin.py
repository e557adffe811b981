"""A local stand-in for the Hugging Face Hub's HTTP API (tests only).

A real HTTP server on 127.0.0.1 that implements the endpoints ``huggingface_hub``
2.x's ``HfApi`` (with ``HF_HUB_DISABLE_XET``), ``hf_hub_download`` /
``snapshot_download``, ``HfFileSystem`` and ``datasets.load_dataset`` call for the
operations hs_dataset uses, with the Hub's wire formats:

* ``POST /api/repos/create`` (409 when the repo exists), ``POST /api/validate-yaml``
* ``GET  /api/{type}s/{repo}[/revision/{rev}]``: repo info (``sha``, ``siblings``, ``cardData``)
* ``GET  /api/{type}s/{repo}/tree/{rev}[/{path}]?recursive=&expand=``: cursor-paginated
  (``Link: <...>; rel="next"``) file/directory entries with ``oid``, ``size``, ``lfs``
* ``POST /api/{type}s/{repo}/paths-info/{rev}`` (form ``paths=...``)
* ``POST /api/{type}s/{repo}/preupload/{rev}``: ``uploadMode`` lfs/regular + the remote ``oid``
* ``POST /{prefix}{repo}.git/info/lfs/objects/batch``: LFS batch API ("basic" transfer;
  objects the server already holds get no upload action, like the Hub's dedup), then
  ``PUT`` of the bytes (sha256 and size checked) and ``POST`` verify
* ``POST /api/{type}s/{repo}/commit/{rev}``: the ndjson commit (``header``, ``file``,
  ``lfsFile`` -- refused if the LFS object was never uploaded --, ``deletedFile``,
  ``deletedFolder``; ``parentCommit`` checked)
* ``POST /api/{type}s/{repo}/branch/{branch}``
* ``GET|HEAD /{prefix}{repo}/resolve/{rev}/{path}``: content with ``X-Repo-Commit``,
  ``ETag`` (git sha1, or sha256 for LFS files), ``X-Linked-Etag``/``X-Linked-Size``
  and HTTP ``Range`` support
* errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``)
  as the Hub's do, so the client raises its usual exceptions.

What it does not do: authentication/permissions, Xet storage, LFS multipart,
pull requests, gated repos, the dataset viewer (datasets-server), redirects to a CDN.
Git objects are modelled, not stored as git: every commit is a full path -> blob map.

``fail_next(kind, after=n)`` makes the request of a kind (``commit``, ``lfs_upload``,
``preupload``) after the next ``n`` fail with HTTP 500, to test interrupted pushes. ``requests`` logs
every request; ``lfs_uploads`` and ``commits`` record what actually changed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

__all__ = ["HubStandIn"]

_LFS_EXTENSIONS = (".safetensors", ".parquet", ".arrow", ".png", ".jpg", ".bin", ".pt", ".npy", ".gz", ".zip", ".tar")
_LFS_SIZE = 10 * 1024 * 1024
_PREFIX = {"dataset": "datasets/", "space": "spaces/", "model": ""}
_GITATTRIBUTES = b"".join(f"*{ext} filter=lfs diff=lfs merge=lfs -text\n".encode() for ext in _LFS_EXTENSIONS)


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass
class _Blob:
    size: int
    sha256: str  # content address in the object store (for every file)
    lfs: bool
    blob_oid: str  # git sha1 of the content (regular) or of the LFS pointer


@dataclass
class _Commit:
    oid: str
    parent: str | None
    title: str
    date: str
    files: dict[str, _Blob]


@dataclass
class _Repo:
    repo_type: str
    repo_id: str
    private: bool
    refs: dict[str, str] = field(default_factory=dict)
    commits: dict[str, _Commit] = field(default_factory=dict)


class _HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra


class HubStandIn:
    """Start with ``HubStandIn(tmp_dir)``; ``.url`` is the endpoint; ``.close()`` stops it."""

    def __init__(self, root: str | os.PathLike, *, tree_page_size: int = 1000) -> None:
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.tree_page_size = tree_page_size
        self.repos: dict[tuple[str, str], _Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.lfs_uploads: list[str] = []
        self.commits: list[dict[str, Any]] = []
        self._fail: dict[str, list[int]] = {}
        self._lock = threading.RLock()
        standin = self

        class Handler(_Handler):
            hub = standin

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub-standin", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "HubStandIn":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ test helpers
    def fail_next(self, kind: str, *, after: int = 0, count: int = 1) -> None:
        """Let ``after`` more requests of ``kind`` succeed, then fail ``count`` with HTTP 500."""
        with self._lock:
            self._fail[kind] = [after, count]

    def _maybe_fail(self, kind: str) -> None:
        with self._lock:
            plan = self._fail.get(kind)
            if not plan or plan[1] <= 0:
                return
            if plan[0] > 0:
                plan[0] -= 1
                return
            plan[1] -= 1
            raise _HubError(500, f"injected failure of {kind}")

    def files(self, repo_id: str, repo_type: str = "dataset", revision: str = "main") -> dict[str, dict[str, Any]]:
        """{path: {"size", "sha256", "lfs"}} of a revision (for assertions)."""
        commit = self._commit(self._repo(repo_type, repo_id), revision)
        return {p: {"size": b.size, "sha256": b.sha256, "lfs": b.lfs} for p, b in commit.files.items()}

    def read(self, repo_id: str, path: str, repo_type: str = "dataset", revision: str = "main") -> bytes:
        blob = self._commit(self._repo(repo_type, repo_id), revision).files[path]
        return (self.objects / blob.sha256).read_bytes()

    # ------------------------------------------------------------------ model
    def _repo(self, repo_type: str, repo_id: str) -> _Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise _HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return repo

    def _commit(self, repo: _Repo, revision: str) -> _Commit:
        oid = repo.refs.get(revision, revision)
        commit = repo.commits.get(oid)
        if commit is None:
            raise _HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    def _store(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.objects / digest
        if not path.exists():
            tmp = path.with_name(f".tmp-{uuid.uuid4().hex}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return digest

    def _new_commit(self, repo: _Repo, branch: str, files: dict[str, _Blob], title: str, parent: str | None) -> _Commit:
        seed = f"{repo.repo_id}\0{parent}\0{title}\0{time.time_ns()}\0{uuid.uuid4()}".encode()
        oid = hashlib.sha1(seed).hexdigest()
        commit = _Commit(oid, parent, title, time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()), files)
        repo.commits[oid] = commit
        repo.refs[branch] = oid
        return commit

    def _regular_blob(self, data: bytes) -> _Blob:
        return _Blob(len(data), self._store(data), False, git_blob_sha1(data))

    def _lfs_blob(self, sha256: str, size: int) -> _Blob:
        return _Blob(size, sha256, True, git_blob_sha1(_lfs_pointer(sha256, size)))

    @staticmethod
    def _entry(path: str, blob: _Blob, commit: _Commit | None) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": blob.blob_oid, "size": blob.size, "path": path}
        if blob.lfs:
            entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": len(_lfs_pointer(blob.sha256, blob.size))}
        if commit is not None:
            entry["lastCommit"] = {"id": commit.oid, "title": commit.title, "date": commit.date}
        return entry

    @staticmethod
    def _dir_entry(path: str, commit: _Commit | None) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0, "path": path}
        if commit is not None:
            entry["lastCommit"] = {"id": commit.oid, "title": commit.title, "date": commit.date}
        return entry

    def _listing(self, commit: _Commit, base: str, recursive: bool, expand: bool) -> list[dict[str, Any]]:
        base = base.strip("/")
        prefix = base + "/" if base else ""
        if base and base in commit.files:
            raise _HubError(404, f"{base} is a file, not a folder", "EntryNotFound")
        out: dict[str, dict[str, Any]] = {}
        last = commit if expand else None
        for path, blob in sorted(commit.files.items()):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):].split("/")
            for depth in range(1, len(rest)):
                sub = prefix + "/".join(rest[:depth])
                if (recursive or depth == 1) and sub not in out:
                    out[sub] = self._dir_entry(sub, last)
            if recursive or len(rest) == 1:
                out[path] = self._entry(path, blob, last)
        if base and not out:
            raise _HubError(404, f"Entry not found: {base}", "EntryNotFound")
        return [out[k] for k in sorted(out)]


# ---------------------------------------------------------------------- HTTP layer
_API_REPO = re.compile(r"^/api/(models|datasets|spaces)/([^/]+/[^/]+)(?:/(.*))?$")
_RESOLVE = re.compile(r"^/(?:(datasets|spaces)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_LFS_BATCH = re.compile(r"^/(?:(datasets|spaces)/)?([^/]+/[^/]+)\.git/info/lfs/objects/batch$")


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    # ---- plumbing
    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(parts)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, *, head: bool = False) -> None:
        self.send_response(status)
        headers = dict(headers or {})
        headers.setdefault("Content-Type", "application/json")
        headers.setdefault("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if body and not head:
            self.wfile.write(body)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _dispatch(self, method: str) -> None:
        hub = self.hub
        split = urlsplit(self.path)
        hub.requests.append((method, split.path))
        body = b""
        try:
            if method in ("POST", "PUT"):
                body = self._body()
            with hub._lock:
                self._route(method, split.path, parse_qs(split.query), body)
        except _HubError as err:
            headers = {"X-Error-Message": err.message}
            if err.code:
                headers["X-Error-Code"] = err.code
            self._send(err.status, json.dumps({"error": err.message, **err.extra}).encode(), headers, head=method == "HEAD")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    # ---- routes
    def _route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> None:
        hub = self.hub
        if method == "POST" and path == "/api/repos/create":
            return self._create_repo(json.loads(body or b"{}"))
        if method == "POST" and path == "/api/validate-yaml":
            return self._validate_yaml(json.loads(body or b"{}"))
        if method == "PUT" and path.startswith("/lfs-upload/"):
            return self._lfs_put(path.rsplit("/", 1)[1], body)
        if method == "POST" and path == "/lfs-verify":
            info = json.loads(body)
            if not (hub.objects / info["oid"]).exists():
                raise _HubError(404, "object not found")
            return self._json(200, {"success": True})
        m = _LFS_BATCH.match(path)
        if m and method == "POST":
            return self._lfs_batch(json.loads(body))
        m = _RESOLVE.match(path)
        if m and method in ("GET", "HEAD"):
            repo_type = (m.group(1) or "models")[:-1]
            return self._resolve(method, repo_type, m.group(2), unquote(m.group(3)), unquote(m.group(4)))
        m = _API_REPO.match(path)
        if m:
            repo_type = m.group(1)[:-1]
            repo_id = m.group(2)
            rest = m.group(3) or ""
            repo = hub._repo(repo_type, repo_id)
            parts = rest.split("/") if rest else []
            if method == "GET" and (not parts or parts[0] == "revision"):
                return self._repo_info(repo, unquote(parts[1]) if len(parts) > 1 else "main")
            if method == "GET" and parts[0] == "tree":
                return self._tree(repo, unquote(parts[1]), unquote("/".join(parts[2:])), query)
            if method == "POST" and parts[0] == "paths-info":
                return self._paths_info(repo, unquote(parts[1]), parse_qs(body.decode()))
            if method == "POST" and parts[0] == "preupload":
                return self._preupload(repo, unquote(parts[1]), json.loads(body), query)
            if method == "POST" and parts[0] == "commit":
                return self._commit(repo, unquote(parts[1]), body, query)
            if method == "POST" and parts[0] == "branch":
                return self._branch(repo, unquote("/".join(parts[1:])), json.loads(body or b"{}"))
        raise _HubError(404, f"stand-in does not implement {method} {path}")

    def _create_repo(self, payload: dict[str, Any]) -> None:
        hub = self.hub
        repo_type = payload.get("type") or "model"
        name, org = payload["name"], payload.get("organization")
        repo_id = f"{org}/{name}" if org else f"user/{name}"
        url = f"{hub.url}/{_PREFIX[repo_type]}{repo_id}"
        if (repo_type, repo_id) in hub.repos:
            raise _HubError(409, "You already created this repo", url=url)
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        repo = _Repo(repo_type, repo_id, private)
        hub.repos[(repo_type, repo_id)] = repo
        hub._new_commit(repo, "main", {".gitattributes": hub._regular_blob(_GITATTRIBUTES)}, "initial commit", None)
        self._json(200, {"url": url, "name": repo_id, "id": uuid.uuid4().hex})

    def _validate_yaml(self, payload: dict[str, Any]) -> None:
        import yaml

        content = payload.get("content", "")
        m = re.match(r"^---\s*\n(.*?)\n---\s*\n", content, re.S)
        if m:
            try:
                data = yaml.safe_load(m.group(1))
            except yaml.YAMLError as exc:
                return self._json(400, {"errors": [{"message": f"invalid YAML: {exc}"}]})
            if data is not None and not isinstance(data, dict):
                return self._json(400, {"errors": [{"message": "metadata must be a mapping"}]})
        self._json(200, {"errors": [], "warnings": []})

    def _repo_info(self, repo: _Repo, revision: str) -> None:
        import yaml

        commit = self.hub._commit(repo, revision)
        card: dict[str, Any] | None = None
        readme = commit.files.get("README.md")
        if readme is not None:
            text = (self.hub.objects / readme.sha256).read_text()
            m = re.match(r"^---\s*\n(.*?)\n---\s*\n", text, re.S)
            card = yaml.safe_load(m.group(1)) if m else None
        info = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit.oid,
            "lastModified": commit.date,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "tags": [],
            "downloads": 0,
            "likes": 0,
            "siblings": [{"rfilename": p} for p in sorted(commit.files)],
            "cardData": card,
        }
        self._json(200, info)

    def _tree(self, repo: _Repo, revision: str, base: str, query: dict[str, list[str]]) -> None:
        commit = self.hub._commit(repo, revision)
        recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
        expand = query.get("expand", ["false"])[0].lower() in ("true", "1")
        entries = self.hub._listing(commit, base, recursive, expand)
        page = self.hub.tree_page_size if not expand else min(50, self.hub.tree_page_size)
        start = int(query.get("cursor", ["0"])[0])
        chunk = entries[start:start + page]
        headers = {}
        if start + page < len(entries):
            params = f"recursive={str(recursive).lower()}&expand={str(expand).lower()}&cursor={start + page}"
            encoded = "/" + quote(base, safe="") if base else ""
            url = f"{self.hub.url}/api/{repo.repo_type}s/{repo.repo_id}/tree/{quote(revision, safe='')}{encoded}?{params}"
            headers["Link"] = f'<{url}>; rel="next"'
        self._json(200, chunk, headers)

    def _paths_info(self, repo: _Repo, revision: str, form: dict[str, list[str]]) -> None:
        commit = self.hub._commit(repo, revision)
        expand = form.get("expand", ["False"])[0].lower() in ("true", "1")
        out = []
        for path in form.get("paths", []):
            path = path.strip("/")
            if path in commit.files:
                out.append(self.hub._entry(path, commit.files[path], commit if expand else None))
            elif any(p.startswith(path + "/") for p in commit.files):
                out.append(self.hub._dir_entry(path, commit if expand else None))
        self._json(200, out)

    def _preupload(self, repo: _Repo, revision: str, payload: dict[str, Any], query: dict[str, list[str]]) -> None:
        self.hub._maybe_fail("preupload")
        if query.get("create_pr"):
            raise _HubError(400, "pull requests are not implemented by the stand-in")
        commit = self.hub._commit(repo, revision)
        files = []
        for f in payload["files"]:
            sample = base64.b64decode(f["sample"])
            lfs = f["path"].endswith(_LFS_EXTENSIONS) or f["size"] >= _LFS_SIZE or b"\0" in sample
            existing = commit.files.get(f["path"])
            oid = None
            if existing is not None:
                oid = existing.sha256 if existing.lfs else existing.blob_oid
            files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid})
        self._json(200, {"files": files, "commitOid": commit.oid})

    def _lfs_batch(self, payload: dict[str, Any]) -> None:
        hub = self.hub
        if payload.get("operation") != "upload":
            raise _HubError(400, "only uploads are implemented")
        objects = []
        for obj in payload["objects"]:
            oid, size = obj["oid"], int(obj["size"])
            entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if not (hub.objects / oid).exists():  # the Hub skips objects it already holds
                entry["actions"] = {
                    "upload": {"href": f"{hub.url}/lfs-upload/{oid}", "header": {}},
                    "verify": {"href": f"{hub.url}/lfs-verify", "header": {}},
                }
            objects.append(entry)
        self._json(200, {"transfer": "basic", "objects": objects})

    def _lfs_put(self, oid: str, body: bytes) -> None:
        self.hub._maybe_fail("lfs_upload")
        if hashlib.sha256(body).hexdigest() != oid:
            raise _HubError(400, "uploaded bytes do not match the LFS oid")
        self.hub._store(body)
        self.hub.lfs_uploads.append(oid)
        self._send(200, b"")

    def _commit(self, repo: _Repo, revision: str, body: bytes, query: dict[str, list[str]]) -> None:
        hub = self.hub
        hub._maybe_fail("commit")
        if query.get("create_pr"):
            raise _HubError(400, "pull requests are not implemented by the stand-in")
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise _HubError(400, "commit payload must start with a header")
        header = lines[0]["value"]
        head = hub._commit(repo, revision)
        if revision not in repo.refs:
            raise _HubError(400, f"cannot commit to {revision!r}: not a branch")
        parent = header.get("parentCommit")
        if parent is not None and parent != head.oid:
            raise _HubError(412, "A commit has happened since. Please refresh and try again.")
        files = dict(head.files)
        record: dict[str, Any] = {"title": header.get("summary", ""), "added": [], "deleted": []}
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            path = value["path"].strip("/")
            if key == "file":
                data = base64.b64decode(value["content"])
                files[path] = hub._regular_blob(data)
                record["added"].append(path)
            elif key == "lfsFile":
                if not (hub.objects / value["oid"]).exists():
                    raise _HubError(422, f"Your push was rejected because an LFS pointer pointed to a file that does not exist ({path})")
                size = (hub.objects / value["oid"]).stat().st_size
                files[path] = hub._lfs_blob(value["oid"], size)
                record["added"].append(path)
            elif key == "deletedFile":
                if path not in files:
                    raise _HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                del files[path]
                record["deleted"].append(path)
            elif key == "deletedFolder":
                gone = [p for p in files if p.startswith(path + "/")]
                if not gone:
                    raise _HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                for p in gone:
                    del files[p]
                record["deleted"].extend(gone)
            else:
                raise _HubError(400, f"unknown commit operation {key!r}")
        commit = hub._new_commit(repo, revision, files, record["title"], head.oid)
        record["oid"] = commit.oid
        hub.commits.append(record)
        url = f"{hub.url}/{_PREFIX[repo.repo_type]}{repo.repo_id}/commit/{commit.oid}"
        self._json(200, {"success": True, "commitOid": commit.oid, "commitUrl": url, "pullRequestUrl": None})

    def _branch(self, repo: _Repo, branch: str, payload: dict[str, Any]) -> None:
        if branch in repo.refs:
            raise _HubError(409, f"Reference already exists: refs/heads/{branch}")
        start = self.hub._commit(repo, payload.get("startingPoint") or "main")
        repo.refs[branch] = start.oid
        self._json(200, {})

    def _resolve(self, method: str, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        hub = self.hub
        repo = hub._repo(repo_type, repo_id)
        commit = hub._commit(repo, revision)
        blob = commit.files.get(path)
        if blob is None:
            raise _HubError(404, "Entry not found", "EntryNotFound")
        etag = f'"{blob.sha256}"' if blob.lfs else f'"{blob.blob_oid}"'
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Repo-Commit": commit.oid,
            "ETag": etag,
            "Accept-Ranges": "bytes",
        }
        if blob.lfs:
            headers["X-Linked-Etag"] = etag
            headers["X-Linked-Size"] = str(blob.size)
        file = hub.objects / blob.sha256
        size = blob.size
        rng = self.headers.get("Range")
        status, start, end = 200, 0, size - 1
        if rng:
            m = re.match(r"bytes=(\d*)-(\d*)$", rng.strip())
            if not m:
                raise _HubError(416, "bad range")
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                start, end = max(size - int(m.group(2)), 0), size - 1
            if start >= size and size:
                raise _HubError(416, "range not satisfiable")
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = max(end - start + 1, 0)
        headers["Content-Length"] = str(length)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if method == "GET" and length:
            with open(file, "rb") as f:
                f.seek(start)
                remaining = length
                while remaining:
                    chunk = f.read(min(remaining, 1 << 20))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    remaining -= len(chunk)
