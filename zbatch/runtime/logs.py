"""Logging for the three daemons: human lines on a terminal, or JSON lines for a log pipeline.

A log record about one request carries its id (the HTTP ``X-Request-ID``, the
protocol's ``trace``) as ``extra={"request_id": ...}``; both formats show it,
so one grep, or one query on the ``request_id`` field, follows a request
through the gateway, the broker and the worker.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime

LOG_FORMATS = ("text", "json")


class TextFormatter(logging.Formatter):
    """``2024-05-01 12:00:00,000 INFO zbatch-broker[42] zbatch.broker: message [request abc]``."""

    def __init__(self, daemon: str) -> None:
        super().__init__(f"%(asctime)s %(levelname)s {daemon}[%(process)d] %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", "")
        return f"{line} [request {request_id}]" if request_id else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (ISO 8601, UTC), level, daemon, pid, logger, message,
    and request_id and exception when there is one."""

    def __init__(self, daemon: str) -> None:
        super().__init__()
        self.daemon = daemon

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "daemon": self.daemon,
            "pid": record.process or os.getpid(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", "")
        if request_id:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def setup_logging(daemon: str, level: str, fmt: str) -> None:
    """Send the root logger's records to stderr at ``level`` in ``fmt`` (text or json)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(daemon) if fmt == "json" else TextFormatter(daemon))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


class LogLimiter:
    """At most one line per kind every ``every_s`` seconds; the next line says how many were held back.

    For lines that hostile or heavy traffic can repeat at the rate of requests
    (refusals, malformed messages): the first of each kind is logged, the rest
    are counted.  ``clock`` is injected, so sans-I/O cores can use it.
    """

    MAX_KINDS = 1_000

    def __init__(self, logger: logging.Logger, clock: Callable[[], float], every_s: float = 10.0) -> None:
        self._logger = logger
        self._clock = clock
        self._every_s = every_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def log(self, kind: str, level: int, text: str, *args: object, request_id: str = "",
            exc_info: bool = False) -> None:
        if not self._logger.isEnabledFor(level):
            return
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self._every_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return
        if len(self._last) >= self.MAX_KINDS:  # kinds are fixed strings; this only bounds a mistake
            self._last.clear()
            self._held.clear()
        held = self._held.pop(kind, 0)
        if held:
            text += " (and %d more like it in the last %.0f s)"
            args = (*args, held, now - last if last is not None else self._every_s)
        self._last[kind] = now
        self._logger.log(level, text, *args, extra={"request_id": request_id}, exc_info=exc_info)
