"""A small, bounded HTTP/1.1 server for fhmon's own endpoints (metrics, health, webhooks).

HTTP is spoken by h11 (sans-IO: bytes in, events out), this module only moves bytes and
enforces limits, so that nothing a client does on one connection can reach the service:

- every error of a connection (reset, broken pipe, timeout, TLS failure, garbage, a bug in a
  handler) ends that connection and is logged; only a failure of the listening socket itself
  (other than running out of fds or memory, which is waited out) stops `serve`;
- at most `Limits.max_connections` connections are held at once (fewer when the process's
  fd limit is low), at most `max_per_source` of them from one client address (an IPv4
  address, an IPv6 /64); at either cap the connection that has waited longest for its
  client gives way to the newcomer (admission.py), so that no number of slow or silent
  peers, even on the kubelet's or the API server's own address, keeps a probe or a review
  out; only when every connection is in its handler do newcomers wait in the backlog (or,
  at their address's cap, get closed at once);
- a TLS handshake must complete within `handshake_timeout` (a client that never sends its
  ClientHello holds its slot that long, not for the request timeout); TLS state is made
  only once the client speaks, for at most `max_sessions` connections at once;
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

Split by concern: messages.py (Request, Response, routing), limits.py (the bounds and what
they come to on this process), admission.py (what connections and addresses hold),
connection.py (one connection's request/response cycles over h11), server.py (listening,
accepting, TLS, the end of every connection).
"""

from monitor.http.connection import PACE, Connection
from monitor.http.limits import (
    Limits,
    connection_cap,
    per_source_cap,
    raise_fd_limit,
    source_of,
)
from monitor.http.messages import Handler, Request, Response, route, text
from monitor.http.server import parse_address, serve

_Connection = Connection  # the name the unit tests drive one connection by

__all__ = ["PACE", "Connection", "Handler", "Limits", "Request", "Response", "connection_cap",
           "parse_address", "per_source_cap", "raise_fd_limit", "route", "serve", "source_of",
           "text"]
