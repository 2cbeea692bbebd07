"""The bounds one server enforces (Limits) and what they come to on this process: its
connection cap under the fd limit, one client address's share, how addresses are counted."""

from __future__ import annotations

import ipaddress
import resource
from dataclasses import dataclass
from typing import Any

# The share of the process's fd limit HTTP connections may take at most: the rest is the
# data plane's (pidfds, opened files on their way into targets, listeners).
FD_SHARE = 4


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
    # TLS only: connections that hold TLS state (an SSL object, its buffers: far more
    # memory than a connection whose client has not spoken yet). None: max_connections.
    max_sessions: int | None = None


DEFAULT_LIMITS = Limits()


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


def connection_cap(limits: Limits) -> int:
    """The number of connections served at once: the configured cap, lowered so that HTTP
    never takes more than 1/FD_SHARE of the process's fd limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max(1, limits.max_connections)
    return max(1, min(limits.max_connections, soft // FD_SHARE))



def raise_fd_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (as Go programs do at
    start; container runtimes often leave the soft one at 1,024), so that the connection
    cap is the configured one; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
