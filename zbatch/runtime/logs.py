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
