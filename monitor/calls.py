"""A registered target, and answering one of its calls: shared by `fhmon serve` and its
worker processes, which answer calls the same way from their own copies of the fds."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monitor import log
from monitor.handlers.base import CallContext
from monitor.handlers.registry import Dispatcher, syscall_name
from monitor.listener import Listener
from monitor.policy import Share
from monitor.signing import KeyRing
from monitor.target import RESOURCE_ERRNOS, TargetThread, ThreadCache
from protocol import kernel


@dataclass(frozen=True, slots=True)
class PeerCred:
    pid: int
    uid: int
    gid: int


@dataclass
class Target:
    """One registered listener and the share it is confined to."""

    target_id: int
    listener: Listener
    share: Share
    pid: int
    peer: PeerCred
    convention: str
    registered_at: float = field(default_factory=time.time)
    calls: int = 0
    threads: ThreadCache = field(default_factory=ThreadCache)

    def describe(self) -> dict[str, Any]:
        return {"id": self.target_id, "pid": self.pid, "share": self.share.host_path,
                "share_in_target": self.share.target_path, "convention": self.convention,
                "peer_uid": self.peer.uid, "peer_pid": self.peer.pid, "calls": self.calls,
                "registered_at": self.registered_at}

    def close(self) -> None:
        self.threads.close()
        self.listener.close()
        self.share.close()


class Answerer:
    """Answers one notification: the registering client's uid check, then the handler
    chain (with its middleware). keys() gives the current ring (reloads swap it)."""

    def __init__(self, dispatcher: Dispatcher, keys: Callable[[], KeyRing],
                 signing: bool) -> None:
        self.dispatcher = dispatcher
        self._keys = keys
        self._signing = signing

    def __call__(self, target: Target, notif: kernel.Notification) -> None:
        target.calls += 1
        thread = TargetThread(target.listener, notif, target.threads)
        if target.peer.uid != 0 and not self._owned_by_peer(target, thread):
            return
        ctx = CallContext(target.listener, notif, thread, target.share, self._keys(),
                          self._signing, target.target_id)
        self.dispatcher.dispatch(ctx)

    def _owned_by_peer(self, target: Target, thread: TargetThread) -> bool:
        """An unprivileged client registered this listener: serve only processes of its own
        uid (the kernel cannot tell fhmon whose filter a listener is before a call comes).
        Another uid's call is answered EPERM, as without fhmon."""
        try:
            uid = thread.status.uid
        except OSError as exc:  # fhmon out of fds or memory: the kernel's answer
            if exc.errno in RESOURCE_ERRNOS:
                target.listener.respond(thread.notif.id, error=exc.errno)
            return False
        except Exception:
            return False  # gone
        if uid == target.peer.uid:
            return True
        log.audit("call_refused", syscall=syscall_name(thread.notif.nr), errno="EPERM",
                  reason=f"caller uid {uid} is not the registering client's uid "
                  f"{target.peer.uid}", tid=thread.tid, target=target.target_id)
        target.listener.respond(thread.notif.id, error=errno.EPERM)
        return False
