"""The listening side: bind, accept within the caps, and run each connection (TLS
included) so that whatever happens on it ends there."""

from __future__ import annotations

import contextlib
import errno
import logging
import ssl
from collections.abc import Callable

import trio

from monitor import log
from monitor.http import tls
from monitor.http.admission import Admission, BodySlots, Ticket
from monitor.http.connection import Connection
from monitor.http.limits import DEFAULT_LIMITS, Limits, connection_cap, per_source_cap, source_of
from monitor.http.messages import Handler

# accept() failures that mean "out of a resource for now": wait and accept again. Anything
# else is a failure of the listening socket itself and stops serve().
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
CAPACITY_PAUSE = 0.1
CLOSE_GRACE = 1.0  # time to flush a last answer (or TLS close_notify) before the fd goes
LOG_INTERVAL = 10.0  # at most one log line this often for connections closed at a cap


def parse_address(address: str) -> tuple[str | None, int]:
    """"HOST:PORT", "[V6]:PORT" or ":PORT" (every address) -> (host or None, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]") or None, int(port)


async def serve(handler: Handler, address: str, *, name: str, limits: Limits = DEFAULT_LIMITS,
                ssl_context: Callable[[], ssl.SSLContext] | None = None,
                task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED,
                ) -> None:
    """Serve `handler` on `address` until cancelled. `name` names the endpoint in logs and
    errors ("metrics", "webhook"). `ssl_context` is called for every connection (a rotated
    certificate takes effect on the next connection). Started with the bound (host, port)s."""
    host, port = parse_address(address)
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as e:  # the caller words it (strerror stays the kernel's)
        e.add_note(f"cannot listen on the {name} address {address}")
        raise
    server = _Server(handler, name, limits, ssl_context)
    bound = [tuple(listener.socket.getsockname()[:2]) for listener in listeners]
    log.event(f"{name}_serving", address=address, max_connections=server.cap,
              max_per_source=server.per_source)
    try:
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(server.accept_loop, listener, nursery)
            task_status.started([(str(h), int(p)) for h, p in bound])
    finally:
        for listener in listeners:
            await trio.aclose_forcefully(listener)


class _Server:
    def __init__(self, handler: Handler, name: str, limits: Limits,
                 ssl_context: Callable[[], ssl.SSLContext] | None) -> None:
        self.handler = handler
        self.name = name
        self.limits = limits
        self.ssl_context = ssl_context
        self.cap = connection_cap(limits)
        self.slots = trio.Semaphore(self.cap)  # one per connection fd held
        self.per_source = per_source_cap(limits, self.cap)
        bodies = self.cap if limits.max_bodies is None else max(1, limits.max_bodies)
        self.body_slots = trio.Semaphore(bodies)
        bodies_per_source = max(1, bodies // 2) if limits.max_bodies is not None else bodies
        sessions = None
        if ssl_context is not None and limits.max_sessions is not None:
            sessions = max(1, min(self.cap, limits.max_sessions))
        self.admission = Admission(self.cap, self.per_source, sessions, bodies_per_source)
        self.refused = 0  # connections closed at once: all of their address's were busy
        self._logged = {"refused": -LOG_INTERVAL, "evicted": -LOG_INTERVAL}

    def _log_at_most_every(self, what: str) -> None:
        now = trio.current_time()
        if now - self._logged[what] >= LOG_INTERVAL:
            self._logged[what] = now
            log.event(f"{self.name}_connections_{what}", logging.WARNING,
                      max_connections=self.cap, max_per_source=self.per_source,
                      evicted_total=self.admission.evicted, refused_total=self.refused)

    async def accept_loop(self, listener: trio.SocketListener,
                          nursery: trio.Nursery) -> None:
        while True:
            await self._slot(listener)
            try:
                stream = await listener.accept()
            except OSError as e:
                self.slots.release()
                if e.errno not in CAPACITY_ERRNOS:
                    raise
                log.event(f"{self.name}_accept_paused", logging.WARNING,
                          error=errno.errorcode.get(e.errno or 0, str(e.errno)))
                await trio.sleep(CAPACITY_PAUSE)
                continue
            except BaseException:
                self.slots.release()
                raise
            ticket = self._admit(stream)
            if ticket is None:
                # Every connection of this address is being answered: close at once (no
                # answer, no wait), so that its flood drains from the backlog.
                self.refused += 1
                try:
                    await trio.aclose_forcefully(stream)
                finally:
                    self.slots.release()  # once the fd is closed
                self._log_at_most_every("refused")
                continue
            nursery.start_soon(self.connection, stream, ticket)

    async def _slot(self, listener: trio.SocketListener) -> None:
        """A slot (an fd) for the next connection. At the cap with someone knocking, the
        connection that has waited longest for its client gives way (admission.py), so that
        the backlog drains at once and a kubelet probe or an API server's review is never
        kept behind slow or silent peers. While every connection is in its handler, the
        knocking one waits in the kernel's backlog (looked at again every CAPACITY_PAUSE)."""
        while self.slots.value == 0:
            await trio.lowlevel.wait_readable(listener.socket)
            if self.admission.make_room():
                self._log_at_most_every("evicted")
                break  # the victim's slot, once its fd is closed
            with trio.move_on_after(CAPACITY_PAUSE):
                await self.slots.acquire()
                return
        await self.slots.acquire()

    def _admit(self, stream: trio.SocketStream) -> Ticket | None:
        try:
            source = source_of(stream.socket.getpeername())
        except OSError:
            return None  # already reset by the peer
        evicted = self.admission.evicted
        ticket = self.admission.admit(source)
        if self.admission.evicted != evicted:
            self._log_at_most_every("evicted")
        return ticket

    async def connection(self, stream: trio.SocketStream, ticket: Ticket) -> None:
        """Serve one connection; whatever happens on it ends here."""
        transport: trio.abc.Stream = stream
        handshaken = self.ssl_context is None
        try:
            with ticket.scope:
                if self.ssl_context is not None:
                    with trio.move_on_after(self.limits.handshake_timeout):
                        # No TLS state (memory) before the whole ClientHello is here.
                        hello = await tls.first_record(stream)
                        if not hello:
                            return  # closed before a byte
                        await self.admission.start_session(ticket)
                        secure = trio.SSLStream(tls.Replayed(stream, hello), self.ssl_context(),
                                                server_side=True)
                        transport = secure
                        await secure.do_handshake()
                        handshaken = True
                    if not handshaken:
                        log.event(f"{self.name}_connection_failed", logging.DEBUG,
                                  error="handshake timeout")
                        return
                held = self.admission.sources.get(ticket.source)
                bodies = BodySlots(held.bodies if held else None, self.body_slots)
                await Connection(transport, self.handler, self.limits, bodies, ticket).run()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                ssl.SSLError) as e:
            log.event(f"{self.name}_connection_failed", logging.DEBUG, error=_describe(e))
        except Exception as e:  # a bug must not stop the service; say so loudly
            log.event(f"{self.name}_connection_failed", logging.ERROR, exc_info=True,
                      error=_describe(e))
        finally:
            try:
                if not handshaken or ticket.evicted:  # nothing more to say: close now
                    await trio.aclose_forcefully(stream)
                else:
                    with trio.move_on_after(CLOSE_GRACE) as closing:
                        closing.shield = True
                        with contextlib.suppress(trio.BrokenResourceError,
                                                 trio.ClosedResourceError, OSError,
                                                 ssl.SSLError):
                            await transport.aclose()
                    if closing.cancelled_caught:
                        await trio.aclose_forcefully(stream)
            finally:
                self.admission.leave(ticket)
                self.slots.release()  # once the fd is closed


def _describe(e: BaseException) -> str:
    cause = e.__cause__ or e.__context__
    if isinstance(cause, OSError) and cause.errno:
        return errno.errorcode.get(cause.errno, type(cause).__name__)
    if isinstance(e, OSError) and e.errno:
        return errno.errorcode.get(e.errno, type(e).__name__)
    return type(e).__name__

