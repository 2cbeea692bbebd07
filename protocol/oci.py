"""The OCI runtime-spec seccomp listenerPath message (ContainerProcessState), sans-IO.

runc sends compact JSON and closes; crun sends pretty-printed JSON (ociVersion "0.2.0") and
may keep the connection open, so the parser works on a growing buffer and answers as soon as
one whole JSON value is there, without waiting for EOF.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

MAX_STATE_SIZE: Final = 64 * 1024
SECCOMP_FD_NAME: Final = "seccompFd"


class OciStateError(Exception):
    """The runtime's message is not a usable ContainerProcessState; the text says why."""


@dataclass(frozen=True, slots=True)
class ContainerProcessState:
    oci_version: str
    fds: tuple[str, ...]
    pid: int
    metadata: str
    container_id: str = ""
    bundle: str = ""
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def seccomp_fd_index(self) -> int:
        return self.fds.index(SECCOMP_FD_NAME)


def parse_listener_metadata(metadata: str) -> dict[str, str]:
    """`key=value` entries separated by ';' or newlines; later keys do not override earlier."""
    entries: dict[str, str] = {}
    for raw in metadata.replace("\r", "\n").replace(";", "\n").split("\n"):
        entry = raw.strip()
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise OciStateError(f"listenerMetadata entry {entry!r} is not key=value")
        key = key.strip()
        if key in entries:
            raise OciStateError(f"listenerMetadata has {key!r} twice")
        entries[key] = value.strip()
    return entries


def try_parse(buffer: bytes) -> ContainerProcessState | None:
    """Parse the first JSON value in `buffer`; None if it is not complete yet."""
    if len(buffer) > MAX_STATE_SIZE:
        raise OciStateError(f"state message exceeds {MAX_STATE_SIZE} bytes")
    try:
        text = buffer.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data" and exc.end == len(buffer):
            return None
        raise OciStateError("state message is not UTF-8") from None
    stripped = text.lstrip()
    if not stripped:
        return None
    if not stripped.startswith("{"):
        raise OciStateError("state message is not a JSON object")
    try:
        value, end = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError as exc:
        if _incomplete(stripped, exc):
            return None
        raise OciStateError(f"state message is not valid JSON: {exc.msg} at {exc.pos}") from None
    except (RecursionError, ValueError) as exc:  # absurd nesting, huge integers
        raise OciStateError(f"state message is not acceptable JSON: {exc}") from None
    if stripped[end:].strip():
        raise OciStateError("bytes after the state message")
    return validate(value)


class StateReader:
    """One connection's state message, from the chunks it arrives in.

    `try_parse` decodes its whole buffer; called on every chunk, a client that sends 60 KB
    and then a byte at a time made every byte cost a 60 KB parse (issue 37.2). The reader
    parses only when the message may have become whole, or be refusable by now: on the
    first chunk, when the buffer ends in `}` (a JSON object can end nowhere else, and
    nothing but whitespace may follow it), and when the buffer has doubled since its last
    parse (a malformed message is still refused soon after its bad bytes arrive). A client
    can still make every chunk end in `}`; `parse_cost` says what the parse about to be
    made costs, so that the intake charges it to that client's pace before it is made.
    Following the JSON's nesting byte by byte instead would cost ~30x a parse in Python."""

    __slots__ = ("_buffer", "_last", "_parsed_at", "parses")

    PARSE_UNIT = 8 * 1024  # bytes parsed per unit of parse_cost

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._last = 0  # the buffer's last byte that is not JSON whitespace
        self._parsed_at = -1  # buffer length at the last parse
        self.parses = 0  # how many times the buffer was parsed

    def __len__(self) -> int:
        return len(self._buffer)

    def add(self, data: bytes) -> int:
        """Take a chunk; the cost of the parse it calls for (0: none yet), in PARSE_UNITs.
        OciStateError when the message grows past MAX_STATE_SIZE."""
        self._buffer += data
        length = len(self._buffer)
        if length > MAX_STATE_SIZE:
            raise OciStateError(f"state message exceeds {MAX_STATE_SIZE} bytes")
        if significant := data.rstrip(b" \t\r\n"):
            self._last = significant[-1]
        if self._parsed_at < 0 or self._last == 0x7D or length >= 2 * self._parsed_at:
            return 1 + length // self.PARSE_UNIT
        return 0

    def parse(self) -> ContainerProcessState | None:
        """The state, once whole; None while more bytes may complete it. OciStateError
        when it cannot become one (not UTF-8, not JSON, not a valid state)."""
        self._parsed_at = len(self._buffer)
        self.parses += 1
        return try_parse(bytes(self._buffer))

    def feed(self, data: bytes) -> ContainerProcessState | None:
        """add, then parse if called for: for callers that need not pace the parse."""
        return self.parse() if self.add(data) else None

    def finish(self) -> OciStateError:
        """Why the message is refused when its connection ends before it is whole: its
        own error where its bytes already show one, otherwise that it was cut short."""
        try:
            self.parse()
        except OciStateError as exc:
            return exc
        return OciStateError("connection closed before a whole state message arrived")


