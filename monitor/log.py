"""Structured logs: one JSON object per line on stderr, and the audit trail of refusals."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

AUDIT = logging.getLogger("fhmon.audit")
EVENTS = logging.getLogger("fhmon.events")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        else:
            entry["msg"] = record.getMessage()
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def event(name: str, level: int = logging.INFO, exc_info: bool = False, **fields: Any) -> None:
    if EVENTS.isEnabledFor(level):
        EVENTS.log(level, name, exc_info=exc_info, extra={"fields": {"event": name, **fields}})


def audit(name: str, **fields: Any) -> None:
    AUDIT.warning(name, extra={"fields": {"event": name, "audit": True, **fields}})


def now() -> float:
    return time.time()
