"""The keeper protocol: fhmon <-> `fhmon keeper`, which holds listener copies across
fhmon restarts (for listeners whose runtime kept no copy, as runc does).

Frames are a u32 big-endian length followed by a JSON object; a frame may carry one fd
(SCM_RIGHTS, sent with its first byte). Sans-IO: encode and an incremental decoder.

    fhmon -> keeper  {"op": "deposit", "target": {...}}  + listener fd
    fhmon -> keeper  {"op": "withdraw"}
    keeper -> fhmon  {"op": "listener", "target": {...}} + fd   (one per held listener)
    keeper -> fhmon  {"op": "end", "count": N}
"""

from __future__ import annotations

import json
import struct
from typing import Any, Final

MAX_FRAME: Final = 16 * 1024
_LEN = struct.Struct(">I")


class KeeperProtocolError(Exception):
    pass


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise ValueError("keeper frame too large")
    return _LEN.pack(len(body)) + body


class Decoder:
    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_message(self) -> dict[str, Any] | None:
        if len(self._buffer) < 4:
            return None
        (length,) = _LEN.unpack_from(self._buffer)
        if length > MAX_FRAME:
            raise KeeperProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
        if len(self._buffer) < 4 + length:
            return None
        body = bytes(self._buffer[4 : 4 + length])
        del self._buffer[: 4 + length]
        try:
            message = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise KeeperProtocolError(f"frame is not JSON: {exc}") from None
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            raise KeeperProtocolError("frame is not an object with an op")
        return message
