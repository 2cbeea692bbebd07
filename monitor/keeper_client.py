"""fhmon serve's side of the keeper (monitor/keeper.py): deposit OCI targets' listeners
with it, and withdraw them all at start-up.

A runtime hands an OCI target's listener to fhmon once and closes its own copy, so if
fhmon restarts, only a copy the keeper holds keeps the filter alive (the last close would
fail every call with ENOSYS for good). Whatever order fhmon and the keeper restart in,
no listener is lost while at least one of them runs: `sync` keeps one connection to the
keeper and deposits every such listener on it; when the keeper goes away it connects
again (with backoff, at most RECONNECT_MAX_DELAY) and deposits them all again, since a
keeper that restarted holds nothing. A listener registered while the keeper was down is
deposited on the first connection after it is back; and before a graceful stop (SIGTERM:
a rolling upgrade) `deposit_before_exit` hands every such listener over once more and waits
until the keeper has read them all, so that a restart right after the keeper's return
cannot outrun the reconnection. Messages are protocol/keeper.py's frames.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import trio

from monitor import fdpass, log
from monitor.calls import Target
from monitor.fdpass import close_quietly
from monitor.intake import recv_with_fds
from protocol import keeper as keeper_wire

if TYPE_CHECKING:
    from monitor.prom import Metrics

CONNECT_TIMEOUT = 5.0
WITHDRAW_TIMEOUT = 10.0
RECONNECT_MAX_DELAY = 0.5  # a connect to an absent keeper is one failing syscall
EXIT_DEPOSIT_TIMEOUT = 3.0  # a graceful stop waits this long for the keeper at most
_SESSION_ERRORS = (OSError, trio.TooSlowError, trio.BrokenResourceError)


def keeper_record(target: Target) -> dict[str, Any]:
    """What the keeper keeps of a target besides its listener, for fhmon's restore."""
    return {"pid": target.pid, "share": target.share.facts.target_path, "uid": target.peer.uid,
            "gid": target.peer.gid, "convention": target.convention,
            "share_id": target.share.facts.share_id.hex()}


