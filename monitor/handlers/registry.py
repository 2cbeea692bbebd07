"""The syscall -> handler registry and the dispatcher that answers every notification."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterable

from monitor.handlers.base import CallContext, Handler, Injected, Middleware, Outcome, Return
from monitor.handlers.name_to_handle_at import name_to_handle_at
from monitor.handlers.open_by_handle_at import open_by_handle_at
from monitor.listener import NotificationGone
from monitor.target import RESOURCE_ERRNOS, SyscallError
from protocol import kernel

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
    raise SyscallError(errno.ENOSYS,
                       f"syscall {ctx.notif.nr} arch {ctx.notif.arch:#x} is not emulated")


class Dispatcher:
    """Picks the handler for a notification, wraps it in middleware, answers the call."""

    def __init__(self, middleware: Iterable[Middleware] = ()) -> None:
        self._chain: dict[tuple[int, int], tuple[str, Handler]] = {}
        self._middleware = list(middleware)
        self._fallback = self._wrap("unexpected", _unexpected)
        for nr, (name, handler) in HANDLERS.items():
            self._chain[(kernel.AUDIT_ARCH_X86_64, nr)] = (name, self._wrap(name, handler))

    def _wrap(self, name: str, handler: Handler) -> Handler:
        for mw in reversed(self._middleware):
            handler = mw(name, handler)
        return handler

    def dispatch(self, ctx: CallContext) -> None:
        """Answer the call exactly once (or not at all if the target is gone)."""
        _, handler = self._chain.get((ctx.notif.arch, ctx.notif.nr), ("", self._fallback))
        try:
            outcome = handler(ctx)
        except SyscallError as exc:
            ctx.listener.respond(ctx.notif.id, error=exc.errno)
            return
        except NotificationGone:
            return
        except OSError as exc:
            if exc.errno in RESOURCE_ERRNOS:  # out of fds/memory: the kernel's answer
                ctx.listener.respond(ctx.notif.id, error=exc.errno)
                return
            log.exception("handler failed; answering EIO")
            ctx.listener.respond(ctx.notif.id, error=errno.EIO)
            return
        except Exception:
            log.exception("handler failed; answering EIO")
            ctx.listener.respond(ctx.notif.id, error=errno.EIO)
            return
        if isinstance(outcome, Return):
            ctx.listener.respond(ctx.notif.id, val=outcome.value)
        elif not isinstance(outcome, Injected):
            raise TypeError(f"handler returned {outcome!r}")
