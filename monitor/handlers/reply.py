"""The one component that answers a trapped call: SEND, or ADDFD|SEND for an fd.

Handlers only decide (monitor/handlers: an Outcome, or a raised SyscallError); the handler
registry hands each outcome here. An fd is injected below the middleware, inside the
call's measured time, because its answer can still fail: ENOENT (the caller went away:
nobody is answered) or, say, EMFILE in the target (then answered with that errno). Every
other answer is sent after the middleware saw the outcome.
"""

from __future__ import annotations

import errno
import os

from monitor.handlers.base import Error, Injected, InjectFd, Return
from monitor.listener import Listener, NotificationGone
from monitor.plane.target_thread import SyscallError


def inject(listener: Listener, notif_id: int, outcome: InjectFd) -> Injected:
    """ADDFD + SEND in one step (Listener.inject_and_respond, signals blocked): the fd is
    installed only if the call is answered. Closes fhmon's fd in every case."""
    try:
        try:  # ADDFD itself refuses an id that is no longer valid (ENOENT)
            fd = listener.inject_and_respond(notif_id, outcome.fd, cloexec=outcome.cloexec)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise NotificationGone(notif_id) from None
            raise SyscallError(exc.errno or errno.EIO) from None  # e.g. EMFILE in the target
    finally:
        os.close(outcome.fd)
    return Injected(fd)


def send(listener: Listener, notif_id: int, outcome: Return | Error) -> bool:
    """SEND the value or the errno; False if the caller is gone (nothing to answer)."""
    if isinstance(outcome, Return):
        return listener.respond(notif_id, val=outcome.value)
    return listener.respond(notif_id, error=outcome.errno)