class KeeperClient:
    def __init__(self, socket_path: str, metrics: Metrics,
                 targets: Callable[[], Iterable[Target]]) -> None:
        self.socket_path = socket_path
        self._metrics = metrics
        self._targets = targets
        self._dirty = trio.Event()  # set when a target for the keeper registers
        self._ever_deposited: set[int] = set()  # target ids the keeper took at least once
        self._failed_deposits: set[int] = set()  # ... and those counted as failed deposits

    def target_added(self) -> None:
        """A target registered: `sync` deposits it if it is an OCI one."""
        self._dirty.set()

    def forget(self, target_id: int) -> None:
        self._ever_deposited.discard(target_id)
        self._failed_deposits.discard(target_id)

    async def sync(self) -> None:
        """Keep every OCI target's listener deposited, for as long as fhmon serves: each
        is deposited once per keeper connection (the keeper ignores a listener it holds
        already); on EOF or error, connect again with backoff and deposit them all again.
        So a listener is lost only if fhmon and the keeper are down together."""
        delay, outage = 0.05, False
        while True:
            # except*: an error of a deposit inside the session's nursery arrives in an
            # ExceptionGroup, and it too only ends the session (it used to end fhmon).
            try:
                deposited = await self._session()
            except* _SESSION_ERRORS as group:
                self._count_failed_deposits()
                if not outage:
                    log.event("keeper_unreachable", logging.WARNING, keeper=self.socket_path,
                              error="; ".join(str(e) for e in group.exceptions),
                              hint="listeners are deposited once it is back")
                outage = True
            else:
                log.event("keeper_lost", logging.WARNING, keeper=self.socket_path,
                          deposited=deposited, hint="depositing again once it is back")
                outage, delay = True, 0.05
            await trio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_DELAY)

    async def deposit_before_exit(self) -> int:
        """Before a graceful stop: deposit every OCI target's listener on a connection of
        its own, then half-close it and wait for the keeper's EOF: the keeper reads and
        takes each deposit before it reads the end, so its EOF says it holds them all (it
        ignores those it held already). Returns how many; logs when the keeper cannot be
        reached (those listeners die with this process: ENOSYS)."""
        targets = [t for t in self._targets() if t.convention == "oci"]
        if not targets:
            return 0
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        with sock:
            try:
                with trio.fail_after(EXIT_DEPOSIT_TIMEOUT):
                    await sock.connect(self.socket_path)
                    for target in targets:
                        frame = keeper_wire.encode({"op": "deposit",
                                                    "target": keeper_record(target)})
                        await sock.sendmsg([frame], fdpass.rights([target.listener.fd]))
                    sock.shutdown(socket.SHUT_WR)
                    while await sock.recv(4096):
                        pass
            except _SESSION_ERRORS as exc:
                log.event("keeper_unreachable_at_exit", logging.ERROR, keeper=self.socket_path,
                          error=str(exc) or type(exc).__name__, listeners=len(targets),
                          hint="these runtime-registered targets get ENOSYS from now on")
                return 0
        log.event("keeper_synced_before_exit", keeper=self.socket_path, deposited=len(targets))
        return len(targets)

    def _count_failed_deposits(self) -> None:
        """fhmon_keeper_deposits_total{outcome="failed"}: once for each target whose
        listener could not be handed to the keeper at all yet (it is retried until the
        keeper is back); a target already deposited once is not counted again when a
        keeper dies (keeper_lost says that)."""
        for target in self._targets():
            if (target.convention == "oci" and target.target_id not in self._ever_deposited
                    and target.target_id not in self._failed_deposits):
                self._failed_deposits.add(target.target_id)
                self._metrics.count_deposit("failed")

    async def _session(self) -> int:
        """One connection to the keeper, until it closes; returns how many deposits."""
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        with sock:
            with trio.fail_after(CONNECT_TIMEOUT):
                await sock.connect(self.socket_path)
            deposited: set[int] = set()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on_eof, sock, nursery.cancel_scope)
                first = True
                while True:
                    self._dirty = trio.Event()  # before the scan: nothing is missed
                    for target in list(self._targets()):
                        if target.convention != "oci" or target.target_id in deposited:
                            continue
                        frame = keeper_wire.encode({"op": "deposit",
                                                    "target": keeper_record(target)})
                        with trio.fail_after(CONNECT_TIMEOUT):
                            await sock.sendmsg([frame], fdpass.rights([target.listener.fd]))
                        deposited.add(target.target_id)
                        self._ever_deposited.add(target.target_id)
                        self._metrics.count_deposit("ok")
                        log.event("deposited", target=target.target_id, keeper=self.socket_path)
                    if first:
                        log.event("keeper_synced", keeper=self.socket_path,
                                  deposited=len(deposited))
                        first = False
                    await self._dirty.wait()
        return len(deposited)

    async def withdraw(self) -> list[tuple[int, dict[str, Any]]]:
        """Every listener the keeper holds, with its record (keeper_record, plus
        `_restarted`: the keeper already made the target's stuck calls trap again).
        An unreachable or misbehaving keeper gives what arrived before (often nothing)."""
        entries: list[tuple[int, dict[str, Any]]] = []
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        fds: list[int] = []  # received, not yet paired with a record
        with sock:
            try:
                with trio.fail_after(WITHDRAW_TIMEOUT):
                    await sock.connect(self.socket_path)
                    await sock.send(keeper_wire.encode({"op": "withdraw"}))
                    decoder = keeper_wire.Decoder()
                    done = False
                    while not done:
                        data, fds = await recv_with_fds(sock, fds)
                        if not data:
                            break
                        decoder.feed(data)
                        while (message := decoder.next_message()) is not None:
                            if message["op"] == "listener" and fds:
                                record = dict(message.get("target", {}))
                                record["_restarted"] = message.get("restarted") is True
                                entries.append((fds.pop(0), record))
                            elif message["op"] == "end":
                                done = True
            except (OSError, trio.TooSlowError, keeper_wire.KeeperProtocolError) as exc:
                log.event("keeper_unreachable", logging.WARNING, keeper=self.socket_path,
                          error=str(exc))
            finally:
                for fd in fds:
                    close_quietly(fd)
        return entries


async def _cancel_on_eof(sock: trio.socket.SocketType, scope: trio.CancelScope) -> None:
    """The keeper sends nothing on a deposit session: any byte or EOF (or error) ends it."""
    try:
        while await sock.recv(4096):
            pass
    except OSError:
        pass
    scope.cancel()
