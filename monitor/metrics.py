"""Counters and latency of emulated calls, as middleware around every handler."""

from __future__ import annotations

import bisect
import errno
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from monitor import log
from monitor.handlers.base import CallContext, Handler, Middleware, Outcome
from monitor.listener import NotificationGone
from monitor.target import SyscallError

# Answers that mean "fhmon refused on policy", worth an audit line when the handler said why
# (SyscallError.reason).
_POLICY_ERRNOS = {errno.EACCES, errno.ESTALE, errno.EOPNOTSUPP, errno.ENOSYS, errno.ELOOP}


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
        with self.lock:  # recv_thread workers may record at once
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
        """Add counts made elsewhere (a worker process's report)."""
        with self.lock:
            self.results.update(results)
            for syscall, spent in seconds.items():
                self.seconds[syscall] = self.seconds.get(syscall, 0.0) + spent
            self.refusals.update(refusals)
            for syscall, counts in buckets.items():
                if len(counts) != len(LATENCY_BUCKETS) + 1:
                    continue  # another layout: not ours to add
                mine = self._counts(syscall)
                for i, count in enumerate(counts):
                    mine[i] += count

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


def result_name(exc: SyscallError) -> str:
    """A refused call's result label: its errno's name."""
    return errno.errorcode.get(exc.errno, str(exc.errno))


def metrics_middleware(stats: CallStats) -> Middleware:
    """Counts every call by syscall and result, and times it."""
    record = stats.record

    def wrap(name: str, handler: Handler) -> Handler:
        def measured(ctx: CallContext) -> Outcome:
            start = time.perf_counter()
            result = "ok"
            try:
                return handler(ctx)
            except SyscallError as exc:
                result = result_name(exc)
                raise
            except NotificationGone:
                result = "gone"  # the caller went away: nobody got an answer
                raise
            finally:
                elapsed = time.perf_counter() - start
                record(name, result, elapsed)
        return measured
    return wrap


def audit_middleware(stats: CallStats) -> Middleware:
    """Logs every call fhmon refused on policy (confinement, MAC, file type)."""

    events = logging.getLogger("fhmon.events")

    def wrap(name: str, handler: Handler) -> Handler:
        def audited(ctx: CallContext) -> Outcome:
            try:
                outcome = handler(ctx)
            except SyscallError as exc:
                if exc.errno in _POLICY_ERRNOS and exc.reason:
                    # Blame only a caller still waiting: the handler may have read bytes
                    # from a process that reused a dead target's TID (handlers leave the
                    # ID_VALID to their last step, which a refusal never reaches).
                    if not ctx.listener.id_valid(ctx.notif.id):
                        raise NotificationGone(ctx.notif.id) from None
                    with stats.lock:
                        stats.refusals[exc.reason] += 1
                    log.audit("call_refused", syscall=name, errno=result_name(exc),
                              reason=exc.reason, tid=ctx.thread.tid,
                              tgid=_tgid(ctx), share=ctx.share.host_path,
                              target=ctx.target_id)
                elif events.isEnabledFor(logging.DEBUG):
                    log.event("call", logging.DEBUG, syscall=name, result=result_name(exc),
                              tid=ctx.thread.tid, target=ctx.target_id)
                raise
            if events.isEnabledFor(logging.DEBUG):
                log.event("call", logging.DEBUG, syscall=name, result="ok",
                          tid=ctx.thread.tid, target=ctx.target_id)
            return outcome
        return audited
    return wrap


def _tgid(ctx: CallContext) -> int | None:
    try:
        return ctx.thread.status.tgid
    except Exception:
        return None
