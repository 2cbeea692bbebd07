"""The first TLS record of a connection, read before any TLS state is made for it.

An SSL object and its buffers cost far more than a socket; a client that sends nothing, or a
few bytes of a ClientHello and then stalls, must not get one. So the record that carries
the ClientHello is read whole first (its length is in its 5-byte header), as plain bytes,
and then replayed to the TLS layer ahead of the rest of the stream.
"""

from __future__ import annotations

import trio

from monitor.http.connection import PACE, SMALL_READ

RECORD_HEADER = 5
MAX_RECORD = 16384 + 2048  # TLSPlaintext at most 2^14 bytes (RFC 8446 5.1), with slack


async def first_record(stream: trio.SocketStream) -> bytes:
    """The connection's first bytes, up to the end of its first TLS record at least (or
    whatever arrived, when they cannot be one: the TLS layer then refuses them); b"" when
    the client closed before a byte."""
    data = bytearray()
    need = RECORD_HEADER
    short_reads = 0
    while len(data) < need:
        if short_reads >= 2:  # trickled: read it at most every PACE (as requests are)
            await trio.sleep(PACE)
        chunk = await stream.receive_some(RECORD_HEADER + MAX_RECORD)  # the rest: replayed
        if not chunk:
            break
        data += chunk
        short_reads = short_reads + 1 if len(chunk) < SMALL_READ else 0
        if len(data) >= RECORD_HEADER and need == RECORD_HEADER:
            if data[0] != 0x16:  # not a handshake record: let the TLS layer say so
                break
            length = int.from_bytes(data[3:5], "big")
            need = RECORD_HEADER + min(length, MAX_RECORD)
    return bytes(data)


class Replayed(trio.abc.Stream):
    """`stream`, whose first received bytes are `prefix` (read from it before)."""

    def __init__(self, stream: trio.SocketStream, prefix: bytes) -> None:
        self.stream = stream
        self.prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.prefix:
            await trio.lowlevel.checkpoint()
            size = len(self.prefix) if max_bytes is None else max_bytes
            out, self.prefix = self.prefix[:size], self.prefix[size:]
            return out
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()
