"""What a handler sees (CallContext) and what it returns (an outcome the answerer sends)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from monitor.listener import Listener
from monitor.plane.target_thread import TargetThread
from protocol import kernel

if TYPE_CHECKING:
    from monitor.policy import Share
    from monitor.signing import KeyRing


@dataclass(slots=True)
class CallContext:
    """One trapped call: the calling thread (which holds the notification and the listener
    it came from), its share, the keys, and who registered the listener."""

    thread: TargetThread
    share: Share
    keys: KeyRing
    signing: bool = True
    target_id: int = 0
    peer_uid: int = 0  # the registering client's uid (0: root, whose targets are any uid's)

    @property
    def notif(self) -> kernel.Notification:
        return self.thread.notif

    @property
    def listener(self) -> Listener:
        return self.thread.listener


@dataclass(frozen=True, slots=True)
class Return:
    """Answer the call with this return value."""

    value: int


@dataclass(frozen=True, slots=True)
class Error:
    """Answer the call with this errno (positive); reason: why fhmon refused, if it did
    (the audit log's text; monitor/labels.py gives each a fixed identifier)."""

    errno: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class InjectFd:
    """Answer the call by installing `fd` (fhmon's, which the answer closes) in the target,
    the new fd number being the call's return value (ADDFD with SECCOMP_ADDFD_FLAG_SEND)."""

    fd: int
    cloexec: bool


@dataclass(frozen=True, slots=True)
class Injected:
    """An InjectFd that was answered: `fd` is the target's new fd number."""

    fd: int


Outcome = Return | Error | InjectFd
# What the middleware sees: an InjectFd is answered below it (monitor/handlers/reply.py),
# so that its time and its failures (ENOENT: gone; EMFILE in the target) are the call's.
Answered = Return | Injected
Handler = Callable[[CallContext], Outcome]
Step = Callable[[CallContext], Answered]
Middleware = Callable[[str, Step], Step]
