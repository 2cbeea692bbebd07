"""The caller-uid policy, as the outermost middleware of every handler: a listener an
unprivileged client registered serves only that client's uid (registration checked the
target's; monitor/registration.py)."""

from __future__ import annotations

from collections.abc import Callable

from monitor import log
from monitor.handlers.base import Answered, CallContext, Middleware, Step
from monitor.listener import NotificationGone
from monitor.plane.target_thread import RESOURCE_ERRNOS, SyscallError
from protocol import refusals


def caller_uid_middleware(syscall_name: Callable[[int], str]) -> Middleware:
    """An unprivileged client registered this listener: serve only processes of its own
    uid (the kernel cannot tell fhmon whose filter a listener is before a call comes).
    Another uid's call is answered EPERM, as without fhmon. The outermost middleware: such
    a call is audited here and counted by no other (HandlerRegistry puts it first)."""

    def wrap(name: str, handler: Step) -> Step:
        return _checked(handler, syscall_name)
    return wrap


def _checked(handler: Step, syscall_name: Callable[[int], str]) -> Step:
    def checked(ctx: CallContext) -> Answered:
        if ctx.peer_uid != 0:
            try:
                uid = ctx.thread.status.uid
            except OSError as exc:  # fhmon out of fds or memory: the kernel's answer
                if exc.errno in RESOURCE_ERRNOS:
                    raise SyscallError(exc.errno) from None
                raise NotificationGone(ctx.notif.id) from None
            except Exception:
                raise NotificationGone(ctx.notif.id) from None  # gone
            if uid != ctx.peer_uid:
                # audited here, without a code, and not counted (the table says so)
                refusal = refusals.CALLER_UID_FOREIGN
                log.audit("call_refused", syscall=syscall_name(ctx.notif.nr),
                          errno=refusal.errno_name,
                          reason=refusal.text(uid=uid, peer_uid=ctx.peer_uid),
                          tid=ctx.thread.tid, target=ctx.target_id)
                raise SyscallError(refusal.errno)
        return handler(ctx)
    return checked
