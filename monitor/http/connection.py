"""The request/response cycles of one connection, over h11 (sans-IO): its deadlines, its
pacing of trickled bytes, its head and body bounds, its answers."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

import h11
import trio

from monitor import log
from monitor.http.admission import BodySlots, Ticket
from monitor.http.limits import Limits
from monitor.http.messages import Handler, Request, Response, text

RECEIVE_SIZE = 16384
PACE, SMALL_READ = 0.25, 1024  # see Connection._read_request


class Connection:
    """The request/response cycles of one connection, over h11."""

    def __init__(self, stream: trio.abc.Stream, handler: Handler, limits: Limits,
                 bodies: BodySlots | None = None, ticket: Ticket | None = None) -> None:
        self.stream = stream
        self.ticket = ticket  # told when a request is complete and when it is answered
        self.handler = handler
        self.limits = limits
        self.bodies = bodies or BodySlots(None, trio.Semaphore(1 << 30))
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
            if self.ticket is not None:
                self.ticket.working()
            last = served >= self.limits.max_requests_per_connection
            response = await self.answer(request)
            del request  # its body: only the answer stays while it is sent
            if self.ticket is not None:
                self.ticket.waiting()  # for the client to read the answer
            if (self.limits.max_bodies is not None and not self.bodies.held
                    and len(response.body) > self.limits.small_body_bytes
                    and not self.bodies.try_acquire()):
                log.event("http_large_answer_refused", logging.WARNING,
                          bytes=len(response.body))
                response = text(503, "busy: too many large answers in flight")
            await self.send(response, close=last)
            self.bodies.release()
            if self.ticket is not None:
                self.ticket.waiting()
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

