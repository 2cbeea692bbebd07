"""What a handler sees (CallContext) and what it returns (Outcome)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from monitor.listener import Listener
from monitor.target import TargetThread
from protocol import kernel

if TYPE_CHECKING:
    from monitor.policy import Share
    from monitor.signing import KeyRing


@dataclass(slots=True)
class CallContext:
    """One trapped call: the notification, the calling thread, its share, the keys."""

    listener: Listener
    notif: kernel.Notification
    thread: TargetThread
    share: Share
    keys: KeyRing
    signing: bool = True
    target_id: int = 0


@dataclass(frozen=True, slots=True)
class Return:
    """Answer the call with this return value."""

    value: int


@dataclass(frozen=True, slots=True)
class Injected:
    """The handler already answered by ADDFD + SEND; `fd` is the target's new fd number."""

    fd: int


Outcome = Return | Injected
Handler = Callable[[CallContext], Outcome]
Middleware = Callable[[str, Handler], Handler]
