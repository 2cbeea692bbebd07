"""Requests, responses and routing: what a handler of monitor.http sees and returns."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass


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

