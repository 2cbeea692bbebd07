"""Structured logs: one JSON object per line on stderr, and the audit trail of refusals."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
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


class Throttle:
    """How many lines of one kind a key (a client uid and a reason) may write: `burst` at
    once, then `rate` a second. A client that is refused thousands of times a second (it
    reconnects as soon as it is refused) would otherwise cost fhmon a line, and its disk,
    each time. What it holds back is counted, and `due()` hands the counts over, for one
    summary line per key (`flush_throttled`); every refusal is still counted in fhmon's
    counters. Sans-IO: the caller passes the clock."""

    def __init__(self, rate: float = 1.0, burst: int = 20, max_keys: int = 4096) -> None:
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._tokens: dict[Any, tuple[float, float]] = {}  # key -> (tokens, at)
        self._held: dict[Any, int] = {}

    def admit(self, key: Any, now: float) -> bool:
        """True: write this line; False: it is counted for the key's summary."""
        tokens, at = self._tokens.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens >= 1.0:
            self._store(key, tokens - 1.0, now)
            return True
        self._store(key, tokens, now)
        self._held[key] = self._held.get(key, 0) + 1
        return False

    def _store(self, key: Any, tokens: float, now: float) -> None:
        if key not in self._tokens and len(self._tokens) >= self.max_keys:
            # forget the keys whose buckets are full again (nothing held, nothing owed),
            # else the oldest: the table stays bounded whatever the keys
            for stale in [k for k, (t, at) in self._tokens.items()
                          if k not in self._held and t + (now - at) * self.rate >= self.burst]:
                del self._tokens[stale]
            if len(self._tokens) >= self.max_keys:
                del self._tokens[next(iter(self._tokens))]
        self._tokens[key] = (tokens, now)

    def due(self) -> dict[Any, int]:
        """The lines held back since the last call, by key (and forgets them)."""
        held, self._held = self._held, {}
        return held


def flush_throttled(throttle: Throttle, name: str, level: int,
                    fields: Callable[[Any], dict[str, Any]], to_audit: bool = False) -> None:
    """One summary line per key whose lines `throttle` held back: `count` of them (in the
    audit trail when the lines held back were audit lines)."""
    for key, count in throttle.due().items():
        if to_audit:
            audit(name, summary=True, count=count, **fields(key))
        else:
            event(name, level, summary=True, count=count, **fields(key))
