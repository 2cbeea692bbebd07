"""A registered target, and answering one of its calls: shared by `fhmon serve` and its
worker processes, which answer calls the same way from their own copies of the fds."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monitor.handlers.base import CallContext
from monitor.handlers.registry import HandlerRegistry
from monitor.listener import Listener
from monitor.metrics import CallStats, metrics_middleware
from monitor.plane.audit import audit_middleware
from monitor.plane.target_thread import TargetThread
from monitor.plane.thread_cache import ThreadCache
from monitor.policy import Share
from monitor.signing import KeyRing
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
        return {"id": self.target_id, "pid": self.pid, "share": self.share.facts.host_path,
                "share_in_target": self.share.facts.target_path, "convention": self.convention,
                "peer_uid": self.peer.uid, "peer_pid": self.peer.pid, "calls": self.calls,
                "registered_at": self.registered_at}

    def close(self) -> None:
        self.threads.close()
        self.listener.close()
        self.share.close()


class Answerer:
    """Answers one notification through the handler registry (its middleware, the caller-uid
    check first, and its one answerer). keys() gives the current ring (reloads swap it)."""

    def __init__(self, registry: HandlerRegistry, keys: Callable[[], KeyRing],
                 signing: bool) -> None:
        self.registry = registry
        self._keys = keys
        self._signing = signing

    def __call__(self, target: Target, notif: kernel.Notification) -> None:
        target.calls += 1
        thread = TargetThread(target.listener, notif, target.threads)
        self.registry.dispatch(CallContext(thread, target.share, self._keys(), self._signing,
                                           target.target_id, target.peer.uid))


def reference_answerer(stats: CallStats, keys: Callable[[], KeyRing],
                       signing: bool) -> Answerer:
    """The Python reference plane's answerer, as `fhmon serve` and each worker build it: the
    handler registry with the metrics and audit middleware, both counting into stats."""
    return Answerer(HandlerRegistry([metrics_middleware(stats), audit_middleware(stats)]),
                    keys, signing)
