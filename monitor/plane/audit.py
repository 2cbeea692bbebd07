"""The audit of refused calls, as middleware around every handler: each call fhmon
refused on policy (confinement, MAC, file type) is logged with its reason and counted,
once its caller is known to be still waiting."""

from __future__ import annotations

import errno
import logging
from typing import Protocol

from monitor import log
from monitor.handlers.base import Answered, CallContext, Middleware, Step
from monitor.labels import errno_name, refusal_code
from monitor.listener import NotificationGone
from monitor.plane.target_thread import SyscallError

# Answers that mean "fhmon refused on policy", worth an audit line when the handler said why
# (SyscallError.reason).
_POLICY_ERRNOS = {errno.EACCES, errno.ESTALE, errno.EOPNOTSUPP, errno.ENOSYS, errno.ELOOP}


class RefusalCounter(Protocol):
    """Where a refusal is counted (monitor/metrics.py CallStats)."""

    def count_refusal(self, reason: str) -> None: ...


def audit_middleware(stats: RefusalCounter) -> Middleware:
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
                    stats.count_refusal(exc.reason)
                    log.audit("call_refused", syscall=name, errno=errno_name(exc.errno),
                              reason=exc.reason, code=refusal_code(exc.reason),
                              tid=ctx.thread.tid,
                              tgid=_tgid(ctx), share=ctx.share.facts.host_path,
                              target=ctx.target_id)
                elif events.isEnabledFor(logging.DEBUG):
                    log.event("call", logging.DEBUG, syscall=name, result=errno_name(exc.errno),
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
