"""The syscall -> handler registry: picks a call's handler, wraps it in middleware, and
hands the outcome to the one answerer (monitor/handlers/reply.py)."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterable

from monitor.handlers import reply
from monitor.handlers.base import (
    Answered,
    CallContext,
    Error,
    Handler,
    Injected,
    InjectFd,
    Middleware,
    Outcome,
    Return,
    Step,
)
from monitor.handlers.caller_uid import caller_uid_middleware
from monitor.handlers.name_to_handle_at import name_to_handle_at
from monitor.handlers.open_by_handle_at import open_by_handle_at
from monitor.listener import NotificationGone
from monitor.plane.target_thread import RESOURCE_ERRNOS, SyscallError
from protocol import kernel, refusals

log = logging.getLogger("fhmon.dispatch")

HANDLERS: dict[int, tuple[str, Handler]] = {
    kernel.SYS_NAME_TO_HANDLE_AT: ("name_to_handle_at", name_to_handle_at),
    kernel.SYS_OPEN_BY_HANDLE_AT: ("open_by_handle_at", open_by_handle_at),
}


def syscall_name(nr: int) -> str:
    entry = HANDLERS.get(nr)
    return entry[0] if entry else str(nr)


def _unexpected(ctx: CallContext) -> Outcome:
    """Anything else the filter delivers (another syscall, another arch): a clean ENOSYS."""
    refusal = refusals.SYSCALL_NOT_EMULATED
    return Error(refusal.errno, refusal.text(nr=ctx.notif.nr, arch=ctx.notif.arch))


def _answering(handler: Handler) -> Step:
    """The handler as the middleware sees it: an Error is raised (SyscallError, as the
    handlers' helpers raise theirs), an fd is injected at once (monitor/handlers/reply.py)."""

    def step(ctx: CallContext) -> Answered:
        outcome = handler(ctx)
        if isinstance(outcome, Error):
            raise SyscallError(outcome.errno, reason=outcome.reason)
        if isinstance(outcome, InjectFd):
            return reply.inject(ctx.listener, ctx.notif.id, outcome)
        if isinstance(outcome, Return):
            return outcome
        raise TypeError(f"handler returned {outcome!r}")
    return step


class HandlerRegistry:
    """Picks the handler for a notification, wraps it in middleware (the caller-uid check
    outermost, always, then the given ones, the first outermost), and has the call
    answered exactly once (or not at all if it is gone)."""

    def __init__(self, middleware: Iterable[Middleware] = ()) -> None:
        self._chain: dict[tuple[int, int], Step] = {}
        self._middleware = [caller_uid_middleware(syscall_name), *middleware]
        self._fallback = self._wrap("unexpected", _unexpected)
        for nr, (name, handler) in HANDLERS.items():
            self._chain[(kernel.AUDIT_ARCH_X86_64, nr)] = self._wrap(name, handler)

    def _wrap(self, name: str, handler: Handler) -> Step:
        step = _answering(handler)
        for mw in reversed(self._middleware):
            step = mw(name, step)
        return step

    def dispatch(self, ctx: CallContext) -> None:
        """Answer the call exactly once (or not at all if the target is gone)."""
        step = self._chain.get((ctx.notif.arch, ctx.notif.nr), self._fallback)
        outcome: Return | Error
        try:
            answered = step(ctx)
        except SyscallError as exc:
            outcome = Error(exc.errno, reason=exc.reason)
        except NotificationGone:
            return
        except OSError as exc:
            if exc.errno in RESOURCE_ERRNOS:  # out of fds/memory: the kernel's answer
                outcome = Error(exc.errno)
            else:
                log.exception("handler failed; answering EIO")
                outcome = Error(errno.EIO)
        except Exception:
            log.exception("handler failed; answering EIO")
            outcome = Error(errno.EIO)
        else:
            if isinstance(answered, Injected):
                return  # answered by its ADDFD|SEND
            outcome = answered
        reply.send(ctx.listener, ctx.notif.id, outcome)
