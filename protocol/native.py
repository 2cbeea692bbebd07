"""fhmon's native intake protocol (used by `fhmon launch`), defined with construct.

Every message is one frame:

    magic "FHMN" | version u16 | kind u16 | length u32 | payload[length]     (big endian)

The client speaks first. See docs/protocol.md for the exchange; this module is sans-IO: it
turns bytes into messages and messages into bytes and keeps a tiny decoder state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

import construct as cs

MAGIC: Final = b"FHMN"
PROTOCOL_VERSION: Final = 1
SUPPORTED_VERSIONS: Final = frozenset({1})
MAX_PAYLOAD: Final = 16 * 1024
HEADER_SIZE: Final = 12


class Kind(enum.IntEnum):
    HELLO = 1  # client -> server, carries the listener fd (SCM_RIGHTS)
    ACCEPT = 2  # server -> client
    REFUSE = 3  # server -> client
    PING = 4  # client -> server: liveness probe
    PONG = 5  # server -> client: health as JSON
    STATUS = 6  # client -> server: ask for registered targets
    STATUS_REPLY = 7  # server -> client: targets as JSON


Header = cs.Struct(
    "magic" / cs.Const(MAGIC),
    "version" / cs.Int16ub,
    "kind" / cs.Int16ub,
    "length" / cs.Int32ub,
)

_Text = cs.PascalString(cs.Int16ub, "utf8")

# HELLO flags. EXPECT_SHARE: a re-registration (after an fhmon restart) that names the
# share id the first ACCEPT gave; fhmon accepts it only onto that same share.
HELLO_EXPECT_SHARE: Final = 0x1
HELLO_KNOWN_FLAGS: Final = HELLO_EXPECT_SHARE

HelloPayload = cs.Struct(
    "target_pid" / cs.Int32ub,
    "flags" / cs.Int32ub,
    "share" / _Text,
    "client" / _Text,
    "share_id" / cs.If(cs.this.flags & HELLO_EXPECT_SHARE, cs.Bytes(32)),
)
AcceptPayload = cs.Struct(
    "target_id" / cs.Int64ub,
    "share_id" / cs.Bytes(32),
    "message" / _Text,
)
RefusePayload = cs.Struct(
    "errno" / cs.Int32ub,
    "reason" / _Text,
)
JsonPayload = cs.Struct("json" / cs.PascalString(cs.Int32ub, "utf8"))


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; the message says what."""


@dataclass(frozen=True, slots=True)
class Hello:
    target_pid: int
    share: str
    client: str = ""
    flags: int = 0
    version: int = PROTOCOL_VERSION
    share_id: bytes | None = None  # present exactly when flags has HELLO_EXPECT_SHARE


@dataclass(frozen=True, slots=True)
class Accept:
    target_id: int
    share_id: bytes
    message: str


@dataclass(frozen=True, slots=True)
class Refuse:
    errno: int
    reason: str


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Pong:
    json: str


@dataclass(frozen=True, slots=True)
class StatusRequest:
    pass


@dataclass(frozen=True, slots=True)
class StatusReply:
    json: str


Message = Hello | Accept | Refuse | Ping | Pong | StatusRequest | StatusReply


def _frame(kind: Kind, payload: bytes, version: int = PROTOCOL_VERSION) -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    header: bytes = Header.build({"version": version, "kind": int(kind), "length": len(payload)})
    return header + payload


def encode(message: Message) -> bytes:
    match message:
        case Hello():
            flags = message.flags
            if message.share_id is not None:
                flags |= HELLO_EXPECT_SHARE
            elif flags & HELLO_EXPECT_SHARE:
                raise ValueError("HELLO_EXPECT_SHARE needs a share_id")
            payload = HelloPayload.build({"target_pid": message.target_pid,
                                          "flags": flags, "share": message.share,
                                          "client": message.client,
                                          "share_id": message.share_id})
            return _frame(Kind.HELLO, payload, message.version)
        case Accept():
            return _frame(Kind.ACCEPT, AcceptPayload.build(
                {"target_id": message.target_id, "share_id": message.share_id,
                 "message": message.message}))
        case Refuse():
            return _frame(Kind.REFUSE, RefusePayload.build(
                {"errno": message.errno, "reason": message.reason[:4000]}))
        case Ping():
            return _frame(Kind.PING, b"")
        case Pong():
            return _frame(Kind.PONG, JsonPayload.build({"json": message.json}))
        case StatusRequest():
            return _frame(Kind.STATUS, b"")
        case StatusReply():
            return _frame(Kind.STATUS_REPLY, JsonPayload.build({"json": message.json}))
    raise TypeError(f"not a message: {message!r}")