def _incomplete(text: str, exc: json.JSONDecodeError) -> bool:
    """A decode error within the last token of the text means more bytes may still come.

    A truly malformed message that errs near its end waits for more bytes; EOF or the
    intake timeout then refuses it.
    """
    end = len(text.rstrip())
    if exc.pos >= end or exc.msg.startswith("Unterminated string"):
        return True
    rest = text[exc.pos : end]
    if exc.msg == "Expecting value":  # a literal or a sign cut short: "nu", "tr", "-"
        return rest == "-" or any(word.startswith(rest) for word in ("null", "true", "false"))
    if exc.msg.startswith("Invalid \\uXXXX escape"):
        # the error points at the "u" of a "\\u" with fewer than four hex digits after it
        return (rest.startswith("u") and len(rest) < 5
                and all(c in "0123456789abcdefABCDEF" for c in rest[1:]))
    return False


def validate(value: Any) -> ContainerProcessState:
    if not isinstance(value, dict):
        raise OciStateError("state message is not a JSON object")
    oci_version = value.get("ociVersion")
    if not isinstance(oci_version, str) or not oci_version:
        raise OciStateError("ociVersion missing or not a string")
    fds = value.get("fds")
    if not isinstance(fds, list) or not all(isinstance(f, str) for f in fds):
        raise OciStateError("fds missing or not a list of strings")
    if fds.count(SECCOMP_FD_NAME) != 1:
        raise OciStateError(f"fds must name {SECCOMP_FD_NAME!r} exactly once, got {fds}")
    pid = value.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid > 2**22:
        raise OciStateError("pid missing or not a positive integer")
    metadata = value.get("metadata", "")
    if not isinstance(metadata, str):
        raise OciStateError("metadata is not a string")
    state = value.get("state", {})
    if not isinstance(state, dict):
        raise OciStateError("state is not an object")
    container_id = state.get("id", "")
    bundle = state.get("bundle", "")
    annotations = state.get("annotations") or {}
    if not isinstance(container_id, str) or not isinstance(bundle, str):
        raise OciStateError("state.id and state.bundle must be strings")
    if not isinstance(annotations, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
        raise OciStateError("state.annotations must map strings to strings")
    state_pid = state.get("pid", pid)
    if state_pid != pid and state_pid not in (0, None):
        raise OciStateError("state.pid disagrees with pid")
    return ContainerProcessState(oci_version, tuple(fds), pid, metadata, container_id, bundle,
                                 dict(annotations))


def share_from_metadata(metadata: str) -> str:
    entries = parse_listener_metadata(metadata)
    share = entries.get("share")
    if not share:
        raise OciStateError("listenerMetadata has no share=/path entry")
    if not share.startswith("/"):
        raise OciStateError(f"share {share!r} must be an absolute path")
    return share
