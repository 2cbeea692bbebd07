"""Counters and latency of emulated calls, as middleware around every handler (the
audit of refusals is monitor/plane/audit.py; their fixed label values monitor/labels.py)."""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from monitor.handlers.base import Answered, CallContext, Middleware, Step
from monitor.labels import errno_name, refusal_code, result_label, syscall_label
from monitor.listener import NotificationGone
from monitor.plane.target_thread import SyscallError

# Calls take microseconds; latency buckets from 5 us to 50 ms (upper bounds, seconds).
LATENCY_BUCKETS = (5e-6, 1e-5, 2e-5, 3e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4,
                   1e-3, 2e-3, 5e-3, 1e-2, 5e-2)


@dataclass
class CallStats:
    """Every call's count, time and latency bucket; Prometheus reads them when scraped
    (monitor/prom.py), so a call pays one lock and a bisect, not a metrics library."""

    results: Counter[tuple[str, str]] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)
    # per syscall: how many calls fell in each LATENCY_BUCKETS bucket, the last is +Inf
    buckets: dict[str, list[int]] = field(default_factory=dict)
    registrations: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, syscall: str, result: str, elapsed: float) -> None:
        syscall, result = syscall_label(syscall), result_label(result)
        with self.lock:  # native threads (the Python fallback) may record at once
            self.results[(syscall, result)] += 1
            self.seconds[syscall] = self.seconds.get(syscall, 0.0) + elapsed
            self._bucket(syscall, elapsed)

    def _bucket(self, syscall: str, elapsed: float) -> None:
        self._counts(syscall)[bisect.bisect_left(LATENCY_BUCKETS, elapsed)] += 1

    def _counts(self, syscall: str) -> list[int]:
        counts = self.buckets.get(syscall)
        if counts is None:
            counts = self.buckets[syscall] = [0] * (len(LATENCY_BUCKETS) + 1)
        return counts

    def merge(self, results: dict[tuple[str, str], int], seconds: dict[str, float],
              refusals: dict[str, int], buckets: dict[str, list[int]]) -> None:
        """Add counts made elsewhere (a worker process's report), folded into the same fixed
        label sets."""
        with self.lock:
            for (syscall, result), count in results.items():
                self.results[(syscall_label(syscall), result_label(result))] += count
            for syscall, spent in seconds.items():
                label = syscall_label(syscall)
                self.seconds[label] = self.seconds.get(label, 0.0) + spent
            for reason, count in refusals.items():
                self.refusals[refusal_code(reason)] += count
            for syscall, counts in buckets.items():
                if len(counts) != len(LATENCY_BUCKETS) + 1:
                    continue  # another layout: not ours to add
                mine = self._counts(syscall_label(syscall))
                for i, count in enumerate(counts):
                    mine[i] += count

    def count_refusal(self, reason: str) -> None:
        """One call refused on policy (monitor/plane/audit.py), by its reason's fixed code."""
        with self.lock:
            self.refusals[refusal_code(reason)] += 1

    def take(self) -> tuple[dict[tuple[str, str], int], dict[str, float], dict[str, int],
                            dict[str, list[int]]]:
        """Everything counted so far, and start again from zero (a worker's report)."""
        with self.lock:
            taken = (dict(self.results), dict(self.seconds), dict(self.refusals),
                     self.buckets)
            self.results.clear()
            self.seconds.clear()
            self.refusals.clear()
            self.buckets = {}
        return taken

    def as_dict(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (syscall, result), n in sorted(self.results.items()):
            out.setdefault(syscall, {})[result] = n
        return out


def metrics_middleware(stats: CallStats) -> Middleware:
    """Counts every call by syscall and result, and times it."""
    record = stats.record

    def wrap(name: str, handler: Step) -> Step:
        def measured(ctx: CallContext) -> Answered:
            start = time.perf_counter()
            result = "ok"
            try:
                return handler(ctx)
            except SyscallError as exc:
                result = errno_name(exc.errno)
                raise
            except NotificationGone:
                result = "gone"  # the caller went away: nobody got an answer
                raise
            finally:
                elapsed = time.perf_counter() - start
                record(name, result, elapsed)
        return measured
    return wrap


__all__ = ["LATENCY_BUCKETS", "CallStats", "metrics_middleware"]
