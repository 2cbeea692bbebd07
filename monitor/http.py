"""A small, bounded HTTP/1.1 server for fhmon's own endpoints (metrics, health, webhooks).

HTTP is spoken by h11 (sans-IO: bytes in, events out), this module only moves bytes and
enforces limits, so that nothing a client does on one connection can reach the service:

- every error of a connection (reset, broken pipe, timeout, TLS failure, garbage, a bug in a
  handler) ends that connection and is logged; only a failure of the listening socket itself
  (other than running out of fds or memory, which is waited out) stops `serve`;
- at most `Limits.max_connections` connections are served at once (fewer when the process's
  fd limit is low); beyond the cap nothing is accepted: further connections wait in the
  kernel's listen backlog, so a flood holds no fd of ours and costs no CPU;
- one client address (an IPv4 address, an IPv6 /64) holds at most `max_per_source` of
  them: a connection beyond that is closed as soon as it is accepted, so that one attacker
  cannot keep the probes, scrapes or reviews of others waiting in the backlog;
- a TLS handshake must complete within `handshake_timeout` (a client that never sends its
  ClientHello holds its slot that long, not for the request timeout);
- with `max_bodies`, at most that many requests hold a body larger than `small_body_bytes`
  (or of unknown length) in memory at once (at most half of them from one address), each
  from its head until its answer is sent, and the body must then arrive, and the answer
  leave, within `body_timeout` each; small bodies (every connection may hold one) never
  wait behind large ones. An answer larger than `small_body_bytes` to a request that holds
  no slot takes a free one to be sent, or is a 503 when none is free (it is not kept in
  memory waiting for one);
- a request's head is bounded (431), its body too (413), and the whole request must arrive
  within `request_timeout` (408, then close): a slowloris client holds its slot for that long
  at most; an idle keep-alive connection is closed after `idle_timeout`;
- requests on one connection (keep-alive, pipelined) are answered one at a time, in order.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import resource
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11
import trio

from monitor import log

# accept() failures that mean "out of a resource for now": wait and accept again. Anything
# else is a failure of the listening socket itself and stops serve().
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
CAPACITY_PAUSE = 0.1
RECEIVE_SIZE = 16384
# The share of the process's fd limit HTTP connections may take at most: the rest is the
# data plane's (pidfds, opened files on their way into targets, listeners).
FD_SHARE = 4
PACE, SMALL_READ = 0.25, 1024  # see _Connection._read_request
CLOSE_GRACE = 1.0  # time to flush a last answer (or TLS close_notify) before the fd goes
REFUSAL_LOG_INTERVAL = 10.0  # at most one log line this often for connections closed at a cap


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def path(self) -> str:
        """The target without its query string."""
        return self.target.split("?", 1)[0]

    def header(self, name: str) -> str | None:
        """The first value of a header (names compare case-insensitively), if present."""
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class Limits:
    max_connections: int = 64
    max_header_bytes: int = 8192
    max_body_bytes: int = 0
    request_timeout: float = 5.0
    idle_timeout: float = 5.0
    max_requests_per_connection: int = 100
    handshake_timeout: float = 2.0  # TLS only
    max_per_source: int | None = None  # None: a quarter of the connection cap
    max_bodies: int | None = None  # None: as many as connections
    small_body_bytes: int = 0  # bodies up to this declared length need no body slot
    body_timeout: float | None = None  # None: request_timeout


def per_source_cap(limits: Limits, cap: int) -> int:
    """The connections one client address may hold of the `cap` served at once."""
    wanted = limits.max_per_source if limits.max_per_source is not None else cap // 4
    return max(1, min(cap, wanted))


def source_of(address: Any) -> str:
    """The client address connections are counted by: the IPv4 address (also when it
    arrives IPv4-mapped), or the IPv6 /64 (one host's addresses usually share it)."""
    try:
        ip = ipaddress.ip_address(address[0] if isinstance(address, tuple) else address)
    except ValueError:
        return str(address)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def text(status: int, message: str) -> Response:
    """A short plain-text answer (one line)."""
    return Response(status, message.encode() + b"\n")


def route(routes: Mapping[str, Mapping[str, Handler]]) -> Handler:
    """A handler that dispatches on the path, then the method: an unknown path gets 404, a
    known path with another method 405 (with Allow). HEAD is answered like GET, without
    the body (h11 drops it)."""

    async def dispatch(request: Request) -> Response:
        methods = routes.get(request.path)
        if methods is None:
            return text(404, "not found")
        method = "GET" if request.method == "HEAD" and "GET" in methods else request.method
        handler = methods.get(method)
        if handler is None:
            allow = ", ".join(sorted({*methods, *(["HEAD"] if "GET" in methods else [])}))
            return Response(405, b"method not allowed\n", headers=(("Allow", allow),))
        return await handler(request)

    return dispatch


def connection_cap(limits: Limits) -> int:
    """The number of connections served at once: the configured cap, lowered so that HTTP
    never takes more than 1/FD_SHARE of the process's fd limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max(1, limits.max_connections)
    return max(1, min(limits.max_connections, soft // FD_SHARE))


def parse_address(address: str) -> tuple[str | None, int]:
    """"HOST:PORT", "[V6]:PORT" or ":PORT" (every address) -> (host or None, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]") or None, int(port)


async def serve(handler: Handler, address: str, *, name: str, limits: Limits = Limits(),
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


@dataclass
class _Source:
    """What one client address holds: its connections and its share of the body slots."""

    connections: int
    bodies: trio.Semaphore


class _Server:
    def __init__(self, handler: Handler, name: str, limits: Limits,
                 ssl_context: Callable[[], ssl.SSLContext] | None) -> None:
        self.handler = handler
        self.name = name
        self.limits = limits
        self.ssl_context = ssl_context
        self.cap = connection_cap(limits)
        self.slots = trio.Semaphore(self.cap)  # one per connection being served
        self.per_source = per_source_cap(limits, self.cap)
        bodies = self.cap if limits.max_bodies is None else max(1, limits.max_bodies)
        self.body_slots = trio.Semaphore(bodies)
        self.bodies_per_source = max(1, bodies // 2) if limits.max_bodies is not None else bodies
        self.sources: dict[str, _Source] = {}
        self.refused = 0  # connections closed at once: their address was at its cap
        self._refusal_logged = -REFUSAL_LOG_INTERVAL

    async def accept_loop(self, listener: trio.SocketListener,
                          nursery: trio.Nursery) -> None:
        while True:
            # At the cap, accept nothing: further connections wait in the kernel's listen
            # backlog (no fd of ours, no CPU: a reconnect storm costs the data plane
            # nothing) until a slot frees, at the latest request_timeout later.
            await self.slots.acquire()
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
            source = self._admit(stream)
            if source is None:
                # This address holds its share already: close at once (no answer, no
                # wait), so that its flood drains from the backlog instead of queueing
                # in front of other clients.
                self.refused += 1
                try:
                    await trio.aclose_forcefully(stream)
                finally:
                    self.slots.release()  # once the fd is closed
                now = trio.current_time()
                if now - self._refusal_logged >= REFUSAL_LOG_INTERVAL:
                    self._refusal_logged = now
                    log.event(f"{self.name}_source_at_cap", logging.WARNING,
                              max_per_source=self.per_source, refused_total=self.refused)
                continue
            nursery.start_soon(self.connection, stream, source)

    def _admit(self, stream: trio.SocketStream) -> str | None:
        """The connection's source, counted; None when that source is at its cap."""
        try:
            source = source_of(stream.socket.getpeername())
        except OSError:
            return None  # already reset by the peer
        held = self.sources.get(source)
        if held is None:
            held = self.sources[source] = _Source(0, trio.Semaphore(self.bodies_per_source))
        elif held.connections >= self.per_source:
            return None
        held.connections += 1
        return source

    def _leave(self, source: str) -> None:
        held = self.sources[source]
        held.connections -= 1
        if held.connections == 0:
            del self.sources[source]

    async def connection(self, stream: trio.SocketStream, source: str = "") -> None:
        """Serve one connection; whatever happens on it ends here."""
        transport: trio.abc.Stream = stream
        handshaken = self.ssl_context is None
        try:
            if self.ssl_context is not None:
                tls = trio.SSLStream(stream, self.ssl_context(), server_side=True)
                transport = tls
                with trio.move_on_after(self.limits.handshake_timeout):
                    await tls.do_handshake()
                    handshaken = True
                if not handshaken:
                    log.event(f"{self.name}_connection_failed", logging.DEBUG,
                              error="handshake timeout")
                    return
            held = self.sources.get(source)
            bodies = _BodySlots(held.bodies if held else None, self.body_slots)
            await _Connection(transport, self.handler, self.limits, bodies).run()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                ssl.SSLError) as e:
            log.event(f"{self.name}_connection_failed", logging.DEBUG, error=_describe(e))
        except Exception as e:  # a bug must not stop the service; say so loudly
            log.event(f"{self.name}_connection_failed", logging.ERROR, exc_info=True,
                      error=_describe(e))
        finally:
            try:
                if not handshaken:  # nothing to say over TLS: close the socket now
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
                if source in self.sources:
                    self._leave(source)
                self.slots.release()  # once the fd is closed


class _BodySlots:
    """A connection's hold on a body slot: its source's share first, then the server's."""

    def __init__(self, source: trio.Semaphore | None, server: trio.Semaphore) -> None:
        self.source = source
        self.server = server
        self.held = False

    async def acquire(self) -> None:
        if self.held:
            return
        if self.source is not None:
            await self.source.acquire()
        try:
            await self.server.acquire()
        except BaseException:
            if self.source is not None:
                self.source.release()
            raise
        self.held = True

    def try_acquire(self) -> bool:
        """Take a slot only if one is free now."""
        if self.held:
            return True
        try:
            if self.source is not None:
                self.source.acquire_nowait()
        except trio.WouldBlock:
            return False
        try:
            self.server.acquire_nowait()
        except trio.WouldBlock:
            if self.source is not None:
                self.source.release()
            return False
        self.held = True
        return True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.server.release()
            if self.source is not None:
                self.source.release()


def _describe(e: BaseException) -> str:
    cause = e.__cause__ or e.__context__
    if isinstance(cause, OSError) and cause.errno:
        return errno.errorcode.get(cause.errno, type(cause).__name__)
    if isinstance(e, OSError) and e.errno:
        return errno.errorcode.get(e.errno, type(e).__name__)
    return type(e).__name__


class _Connection:
    """The request/response cycles of one connection, over h11."""

    def __init__(self, stream: trio.abc.Stream, handler: Handler, limits: Limits,
                 bodies: _BodySlots | None = None) -> None:
        self.stream = stream
        self.handler = handler
        self.limits = limits
        self.bodies = bodies or _BodySlots(None, trio.Semaphore(1 << 30))
        self.body_timeout = (limits.request_timeout if limits.body_timeout is None
                             else limits.body_timeout)
        self.request_scope: trio.CancelScope | None = None
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.method = b""  # of the request being answered (HEAD gets no body)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.bodies.release()

    async def _run(self) -> None:
        served = 0
        while served < self.limits.max_requests_per_connection:
            request, error = await self.read_request(first=served == 0)
            if request is None and error is None:
                return  # the client closed, or stayed idle: nothing owed
            if error is not None:
                self.bodies.release()
                self.method = b""
                await self.send(error, close=True)
                return
            if request is None:
                return
            served += 1
            last = served >= self.limits.max_requests_per_connection
            response = await self.answer(request)
            del request  # its body: only the answer stays while it is sent
            if (self.limits.max_bodies is not None and not self.bodies.held
                    and len(response.body) > self.limits.small_body_bytes
                    and not self.bodies.try_acquire()):
                log.event("http_large_answer_refused", logging.WARNING,
                          bytes=len(response.body))
                response = text(503, "busy: too many large answers in flight")
            await self.send(response, close=last)
            self.bodies.release()
            if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
                return  # one side asked to close (Connection: close, HTTP/1.0, an error)
            self.h11.start_next_cycle()

    async def read_request(self, first: bool) -> tuple[Request | None, Response | None]:
        """The next complete request, or the error to answer with, or (None, None) when the
        connection ended (or stayed idle) before any byte of a request."""
        limits = self.limits
        # A fresh connection's first request must be complete within request_timeout of
        # the accept (TLS handshake included). A later one waits idle_timeout for its first
        # byte, then must be complete within request_timeout.
        deadline = trio.current_time() + limits.request_timeout
        if not first and not self.h11.trailing_data[0]:
            with trio.move_on_after(limits.idle_timeout) as idle:
                if not await self.receive():
                    return None, None
            if idle.cancelled_caught:
                return None, None  # idle: close without a word
            deadline = trio.current_time() + limits.request_timeout
        with trio.move_on_at(deadline) as self.request_scope:
            try:
                return await self._read_request(), None
            except h11.RemoteProtocolError as e:
                status = e.error_status_hint if e.error_status_hint in (400, 431) else 400
                message = "request head too large" if status == 431 else "bad request"
                return None, text(status, message)
            except _TooLarge:
                return None, text(413, "request body too large")
        if self.h11.their_state is h11.IDLE and not self.h11.trailing_data[0]:
            return None, None  # a connection that never sent a byte: nothing owed
        return None, text(408, "request timeout")

    async def _read_request(self) -> Request | None:
        head: h11.Request | None = None
        body = bytearray()
        small_reads = 0  # reads in a row that were small and left the request incomplete
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                if self.h11.they_are_waiting_for_100_continue:  # curl does, for a body
                    await self.stream.send_all(self.h11.send(
                        h11.InformationalResponse(status_code=100, headers=[])) or b"")
                if small_reads >= 2:
                    # A client trickling its request: read it at most every PACE seconds,
                    # so that slowloris bytes do not wake fhmon's loop (which answers the
                    # calls too) once per byte. A whole request, or one in two pieces, or
                    # a body in full segments, is never paced.
                    await trio.sleep(PACE)
                got = await self.receive()  # at EOF h11 says ConnectionClosed or raises
                small_reads = small_reads + 1 if 0 < got < SMALL_READ else 0
                continue
            if isinstance(event, h11.Request):
                head = event
                # h11 bounds a head that arrives in pieces; one that came in one read is
                # measured here
                size = len(event.method) + len(event.target) + sum(
                    len(k) + len(v) + 4 for k, v in event.headers)
                if size > self.limits.max_header_bytes:
                    raise h11.RemoteProtocolError("request head too large",
                                                  error_status_hint=431)
                names = {name for name, _ in event.headers}
                if b"content-length" in names and b"transfer-encoding" in names:
                    # h11 lets chunked win; a message with both is a smuggling attempt
                    # (RFC 9112 6.1): refuse it, as whatever sits in front might disagree
                    raise h11.RemoteProtocolError("both Content-Length and Transfer-Encoding")
                length = _content_length(event.headers)
                if length is not None and length > self.limits.max_body_bytes:
                    raise _TooLarge
                if ((length or 0) > self.limits.small_body_bytes
                        or b"transfer-encoding" in names):  # a large body follows
                    await self.bodies.acquire()  # waits within the request's deadline
                    scope = self.request_scope
                    if scope is not None:
                        scope.deadline = min(scope.deadline,
                                             trio.current_time() + self.body_timeout)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self.limits.max_body_bytes:
                    raise _TooLarge
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                self.method = head.method
                return Request(method=head.method.decode("ascii", "replace"),
                               target=head.target.decode("ascii", "replace"),
                               headers=[(k.decode("latin-1"), v.decode("latin-1"))
                                        for k, v in head.headers],
                               body=bytes(body))
            elif isinstance(event, h11.ConnectionClosed):
                if head is None:
                    return None
                raise h11.RemoteProtocolError("connection closed mid-request")
            else:  # pragma: no cover - h11 gives a server no other events
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}")

    async def receive(self) -> int:
        """Feed h11 the next bytes; how many (0 at EOF)."""
        data = await self.stream.receive_some(RECEIVE_SIZE)
        self.h11.receive_data(bytes(data))
        return len(data)

    async def answer(self, request: Request) -> Response:
        try:
            with trio.fail_after(self.limits.request_timeout):
                return await self.handler(request)
        except trio.TooSlowError:
            log.event("http_handler_timeout", logging.WARNING, path=request.path)
            return text(503, "timed out")
        except Exception:
            log.event("http_handler_failed", logging.ERROR, exc_info=True, path=request.path)
            return text(500, "internal error")

    async def send(self, response: Response, close: bool) -> None:
        """Send one response (within request_timeout: a client that does not read loses its
        connection, not our time)."""
        if self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return  # h11 cannot answer any more (e.g. after its own protocol error)
        headers = [("Content-Type", response.content_type),
                   ("Content-Length", str(len(response.body))),
                   *response.headers]
        if close:
            headers.append(("Connection", "close"))
        events: list[Any] = [h11.Response(status_code=response.status, headers=headers,
                                          reason=_reason(response.status))]
        if response.body and self.method != b"HEAD":
            events.append(h11.Data(data=response.body))
        events.append(h11.EndOfMessage())
        # Event by event: a large answer is not copied into one buffer with its head. An
        # answer that holds a body slot must leave within body_timeout.
        timeout = self.body_timeout if self.bodies.held else self.limits.request_timeout
        with trio.move_on_after(timeout) as sending:
            for event in events:
                await self.stream.send_all(self.h11.send(event) or b"")
        if sending.cancelled_caught:
            raise trio.BrokenResourceError("the client did not read its answer in time")


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class _TooLarge(Exception):
    """A request body beyond Limits.max_body_bytes."""


def _content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value)  # h11 has checked it is a number
    return None
