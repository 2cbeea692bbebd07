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
from monitor.handlers.base import Answered, CallContext, Middleware, Step
from monitor.listener import NotificationGone
from monitor.target_thread import SyscallError

# Answers that mean "fhmon refused on policy", worth an audit line when the handler said why
# (SyscallError.reason).
_POLICY_ERRNOS = {errno.EACCES, errno.ESTALE, errno.EOPNOTSUPP, errno.ENOSYS, errno.ELOOP}


# --- label values: fixed sets, so that nothing a target or client does creates a series ----
# A client may register a listener of a filter of its own that traps any syscall number; a
# handler's errno may come from any OSError. Whatever is not in these sets counts as OTHER.
OTHER = "other"
SYSCALL_LABELS = frozenset({"name_to_handle_at", "open_by_handle_at"})
RESULT_LABELS = frozenset({
    "ok", "gone",
    # what name_to_handle_at(2) / open_by_handle_at(2) and the open they do can answer, and
    # what fhmon answers itself (docs/semantics.md)
    "E2BIG", "EACCES", "EAGAIN", "EBADF", "EBUSY", "EDQUOT", "EEXIST", "EFAULT", "EFBIG",
    "EINTR", "EINVAL", "EIO", "EISDIR", "ELOOP", "EMFILE", "EMLINK", "ENAMETOOLONG",
    "ENFILE", "ENODEV", "ENOENT", "ENOMEM", "ENOSPC", "ENOSYS", "ENOTDIR", "ENOTSUP",
    "ENXIO", "EOPNOTSUPP", "EOVERFLOW", "EPERM", "EROFS", "ESRCH", "ESTALE", "ETXTBSY",
    "EWOULDBLOCK", "EXDEV",
})
# Why fhmon refused a call, as a metric label: a fixed snake_case identifier per refusal.
# The handlers' human text (SyscallError.reason) stays in the audit log; it is matched here
# by its beginning (some texts carry details, e.g. the syscall number). A reason this table
# does not know counts as "other": give it an identifier here when adding one
# (tests/unit/test_metrics.py checks every reason raised in monitor/).
REFUSAL_CODES: tuple[tuple[str, str], ...] = (
    ("bad or foreign MAC", "mac_invalid"),
    ("mount_fd on another filesystem", "mount_fd_foreign"),
    ("fhmon opens only directories and regular files", "file_type_refused"),
    ("no handles for this file type", "file_type_no_handle"),
    ("kernel handle too large for the MAC trailer", "handle_too_large"),
    ("object on a submount inside the share", "submount"),
    ("object outside the share (other mount)", "outside_share_mount"),
    ("object outside the share", "outside_share"),
    ("opened object not on the share's mount", "opened_outside_mount"),
    ("directory no longer inside the share", "directory_left_share"),
    ("file's place cannot be checked", "place_unverifiable"),  # "... (strerror)"
    ("syscall ", "syscall_not_emulated"),  # "syscall NR arch A is not emulated"
)
REFUSAL_LABELS = frozenset({code for _, code in REFUSAL_CODES} | {OTHER})
MAC_INVALID = "mac_invalid"  # the refusal fhmon_mac_failures_total counts


def syscall_label(name: str) -> str:
    return name if name in SYSCALL_LABELS else OTHER


def result_label(result: str) -> str:
    return result if result in RESULT_LABELS else OTHER


def refusal_code(reason: str) -> str:
    """The fixed identifier of a refusal's human reason ("other" if unknown)."""
    for text, code in REFUSAL_CODES:
        if reason.startswith(text):
            return code
    return reason if reason in REFUSAL_LABELS else OTHER


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

    def wrap(name: str, handler: Step) -> Step:
        def measured(ctx: CallContext) -> Answered:
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

    def wrap(name: str, handler: Step) -> Step:
        def audited(ctx: CallContext) -> Answered:
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
                        stats.refusals[refusal_code(exc.reason)] += 1
                    log.audit("call_refused", syscall=name, errno=result_name(exc),
                              reason=exc.reason, code=refusal_code(exc.reason),
                              tid=ctx.thread.tid,
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
