"""The intake socket's I/O: accepting, admitting and pacing clients, and carrying each
connection through its conversation (protocol/intake.py) or its OCI state message.

What a registration must satisfy is not decided here: the Registrar (fhmon serve's
Service) checks it and answers. This module only moves bytes and fds, and keeps the
bounds that let no client take the intake from the others: pending connections per uid
and in all, each uid's pace, the registration timeout.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import socket
import struct
from collections.abc import Callable, Iterator
from typing import Protocol

import trio

from monitor import fdpass, log
from monitor.calls import PeerCred
from monitor.config import Config
from monitor.fdpass import close_quietly
from monitor.registration import PEER_GONE
from protocol import intake_wire, oci
from protocol.intake import Action, IntakeConversation, Phase, Step

MAX_FDS_PER_MESSAGE = 16
RECV_CHUNK = 64 * 1024
# accept(2) errors that say fhmon is short of fds or memory: wait and try again (as trio's
# serve_listeners does). Errors that say one incoming connection died: skip it. Any other
# error (EBADF, EINVAL: the listening socket itself is broken) is raised, never spun on.
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_CONNECTION_DIED = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})


class Registrar(Protocol):
    """What the intake asks of fhmon serve."""

    def pong(self) -> intake_wire.Pong: ...

    def status_page(self, after: int) -> intake_wire.StatusReply: ...

    def register_native(self, hello: intake_wire.Hello, fds: list[int], peer: PeerCred,
                        nursery: trio.Nursery,
                        peer_pidfd: int | None = None) -> intake_wire.Accept | intake_wire.Refuse:
        ...

    def register_oci(self, peer: PeerCred, state: oci.ContainerProcessState,
                     fds: list[int], nursery: trio.Nursery,
                     peer_pidfd: int | None = None) -> None: ...

    def count_registration(self, outcome: str) -> None: ...


class IntakePace:
    """How fast one client uid's intake work is done: each message handled and each read
    of a pending or lingering connection takes a token of its uid's bucket (GCRA: `rate`
    a second, bursts of `burst`), root's bucket larger (a fleet of launchers registers
    again after a restart). Intake runs on the thread (and CPUs) that also serve calls:
    a client pipelining PINGs or STATUS as fast as it can raised a registered neighbour's
    p99 ~20x (bench/intake.py); paced, it waits on its own socket instead."""

    RATE, BURST = 500.0, 64  # a registration takes 2-3 tokens, a status ~1 per page
    ROOT_RATE, ROOT_BURST = 5000.0, 1024

    def __init__(self) -> None:
        self._theoretical_arrival: dict[int, float] = {}

    async def take(self, uid: int, tokens: int = 1) -> None:
        """Wait until `uid` may do `tokens` units of intake work."""
        rate, burst = (self.ROOT_RATE, self.ROOT_BURST) if uid == 0 else (self.RATE, self.BURST)
        now = trio.current_time()
        arrivals = self._theoretical_arrival
        if len(arrivals) > 4096:  # forget uids whose buckets are full again
            for stale in [u for u, t in arrivals.items() if t < now]:
                del arrivals[stale]
        due = max(arrivals.get(uid, now), now)
        arrivals[uid] = due + tokens / rate
        wait = due + (tokens - 1 - burst) / rate - now
        if wait > 0:
            await trio.sleep(wait)


class Admission:
    """Pending (not yet registered) connections, counted per client uid.

    Capped per uid (max_connections_per_uid) and, for all uids but root together, by
    max_connections; root has a pool of its own, so a group member holding every slot
    starves neither root's registrations nor the health probe. Registered connections (a
    launcher's, kept for the target's life) are bounded by max_targets instead."""

    # bytes of unfinished OCI state messages one uid may have fhmon hold, all its
    # connections together: a whole message arrives in one write (runc, crun), so a few
    # at once are plenty; root (the runtimes) registers whole fleets after a restart
    PARTIAL_BYTES, ROOT_PARTIAL_BYTES = 4 * oci.MAX_STATE_SIZE, 64 * oci.MAX_STATE_SIZE

    def __init__(self, config: Config) -> None:
        self._config = config
        self._others = 0  # pending connections of every uid but root
        self._pending: dict[int, int] = {}  # uid -> pending connections
        self._partial: dict[int, int] = {}  # uid -> bytes of unfinished state messages

    def admit(self, uid: int) -> str | None:
        """Count a new connection of `uid` as pending, or say why not."""
        pending = self._pending.get(uid, 0)
        if uid != 0:
            if pending >= self._config.max_connections_per_uid:
                return f"uid {uid} has max_connections_per_uid pending connections"
            if self._others >= self._config.max_connections:
                return "too many connections"
            self._others += 1
        elif pending >= self._config.max_connections:
            return "too many connections from root"
        self._pending[uid] = pending + 1
        return None

    def settled(self, uid: int) -> None:
        """The pending connection of `uid` registered or ended."""
        self._pending[uid] -= 1
        if not self._pending[uid]:
            del self._pending[uid]
        if uid != 0:
            self._others -= 1

    def hold(self, uid: int, size: int) -> str | None:
        """Count `size` more bytes of an unfinished state message of `uid`, or say why
        not (the connection is then refused: its bytes are dropped with it)."""
        held = self._partial.get(uid, 0) + size
        cap = self.ROOT_PARTIAL_BYTES if uid == 0 else self.PARTIAL_BYTES
        if held > cap:
            return (f"uid {uid} would hold more than {cap} bytes of unfinished OCI state "
                    f"messages")
        self._partial[uid] = held
        return None

    def release(self, uid: int, size: int) -> None:
        """`size` bytes counted by hold are no longer held."""
        held = self._partial.get(uid, 0) - size
        if held > 0:
            self._partial[uid] = held
        else:
            self._partial.pop(uid, None)

    def full(self) -> bool:
        """True while a new registration would be turned away for want of a pending slot:
        root's pool, or the pool every other uid shares, is at max_connections."""
        cap = self._config.max_connections
        return self._others >= cap or self._pending.get(0, 0) >= cap


