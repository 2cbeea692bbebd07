"""Who may hold a connection, and whose connection goes when someone new knocks.

A peer fhmon cannot tell apart from the kubelet or the API server (the same node address,
one NAT) must not be able to keep them out, however many connections it holds and however
slowly it speaks. So a new connection is never kept waiting or refused because others wait
for their clients: at a cap, the connection that has waited longest for its client gives
way (it is closed at once), that of the same address first. A connection waits for its
client in its TLS handshake, until its request has fully arrived, while its answer is
being sent (a client that does not read), and idle between requests; only while its
handler runs may it not be closed this way. Its wait begins at its accept and again when
its answer is ready, so the newest connection is the last to go: a kubelet probe or an API
server's review is a complete request within a round trip of its accept, and to close it
before it is answered a peer must open `per_source` (of its address) or `cap` (of all)
connections within that round trip, at the pace fhmon accepts them.
"""

from __future__ import annotations

import trio


class _Waiting:
    """Connections waiting for their client, the one that has waited longest first (its
    wait began at its accept or at its last answer)."""

    def __init__(self) -> None:
        self.tickets: dict[Ticket, None] = {}  # insertion-ordered

    def add(self, ticket: Ticket) -> None:
        self.tickets[ticket] = None

    def discard(self, ticket: Ticket) -> None:
        self.tickets.pop(ticket, None)

    def oldest(self) -> Ticket | None:
        return next(iter(self.tickets), None)

    def __contains__(self, ticket: Ticket) -> bool:
        return ticket in self.tickets

    def __bool__(self) -> bool:
        return bool(self.tickets)


class Source:
    """What one client address holds: its connections, those of them waiting for it, and
    its share of the body slots."""

    def __init__(self, bodies: int) -> None:
        self.connections = 0  # not counting those closed to make room, still closing
        self.waiting = _Waiting()
        self.bodies = trio.Semaphore(bodies)


class Ticket:
    """One admitted connection. `scope` is what ends it when it must give way."""

    __slots__ = ("admission", "evicted", "scope", "session", "source")

    def __init__(self, admission: Admission, source: str) -> None:
        self.admission = admission
        self.source = source
        self.scope = trio.CancelScope()
        self.evicted = False
        self.session = False  # holds a session slot

    def working(self) -> None:
        """Its request is complete: not to be closed while its handler runs."""
        self.admission._unlist(self)

    def waiting(self) -> None:
        """Its answer is ready: it waits for its client (to read the answer, then to send
        its next request), as the youngest."""
        self.admission._list(self)


class Admission:
    """Counts connections by client address and picks the one that gives way at a cap.

    `cap` is the server's (its fds, counted by the caller's semaphore), `per_source` one
    address's, `sessions` bounds connections holding costly per-connection state (TLS: an
    SSL object and its buffers), None for no such bound."""

    def __init__(self, cap: int, per_source: int, sessions: int | None,
                 bodies_per_source: int) -> None:
        self.cap = cap
        self.per_source = per_source
        self.bodies_per_source = bodies_per_source
        self.sources: dict[str, Source] = {}
        self.waiting = _Waiting()
        self.sessions = trio.Semaphore(sessions) if sessions else None
        self.waiting_sessions = _Waiting()
        self.evicted = 0  # connections closed to make room, since the start

    def admit(self, source: str) -> Ticket | None:
        """A ticket for a new connection from `source`: at the address's cap, its oldest
        waiting connection gives way; None when none of them waits (all are being
        answered: the new one is refused)."""
        held = self.sources.get(source)
        if held is None:
            held = self.sources[source] = Source(self.bodies_per_source)
        if held.connections >= self.per_source:
            victim = held.waiting.oldest()
            if victim is None:
                return None
            self.evict(victim)
        ticket = Ticket(self, source)
        held.connections += 1
        self._list(ticket)
        return ticket

    def make_room(self) -> bool:
        """At the server's cap with a connection knocking: the oldest waiting connection
        gives way. False when none waits (all are being answered)."""
        victim = self.waiting.oldest()
        if victim is None:
            return False
        self.evict(victim)
        return True

    async def start_session(self, ticket: Ticket) -> None:
        """Take a session slot for `ticket` (whose client has spoken), the oldest waiting
        session giving way when none is free."""
        if self.sessions is None:
            return
        if self.sessions.value == 0:
            victim = self.waiting_sessions.oldest()
            if victim is not None:
                self.evict(victim)
        await self.sessions.acquire()
        ticket.session = True
        if ticket in self.waiting:
            self.waiting_sessions.add(ticket)

    def evict(self, ticket: Ticket) -> None:
        """Close `ticket`'s connection at once (its task ends it and calls leave())."""
        self._unlist(ticket)
        ticket.evicted = True
        ticket.scope.cancel()
        self.evicted += 1
        self.sources[ticket.source].connections -= 1

    def leave(self, ticket: Ticket) -> None:
        """The connection's fd is closed."""
        self._unlist(ticket)
        if ticket.session and self.sessions is not None:
            ticket.session = False
            self.sessions.release()
        held = self.sources.get(ticket.source)
        if held is None:
            return
        if not ticket.evicted:
            held.connections -= 1
        if held.connections == 0 and not held.waiting:
            del self.sources[ticket.source]

    def _list(self, ticket: Ticket) -> None:
        if ticket.evicted:
            return
        self._unlist(ticket)
        self.waiting.add(ticket)
        self.sources[ticket.source].waiting.add(ticket)
        if ticket.session:
            self.waiting_sessions.add(ticket)

    def _unlist(self, ticket: Ticket) -> None:
        self.waiting.discard(ticket)
        self.waiting_sessions.discard(ticket)
        held = self.sources.get(ticket.source)
        if held is not None:
            held.waiting.discard(ticket)


class BodySlots:
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
