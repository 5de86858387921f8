"""Hugging Face Hub stand-ins for the tests, which download nothing: a cache built on disk, and a fake Hub.

:func:`build_cache` lays the bundled model (or any folder) out as huggingface_hub's cache does, in a
folder of the test's: ``models--ORG--NAME/blobs/<hash>``, ``snapshots/<commit>/<file>`` as relative
links to the blobs, and ``refs/<branch or tag>`` holding the commit.  Pointed at with ``HF_HUB_CACHE``
and read with ``HF_HUB_OFFLINE=1``, it is what a host that downloaded the model once has.

:class:`FakeHub` is a fake, named so: the Hub's answers for what a cold cache needs (a repository's
revision, its file tree, each file's metadata and bytes), from folders on disk, on a local port, with
the Hub's refusals where a test asks for them: a repository that does not exist, a revision that does
not exist, and a gated model, whose files are answered 401 with the Hub's ``X-Error-Code: GatedRepo``
(a real gated model cannot be had without an account).  It counts the files it sends.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from zbatch.hub import bundled_model_path

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"  # the bundled model's id on the Hub
GATED_ID = "org/gated-model"  # a gated copy of it, on the fake Hub
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # a fake revision: 40 hex digits, as the Hub's commits
TAG = "v1.0"  # a tag at that commit


def files_of(folder: Path) -> Iterator[Path]:
    """The files of a model folder, relative to it, in a stable order."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            yield path.relative_to(folder)


def build_cache(cache: Path, repo_id: str = MODEL_ID, folder: str | None = None, commit: str = COMMIT,
                refs: tuple[str, ...] = ("main", TAG)) -> Path:
    """``folder`` (the bundled model by default) as ``repo_id`` at ``commit`` in the cache ``cache``, each of
    ``refs`` pointing at it; returns the snapshot folder."""
    source = Path(folder or bundled_model_path())
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    for relative in files_of(source):
        data = (source / relative).read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.write_bytes(data)
        link = snapshot / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (storage / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return snapshot


def cache_env(cache: Path) -> dict[str, str]:
    """The variables that make huggingface_hub read ``cache`` and only it (as a daemon's ``env``)."""
    return {"HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent / "hf-home"), "HF_HUB_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1"}


# ---------------------------------------------------------------------------------------------- the fake


@dataclass
class Repo:
    folder: Path
    refs: Mapping[str, str] = field(default_factory=lambda: {"main": COMMIT, TAG: COMMIT})
    gated: bool = False


class FakeHub:
    """A fake of the Hub's HTTP API for downloads, on 127.0.0.1 in a thread of its own; ``url`` is its endpoint."""

    def __init__(self, repos: Mapping[str, Repo]) -> None:
        self.repos = dict(repos)
        self.files_sent: list[str] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    async def _start(self) -> None:
        app = web.Application()
        app.add_routes([web.get("/api/models/{owner}/{name}/revision/{revision}", self._repo_info),
                        web.get("/api/models/{owner}/{name}/tree/{revision}", self._tree),
                        web.route("*", "/{owner}/{name}/resolve/{revision}/{path:.+}", self._resolve)])
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    # ------------------------------------------------------------------ the Hub's answers

    @staticmethod
    def _refusal(status: int, code: str, message: str) -> web.Response:
        return web.json_response({"error": message}, status=status,
                                 headers={"X-Error-Code": code, "X-Error-Message": message})

    def _find(self, request: web.Request) -> tuple[str, Repo, str] | web.Response:
        repo_id = f"{request.match_info['owner']}/{request.match_info['name']}"
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._refusal(401, "RepoNotFound", "Repository not found")
        revision = request.match_info["revision"]
        commit = repo.refs.get(revision) or (revision if revision in repo.refs.values() else None)
        if commit is None:
            return self._refusal(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return repo_id, repo, commit

    async def _repo_info(self, request: web.Request) -> web.Response:
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        repo_id, repo, commit = found
        siblings = [{"rfilename": str(path)} for path in files_of(repo.folder)]
        return web.json_response({"id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                                  "gated": "manual" if repo.gated else False, "siblings": siblings})

    async def _tree(self, request: web.Request) -> web.Response:
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        _, repo, _ = found
        entries: list[dict[str, Any]] = []
        for path in files_of(repo.folder):
            data = (repo.folder / path).read_bytes()
            entries.append({"type": "file", "path": str(path), "size": len(data), "oid": _etag(data)})
        return web.json_response(entries)

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        found = self._find(request)
        if isinstance(found, web.Response):
            return found
        repo_id, repo, commit = found
        if repo.gated:
            return self._refusal(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access "
                                                   f"to it and be authenticated to access it. Please log in.")
        path = repo.folder / request.match_info["path"]
        if not path.is_file():
            return self._refusal(404, "EntryNotFound", f"{request.match_info['path']} does not exist")
        data = path.read_bytes()
        headers = {"X-Repo-Commit": commit, "ETag": f'"{_etag(data)}"', "Content-Length": str(len(data))}
        if request.method == "HEAD":
            return web.Response(headers=headers)
        self.files_sent.append(str(request.match_info["path"]))
        return web.Response(body=data, headers=headers)


def _etag(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()