class Intake:
    """The intake socket: one task per connection, in the service's nursery."""

    def __init__(self, config: Config, registrar: Registrar) -> None:
        self._config = config
        self._registrar = registrar
        self.admission = Admission(config)
        self._pace = IntakePace()
        self.accepting = False  # the accept loop runs (/readyz)
        # a client refused again and again writes 20 lines, then 1 a second, and a count
        self._dropped_lines = log.Throttle()
        self._refused_lines = log.Throttle()
        self._audited_oci_refusals = log.Throttle()

    async def serve(self, sock: trio.socket.SocketType, nursery: trio.Nursery) -> None:
        """Accept until cancelled; each admitted connection is served in `nursery`."""
        self.accepting = True
        try:
            async with trio.open_nursery() as own:
                own.start_soon(self._flush_throttled_lines)
                await self._accept(sock, nursery)
        finally:
            self.accepting = False
            self._flush()  # what was held back is said before the service stops

    async def _flush_throttled_lines(self) -> None:
        """Once a second, one summary line for each kind of refusal lines held back."""
        while True:
            await trio.sleep(1.0)
            self._flush()

    def _flush(self) -> None:
        log.flush_throttled(self._dropped_lines, "connection_dropped", logging.WARNING,
                            lambda key: {"peer_uid": key[0], "reason": key[1]})
        log.flush_throttled(self._refused_lines, "registration_refused", logging.WARNING,
                            lambda key: {"peer_uid": key[0], "reason": key[1]})
        log.flush_throttled(self._audited_oci_refusals, "registration_refused", logging.WARNING,
                            lambda key: {"peer_uid": key[0], "reason": key[1],
                                         "convention": "oci"}, to_audit=True)

    def _audit_oci_refusal(self, peer: PeerCred, reason: str) -> None:
        """The audit line of a refused OCI state, throttled per client uid and reason (a
        runtime's client refused for holding too much reconnects at once, and again)."""
        self._registrar.count_registration("refused")
        if self._audited_oci_refusals.admit((peer.uid, reason), trio.current_time()):
            log.audit("registration_refused", reason=reason, convention="oci",
                      peer_uid=peer.uid, peer_pid=peer.pid)

    def _refusal_line(self, peer: PeerCred, reason: str) -> None:
        """A registration_refused event of the intake (not the audit of a refused
        registration: monitor/server.py), throttled per client uid and reason."""
        if self._refused_lines.admit((peer.uid, reason), trio.current_time()):
            log.event("registration_refused", logging.WARNING, peer_pid=peer.pid,
                      peer_uid=peer.uid, reason=reason)

    async def _accept(self, sock: trio.socket.SocketType, nursery: trio.Nursery) -> None:
        """The accept loop: admission per client uid, then a task per connection."""
        while True:
            try:
                conn, _ = await sock.accept()
            except OSError as exc:
                if exc.errno in _ACCEPT_CONNECTION_DIED:
                    continue
                if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                    raise
                log.event("accept_failed", logging.ERROR, error=exc.strerror)
                await trio.sleep(0.1)
                continue
            try:
                peer = peer_cred(conn)
            except OSError:
                conn.close()
                continue
            refusal = self.admission.admit(peer.uid)
            if refusal is not None:
                conn.close()
                self._registrar.count_registration("dropped")
                if self._dropped_lines.admit((peer.uid, refusal), trio.current_time()):
                    log.event("connection_dropped", logging.WARNING, peer_uid=peer.uid,
                              peer_pid=peer.pid, reason=refusal)
                continue
            nursery.start_soon(self._connection, conn, peer, nursery)

    async def _connection(self, conn: trio.socket.SocketType, peer: PeerCred,
                          nursery: trio.Nursery) -> None:
        fds: list[int] = []
        pending = True

        def settle() -> None:
            nonlocal pending
            if pending:
                pending = False
                self.admission.settled(peer.uid)

        try:
            with trio.move_on_after(self._config.registration_timeout) as scope:
                data, fds = await recv_with_fds(conn, fds)
                if not data:
                    return
                if intake_wire.looks_native(data):
                    await self._converse(conn, peer, data, fds, nursery, scope, settle)
                else:
                    registration = await self._read_oci(conn, peer, data, fds)
                    if registration is not None:
                        state, fds = registration
                        with peer_pidfd(conn) as client:
                            self._registrar.register_oci(peer, state, fds, nursery, client)
            if scope.cancelled_caught:
                self._registrar.count_registration("timeout")
                self._refusal_line(peer, "timed out waiting for a registration")
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:  # a client must never take the service down
            log.event("connection_failed", logging.ERROR, exc_info=True)
        finally:
            for fd in fds:
                close_quietly(fd)
            conn.close()
            settle()

    async def _converse(self, conn: trio.socket.SocketType, peer: PeerCred, data: bytes,
                        fds: list[int], nursery: trio.Nursery, timeout: trio.CancelScope,
                        settle: Callable[[], None]) -> None:
        """A native conversation, from the first bytes until either side ends it. Once
        registered, the connection is the launcher's for its target's life: it leaves the
        registration timeout and the pending count, and carries no more fds."""
        conversation = IntakeConversation()
        decoder = intake_wire.FrameDecoder()
        while True:
            try:
                decoder.feed(data)
                while (message := decoder.next_message()) is not None:
                    await self._pace.take(peer.uid)
                    step = conversation.receive(message)
                    if not step.takes_fds:  # fds ride only with HELLO; never keep strays
                        for fd in fds:
                            close_quietly(fd)
                        fds.clear()
                    reply = self._perform(step, message, fds, peer, nursery, conn)
                    if step.action is Action.REGISTER:
                        conversation.registration_settled(isinstance(reply, intake_wire.Accept))
                        if not conversation.timed:  # registered: the launcher's for good
                            timeout.deadline = math.inf
                            settle()
                    if reply is not None:
                        await conn.send(intake_wire.encode(reply))
                    if conversation.phase is Phase.CLOSED:
                        return
            except intake_wire.ProtocolError as exc:
                step = conversation.protocol_error(str(exc))
                if step.action is Action.REFUSE:
                    self._registrar.count_registration("malformed")
                    self._refusal_line(peer, str(exc))
                    await conn.send(intake_wire.encode(intake_wire.Refuse(step.errno, step.reason)))
                return
            await self._pace.take(peer.uid)
            if conversation.phase is Phase.AWAITING_HELLO:
                data, fds = await recv_with_fds(conn, fds)
            else:
                data = await recv_plain(conn)
            if not data:
                return

    async def _read_oci(self, conn: trio.socket.SocketType, peer: PeerCred, data: bytes,
                        fds: list[int]) -> tuple[oci.ContainerProcessState, list[int]] | None:
        """The runtime's state message, from its first chunk `data` on. Every further read
        and every parse is paid from the client uid's pace, and the bytes held until the
        message is whole count against the uid's share (Admission.hold)."""
        reader = oci.StateReader()
        held = 0
        try:
            while True:
                try:
                    refusal = self.admission.hold(peer.uid, len(data))
                    if refusal is not None:
                        raise oci.OciStateError(refusal)
                    held += len(data)
                    cost = reader.add(data)
                    if cost:
                        await self._pace.take(peer.uid, cost)
                        state = reader.parse()
                        if state is not None:
                            return state, fds
                except oci.OciStateError as exc:
                    self._audit_oci_refusal(peer, str(exc))
                    return None
                await self._pace.take(peer.uid)
                data, fds = await recv_with_fds(conn, fds)
                if len(fds) > MAX_FDS_PER_MESSAGE:
                    self._audit_oci_refusal(peer, f"more than {MAX_FDS_PER_MESSAGE} fds with "
                                            "one state message")
                    return None
                if not data:
                    self._audit_oci_refusal(peer, str(reader.finish()))
                    return None
        finally:
            self.admission.release(peer.uid, held)

    def _perform(self, step: Step, message: intake_wire.Message, fds: list[int], peer: PeerCred,
                 nursery: trio.Nursery,
                 conn: trio.socket.SocketType) -> intake_wire.Message | None:
        match step.action:
            case Action.PONG:
                return self._registrar.pong()
            case Action.STATUS:
                assert isinstance(message, intake_wire.StatusRequest)
                return self._registrar.status_page(message.after)
            case Action.REGISTER:
                assert isinstance(message, intake_wire.Hello)
                received = list(fds)
                fds.clear()  # the registrar owns them now, whatever it answers
                with peer_pidfd(conn) as client:
                    return self._registrar.register_native(message, received, peer, nursery,
                                                           client)
            case Action.REFUSE:
                return intake_wire.Refuse(step.errno, step.reason)
            case Action.IGNORE | Action.CLOSE:
                return None


