"""What a worker works out at start and keeps for its next start: small keyed records beside the ONNX graphs.

Theory of operation
-------------------
A start works out things that come out the same at the next start of the
same model on the same host: the ONNX export (:mod:`worker.runners.onnx_export`
keeps its graphs), whether ONNX Runtime's graph holds against torch
(:mod:`worker.runners.verdicts`) and what padding costs
(:mod:`worker.runners.calibrations`).  The last two are records here, in
the cache folder (``--onnx-cache``): ``verdicts/NAME-HASH.json`` and
``calibrations/NAME-HASH.json``.

* **Keyed on what they depend on.**  A :class:`RecordKey`'s hash covers its
  parts (the model's files, library versions, the CPU, ...), and the record
  holds the parts themselves, so a change of any part is another record, and
  a record whose parts do not match its key is not used.
* **Ignored when unusable.**  A record that does not parse, does not match
  its key, or that its user finds stale (:func:`once`'s ``usable``) is
  worked out again and overwritten, with one log line that says why.
* **Written once, atomically.**  A worker that finds no usable record takes
  ``NAME-HASH.lock``, looks again, works the record out and writes it into a
  temporary file that it renames into place.  A worker that starts meanwhile
  waits on the lock and then reads the finished record; a crash leaves at most
  a temporary file, never half a record.
* **Cleared by deleting.**  Any record, any folder, or the whole cache may
  be deleted at any time, between starts or during one: the next start works
  out what is missing.  A cache that cannot be written (read-only, full)
  keeps nothing, with one log line, and never stops a start.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("zbatch.worker")

Record = dict[str, Any]
PARTS = "key_parts"  # where a record holds the parts of its key


@dataclass(frozen=True)
class RecordKey:
    """One record: its kind (the folder under the cache), a readable name, and the parts its content depends on."""

    cache: Path
    kind: str
    name: str
    parts: Mapping[str, Any]

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.parts, sort_keys=True, default=str).encode()).hexdigest()[:20]

    @property
    def path(self) -> Path:
        return self.cache / self.kind / f"{safe_name(self.name)}-{self.digest}.json"


def safe_name(name: str) -> str:
    """``name`` as a file name's readable start: letters, digits and ``-_.``, at most 40 characters."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the block; waits for another holder."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def read(key: RecordKey, usable: Callable[[Record], str] = lambda record: "") -> tuple[Record | None, str]:
    """The record of ``key`` and ``""``, or None and why not (``""`` when there is none yet)."""
    try:
        text = key.path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None, ""
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    try:
        record = json.loads(text)
    except ValueError:
        return None, "does not parse"
    if not isinstance(record, dict):
        return None, "is not a record"
    if json.loads(json.dumps(record.get(PARTS), default=str)) != json.loads(json.dumps(key.parts, default=str)):
        return None, "does not match its key"
    try:
        stale = usable(record)
    except (KeyError, TypeError, ValueError) as exc:
        stale = f"lacks what it must hold ({type(exc).__name__}: {exc})"
    return (None, stale) if stale else (record, "")


def write(key: RecordKey, record: Record) -> None:
    """Write ``record`` (with its key's parts) as ``key``'s, atomically: a reader sees the old one or the new one.
    A cache that cannot be written (read-only, full) keeps nothing, with one log line: the start goes on."""
    folder = key.path.parent
    text = json.dumps({**record, PARTS: key.parts}, indent=1, sort_keys=True, default=str) + "\n"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{key.path.name}.", dir=folder)
    except OSError as exc:
        _cannot_keep(key, exc)
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, key.path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if not isinstance(exc, OSError):
            raise
        _cannot_keep(key, exc)


@contextlib.contextmanager
def holding(key: RecordKey) -> Iterator[bool]:
    """``key``'s lock for the block (True); False, with one log line, where the cache cannot be written, so that
    the start goes on without it."""
    with contextlib.ExitStack() as stack:
        try:
            key.path.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(locked(key.path.with_suffix(".lock")))
        except OSError as exc:
            _cannot_keep(key, exc)
            held = False
        else:
            held = True
        yield held


_cannot_write: set[Path] = set()  # folders this process found it cannot write: each said once


def _cannot_keep(key: RecordKey, exc: OSError) -> None:
    if key.path.parent not in _cannot_write:
        _cannot_write.add(key.path.parent)
        log.warning("start cache: %s cannot be written (%s); this worker keeps nothing there", key.path.parent,
                    exc.strerror or exc)


@contextlib.contextmanager
def once(key: RecordKey, usable: Callable[[Record], str] = lambda record: "") -> Iterator[Record | None]:
    """The usable record of ``key``; or, if there is none, None with ``key``'s lock held for the block, in which
    the caller works the record out and :func:`write`\\ s it (once among workers that start together).

    ``usable(record)`` says why a record that parses cannot serve (``""``: it can).  A record that cannot is
    logged once, and overwritten by the caller.
    """
    record, _ = read(key, usable)
    if record is not None:
        yield record
        return
    with holding(key):
        record, problem = read(key, usable)  # another worker may have written it while this one waited
        if problem:
            log.info("start cache: %s %s; working it out again", key.path, problem)
        yield record