def _decode_payload(version: int, kind: int, payload: bytes) -> Message:
    try:
        match kind:
            case Kind.HELLO:
                h = HelloPayload.parse(payload)
                _reject_trailing(HelloPayload, h, payload)
                return Hello(h.target_pid, h.share, h.client, h.flags, version, h.share_id)
            case Kind.ACCEPT:
                a = AcceptPayload.parse(payload)
                _reject_trailing(AcceptPayload, a, payload)
                return Accept(a.target_id, a.share_id, a.message)
            case Kind.REFUSE:
                r = RefusePayload.parse(payload)
                _reject_trailing(RefusePayload, r, payload)
                return Refuse(r.errno, r.reason)
            case Kind.PING | Kind.STATUS:
                if payload:
                    raise ProtocolError("this message has no payload")
                return Ping() if kind == Kind.PING else StatusRequest()
            case Kind.PONG | Kind.STATUS_REPLY:
                j = JsonPayload.parse(payload)
                _reject_trailing(JsonPayload, j, payload)
                return Pong(j.json) if kind == Kind.PONG else StatusReply(j.json)
    except (cs.ConstructError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed {_kind_name(kind)} payload: {exc}") from None
    raise ProtocolError(f"unknown message kind {kind}")


def _reject_trailing(struct: cs.Construct, parsed: cs.Container, payload: bytes) -> None:
    if len(struct.build(parsed)) != len(payload):
        raise ProtocolError("trailing bytes after the payload")


def _kind_name(kind: int) -> str:
    try:
        return Kind(kind).name
    except ValueError:
        return f"kind {kind}"


class FrameDecoder:
    """Accumulates bytes and returns whole messages, refusing bad frames as early as possible."""

    def __init__(self, max_payload: int = MAX_PAYLOAD) -> None:
        self._buffer = bytearray()
        self._max_payload = max_payload

    def feed(self, data: bytes) -> None:
        self._buffer += data
        self._check_header()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def _check_header(self) -> None:
        head = bytes(self._buffer[: len(MAGIC)])
        if head != MAGIC[: len(head)]:
            raise ProtocolError("not an fhmon frame (bad magic)")
        if len(self._buffer) >= HEADER_SIZE:
            header = Header.parse(bytes(self._buffer[:HEADER_SIZE]))
            if header.version not in SUPPORTED_VERSIONS:
                raise ProtocolError(
                    f"unsupported protocol version {header.version}; this fhmon speaks "
                    f"{sorted(SUPPORTED_VERSIONS)}")
            if header.length > self._max_payload:
                raise ProtocolError(
                    f"message of {header.length} bytes exceeds the limit of {self._max_payload}")

    def next_message(self) -> Message | None:
        """One complete message, or None if more bytes are needed."""
        if len(self._buffer) < HEADER_SIZE:
            return None
        header = Header.parse(bytes(self._buffer[:HEADER_SIZE]))
        end = HEADER_SIZE + header.length
        if len(self._buffer) < end:
            return None
        payload = bytes(self._buffer[HEADER_SIZE:end])
        del self._buffer[:end]
        message = _decode_payload(header.version, header.kind, payload)
        if self._buffer:
            self._check_header()
        return message


def decode_one(data: bytes) -> Message:
    """Decode exactly one whole frame (used by tests and simple clients)."""
    decoder = FrameDecoder()
    decoder.feed(data)
    message = decoder.next_message()
    if message is None:
        raise ProtocolError("truncated frame")
    if decoder.buffered:
        raise ProtocolError("bytes after the frame")
    return message


def looks_native(first_bytes: bytes) -> bool:
    """Intake sniffing: native frames start with the magic, OCI states with JSON."""
    return first_bytes[:1] == MAGIC[:1]