# --- small I/O helpers ------------------------------------------------------------------

def peer_cred(conn: trio.socket.SocketType) -> PeerCred:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return PeerCred(pid, uid, gid)


SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5+


@contextlib.contextmanager
def peer_pidfd(conn: trio.socket.SocketType) -> Iterator[int | None]:
    """A pidfd of the process that connected (SO_PEERPIDFD), for the block: the
    registration checks that the process it reads at the client's pid is still that one.
    registration.PEER_GONE if the kernel says the client has exited; None on a kernel
    without SO_PEERPIDFD (the check is then skipped)."""
    try:
        fd: int | None = struct.unpack("i", conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD,
                                                            4))[0]
    except OSError as exc:
        fd = None if exc.errno in (errno.ENOPROTOOPT, errno.EOPNOTSUPP) else PEER_GONE
    try:
        yield fd
    finally:
        if fd is not None and fd >= 0:
            close_quietly(fd)


async def recv_with_fds(conn: trio.socket.SocketType, fds: list[int]) -> tuple[bytes, list[int]]:
    """One recvmsg; the fds it brought are appended to `fds`. More than
    MAX_FDS_PER_MESSAGE in one message: all are closed, the client is told (EINVAL) and
    the data is b"" (the connection ends)."""
    data, ancdata, msg_flags, _ = await conn.recvmsg(RECV_CHUNK,
                                                     fdpass.space(MAX_FDS_PER_MESSAGE))
    fds.extend(fdpass.fds_from_ancdata(ancdata))
    if msg_flags & socket.MSG_CTRUNC:
        refusal = f"more than {MAX_FDS_PER_MESSAGE} fds in one message"
        for fd in fds:
            close_quietly(fd)
        fds.clear()
        with contextlib.suppress(OSError):
            await conn.send(intake_wire.encode(intake_wire.Refuse(errno.EINVAL, refusal)))
        return b"", fds
    return data, fds


async def recv_plain(conn: trio.socket.SocketType) -> bytes:
    """Data only: any fds that came along are closed at once."""
    data, fds = await recv_with_fds(conn, [])
    for fd in fds:
        close_quietly(fd)
    return bytes(data)
