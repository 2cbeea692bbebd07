"""fhmon's intake wire protocol (the "native" registration convention, used by `fhmon
launch`; not the native data plane), defined with construct.

Every message is one frame:

    magic "FHMN" | version u16 | kind u16 | length u32 | payload[length]     (big endian)

The client speaks first. See docs/protocol.md for the exchange; this module is sans-IO: it
turns bytes into messages and messages into bytes and keeps a tiny decoder state.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import construct as cs

MAGIC: Final = b"FHMN"
PROTOCOL_VERSION: Final = 1
SUPPORTED_VERSIONS: Final = frozenset({1})
MAX_PAYLOAD: Final = 16 * 1024
HEADER_SIZE: Final = 12


class Kind(enum.IntEnum):
    HELLO = 1  # client -> server, carries the listener fd, and the target's pidfd (SCM_RIGHTS)
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
# TARGET_PIDFD: SCM_RIGHTS carries [listener, pidfd of the target]; fhmon identifies the
# target by the pidfd (whatever pid namespace the client is in), and target_pid is only the
# pid as the client sees it (0: not given), checked against the pidfd's.
HELLO_EXPECT_SHARE: Final = 0x1
HELLO_TARGET_PIDFD: Final = 0x2
HELLO_KNOWN_FLAGS: Final = HELLO_EXPECT_SHARE | HELLO_TARGET_PIDFD

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
StatusPayload = cs.Struct("after" / cs.Int64ub)


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


def hello_fd_count(flags: int) -> int:
    """How many fds (SCM_RIGHTS) a HELLO with these flags carries, in this order: the
    listener, then the target's pidfd if flags has HELLO_TARGET_PIDFD."""
    return 2 if flags & HELLO_TARGET_PIDFD else 1


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
    """after: the page of targets whose ids are greater (0: the first page). The first
    request has no payload, as before paging, so that any fhmon answers it."""

    after: int = 0


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
            return _frame(Kind.STATUS, StatusPayload.build({"after": message.after})
                          if message.after else b"")
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
            case Kind.STATUS if len(payload) == StatusPayload.sizeof():
                return StatusRequest(StatusPayload.parse(payload).after)
            case Kind.PING | Kind.STATUS:
                if payload:
                    raise ProtocolError("this message has no payload" if kind == Kind.PING
                                        else "STATUS carries no payload or a u64 target id")
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


# --- STATUS in pages -----------------------------------------------------------------------
# One STATUS_REPLY carries the summary (counters, keys, ...) and as many targets, in id order,
# as fit in one frame; "next" is the id to ask after (STATUS with that u64), or null on the
# last page; "total_targets" counts them all. Paging by id is stable while targets come and
# go: each appears at most once; one that leaves meanwhile may be missing.

TRUNCATED: Final = "...(truncated)"


def status_page(summary: dict[str, Any], targets: Sequence[dict[str, Any]], after: int,
                total: int | None = None, budget: int = MAX_PAYLOAD - 4) -> StatusReply:
    """The reply to StatusRequest(after): `targets` (each with an int "id", sorted by it)
    past `after`, as many as fit in `budget` bytes of JSON with the summary. total: how
    many targets there are in all (default: len(targets))."""
    page: list[str] = []
    total = len(targets) if total is None else total
    used = len(_status_json(summary, [], total, 2**63))
    if used > budget:
        raise ValueError(f"the status summary alone takes {used} bytes, over {budget}")
    last = after
    for target in targets:
        if target["id"] <= after:
            continue
        text = json.dumps(target)
        if used + len(text) + 2 > budget:
            if page:
                return StatusReply(_status_json(summary, page, total, last))
            text = _shrunk(target, budget - used - 2)
        page.append(text)
        used += len(text) + 2
        last = target["id"]
    return StatusReply(_status_json(summary, page, total, None))


def _status_json(summary: dict[str, Any], page: list[str], total: int,
                 next_id: int | None) -> str:
    head = json.dumps({**summary, "total_targets": total, "next": next_id})
    return f'{head[:-1]}, "targets": [{", ".join(page)}]}}'


def _shrunk(target: dict[str, Any], room: int) -> str:
    """One target too large for a page on its own: its longest strings cut until it fits."""
    shrunk = dict(target)
    while len(text := json.dumps(shrunk)) > room:
        key = max((k for k, v in shrunk.items() if isinstance(v, str)),
                  key=lambda k: len(json.dumps(shrunk[k])), default=None)
        if key is None or shrunk[key] == TRUNCATED:
            raise ValueError(f"a target of {len(text)} bytes cannot fit in {room}")
        value = shrunk[key]
        shrunk[key] = value[: max(0, len(value) // 2 - len(TRUNCATED))] + TRUNCATED
    return text


class StatusPages:
    """The client's side of a paged STATUS: feed each reply; `request` is what to send
    next (None when the last page arrived), `status` the merged answer."""

    def __init__(self, max_pages: int = 1 << 20) -> None:
        self.request: StatusRequest | None = StatusRequest()
        self._targets: list[Any] = []
        self._summary: dict[str, Any] = {}
        self._pages_left = max_pages

    def feed(self, reply: Message) -> None:
        if self.request is None:
            raise ProtocolError("a STATUS_REPLY nobody asked for")
        if not isinstance(reply, StatusReply):
            raise ProtocolError(f"expected STATUS_REPLY, got {type(reply).__name__}")
        try:
            page = json.loads(reply.json)
        except ValueError as exc:
            raise ProtocolError(f"STATUS_REPLY is not JSON: {exc}") from None
        if not isinstance(page, dict) or not isinstance(page.get("targets", []), list):
            raise ProtocolError("STATUS_REPLY is not a status object")
        self._targets += page.pop("targets", [])
        next_id = page.pop("next", None)
        self._summary = page
        self._pages_left -= 1
        if next_id is None:
            self.request = None
        elif (not isinstance(next_id, int) or next_id <= self.request.after
              or self._pages_left <= 0):
            raise ProtocolError(f"STATUS_REPLY pages do not progress (next {next_id!r} "
                                f"after {self.request.after})")
        else:
            self.request = StatusRequest(next_id)

    @property
    def status(self) -> dict[str, Any]:
        """Every target received, under the summary of the last page."""
        if self.request is not None:
            raise ProtocolError("the status is not complete yet")
        return {**self._summary, "targets": self._targets}
