"""What connections hold while they are served: each client address's count and its share
of the body slots."""

from __future__ import annotations

from dataclasses import dataclass

import trio


@dataclass
class Source:
    """What one client address holds: its connections and its share of the body slots."""

    connections: int
    bodies: trio.Semaphore


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

