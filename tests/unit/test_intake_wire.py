"""protocol.intake_wire: the framed intake protocol (`fhmon launch`), as a sans-IO encoder and
incremental decoder."""

from __future__ import annotations

import contextlib
import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import intake_wire
from protocol.intake_wire import (
    HEADER_SIZE,
    HELLO_EXPECT_SHARE,
    MAGIC,
    MAX_PAYLOAD,
    Accept,
    FrameDecoder,
    Hello,
    Kind,
    Message,
    Ping,
    Pong,
    ProtocolError,
    Refuse,
    StatusPages,
    StatusReply,
    StatusRequest,
    decode_one,
    encode,
)

FAST = settings(max_examples=300, deadline=None)
FEWER = settings(max_examples=150, deadline=None)

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)


def _texts(max_size: int) -> st.SearchStrategy[str]:
    # Any code point but surrogates (which UTF-8 cannot carry): ASCII, accents, CJK, emoji, NUL.
    return st.text(st.characters(exclude_categories=["Cs"]), max_size=max_size)


def _messages(max_text: int) -> st.SearchStrategy[Message]:
    return st.one_of(
        st.builds(Hello, target_pid=U32, share=_texts(max_text), client=_texts(max_text),
                  flags=U32.map(lambda f: f & ~HELLO_EXPECT_SHARE)),
        st.builds(Hello, target_pid=U32, share=_texts(max_text), client=_texts(max_text),
                  flags=U32.map(lambda f: f | HELLO_EXPECT_SHARE),
                  share_id=st.binary(min_size=32, max_size=32)),
        st.builds(Accept, target_id=U64, share_id=st.binary(min_size=32, max_size=32),
                  message=_texts(max_text)),
        st.builds(Refuse, errno=U32, reason=_texts(min(max_text, 4000))),
        st.just(Ping()),
        st.builds(Pong, json=_texts(max_text)),
        st.just(StatusRequest()),
        st.builds(StatusRequest, after=U64),
        st.builds(StatusReply, json=_texts(max_text)),
    )


MESSAGES = _messages(2000)  # always within MAX_PAYLOAD even at 4 bytes a character
SMALL_MESSAGES = _messages(40)


def _frame(version: int, kind: int, payload: bytes, length: int | None = None) -> bytes:
    """A frame built by hand, independently of the module's construct definitions."""
    size = len(payload) if length is None else length
    return MAGIC + struct.pack(">HHI", version, kind, size) + payload


def _text(value: str, prefix: str = ">H") -> bytes:
    raw = value.encode()
    return struct.pack(prefix, len(raw)) + raw


def _drain(decoder: FrameDecoder) -> list[Message]:
    out = []
    while (message := decoder.next_message()) is not None:
        out.append(message)
    return out


# --- constants and exact layouts ------------------------------------------------------------


def test_constants() -> None:
    assert MAGIC == b"FHMN"
    assert HEADER_SIZE == 12
    assert MAX_PAYLOAD == 16384
    assert intake_wire.PROTOCOL_VERSION == 1
    assert sorted(intake_wire.SUPPORTED_VERSIONS) == [1]
    assert [(k.name, k.value) for k in Kind] == [
        ("HELLO", 1), ("ACCEPT", 2), ("REFUSE", 3), ("PING", 4), ("PONG", 5), ("STATUS", 6),
        ("STATUS_REPLY", 7)]


def test_ping_and_status_bytes() -> None:
    assert encode(Ping()) == b"FHMN\x00\x01\x00\x04\x00\x00\x00\x00"
    assert encode(StatusRequest()) == b"FHMN\x00\x01\x00\x06\x00\x00\x00\x00"


def test_hello_bytes() -> None:
    raw = encode(Hello(target_pid=0x01020304, share="/srv/é", client="fhmon-launch",
                       flags=0x0A0B0C0C))
    payload = (b"\x01\x02\x03\x04" + b"\x0a\x0b\x0c\x0c" + b"\x00\x07/srv/\xc3\xa9"
               + b"\x00\x0cfhmon-launch")
    assert raw == b"FHMN\x00\x01\x00\x01" + struct.pack(">I", len(payload)) + payload
    assert raw == _frame(1, 1, struct.pack(">II", 0x01020304, 0x0A0B0C0C) + _text("/srv/é")
                         + _text("fhmon-launch"))


def test_hello_with_an_expected_share_bytes() -> None:
    share_id = bytes(range(32))
    raw = encode(Hello(target_pid=1, share="/s", client="c", share_id=share_id))
    assert raw == _frame(1, 1, struct.pack(">II", 1, HELLO_EXPECT_SHARE) + _text("/s")
                         + _text("c") + share_id)
    assert decode_one(raw) == Hello(1, "/s", "c", HELLO_EXPECT_SHARE, share_id=share_id)
    with pytest.raises(ValueError):
        encode(Hello(1, "/s", flags=HELLO_EXPECT_SHARE))
    # the flag without its 32 bytes, or with fewer: malformed
    for cut in (32, 1):
        with pytest.raises(ProtocolError):
            decode_one(_frame(1, 1, (raw[HEADER_SIZE:])[:-cut]))


def test_hello_with_the_targets_pidfd_bytes_and_fd_count() -> None:
    """TARGET_PIDFD (0x2) adds no payload: it says SCM_RIGHTS carries a second fd, the
    target's pidfd, after the listener; it combines with EXPECT_SHARE."""
    assert intake_wire.HELLO_TARGET_PIDFD == 0x2
    assert intake_wire.HELLO_KNOWN_FLAGS == HELLO_EXPECT_SHARE | intake_wire.HELLO_TARGET_PIDFD
    raw = encode(Hello(target_pid=2, share="/s", client="c", flags=intake_wire.HELLO_TARGET_PIDFD))
    assert raw == _frame(1, 1, struct.pack(">II", 2, 0x2) + _text("/s") + _text("c"))
    assert decode_one(raw) == Hello(2, "/s", "c", intake_wire.HELLO_TARGET_PIDFD)
    both = encode(Hello(2, "/s", "c", intake_wire.HELLO_TARGET_PIDFD, share_id=bytes(32)))
    assert decode_one(both) == Hello(2, "/s", "c", 0x3, share_id=bytes(32))
    assert [intake_wire.hello_fd_count(f) for f in (0, 1, 2, 3, 0xFFFFFFFD, 0xFFFFFFFF)] == [
        1, 1, 2, 2, 1, 2]


def test_accept_bytes() -> None:
    share_id = bytes(range(32))
    raw = encode(Accept(target_id=2**64 - 1, share_id=share_id, message="ok"))
    assert raw == _frame(1, 2, b"\xff" * 8 + share_id + b"\x00\x02ok")


def test_refuse_bytes() -> None:
    raw = encode(Refuse(errno=13, reason="denied"))
    assert raw == _frame(1, 3, b"\x00\x00\x00\x0d" + b"\x00\x06denied")


@pytest.mark.parametrize(("cls", "kind"), [(Pong, 5), (StatusReply, 7)])
def test_json_bytes(cls: type[Pong] | type[StatusReply], kind: int) -> None:
    raw = encode(cls(json='{"ok": true}'))
    assert raw == _frame(1, kind, b"\x00\x00\x00\x0c" + b'{"ok": true}')


def test_encode_refuses_non_messages() -> None:
    with pytest.raises(TypeError, match="not a message"):
        encode("hello")  # type: ignore[arg-type]


def test_looks_native() -> None:
    assert intake_wire.looks_native(b"FHMN\x00\x01")
    assert intake_wire.looks_native(b"F")
    assert not intake_wire.looks_native(b"{")
    assert not intake_wire.looks_native(b' {"ociVersion"')
    assert not intake_wire.looks_native(b"\n")
    assert not intake_wire.looks_native(b"")


# --- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("message", [
    Hello(1, "/"), Hello(2**32 - 1, "", "", 2**32 - 1, share_id=b"\xab" * 32),
    Hello(7, "/srv/\u00e9\u4e2d\U0001F600", "c\x00lient", 3, share_id=bytes(32)),
    Hello(7, "/srv", "", 2**32 - 2),
    Accept(0, bytes(32), ""), Accept(2**64 - 1, b"\xff" * 32, "\U0010FFFF"),
    Refuse(0, ""), Refuse(2**32 - 1, "x" * 4000),
    Ping(), StatusRequest(), Pong(""), Pong("{}"), StatusReply('{"targets": []}'),
], ids=repr)
def test_round_trip_examples(message: Message) -> None:
    assert decode_one(encode(message)) == message


@FAST
@given(message=MESSAGES)
def test_round_trip(message: Message) -> None:
    raw = encode(message)
    assert len(raw) <= HEADER_SIZE + MAX_PAYLOAD
    assert raw[:4] == MAGIC
    assert struct.unpack(">I", raw[8:12])[0] == len(raw) - HEADER_SIZE
    assert decode_one(raw) == message


@FEWER
@given(messages=st.lists(SMALL_MESSAGES, max_size=5))
def test_byte_by_byte_gives_the_same_messages(messages: list[Message]) -> None:
    stream = b"".join(encode(m) for m in messages)
    decoder = FrameDecoder()
    got: list[Message] = []
    for i in range(len(stream)):
        decoder.feed(stream[i: i + 1])
        got.extend(_drain(decoder))
    assert got == messages
    assert decoder.buffered == 0


@FEWER
@given(messages=st.lists(SMALL_MESSAGES, min_size=1, max_size=8), data=st.data())
def test_arbitrary_chunking_gives_the_same_messages(messages: list[Message],
                                                    data: st.DataObject) -> None:
    stream = b"".join(encode(m) for m in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = FrameDecoder()
    got: list[Message] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        decoder.feed(stream[start:cut])
        start = max(start, cut)
        got.extend(_drain(decoder))
    assert got == messages


def test_several_frames_in_one_feed() -> None:
    messages: list[Message] = [Ping(), Hello(5, "/a"), StatusRequest(), Pong("{}"),
                               Refuse(1, "no")]
    decoder = FrameDecoder()
    decoder.feed(b"".join(encode(m) for m in messages))
    assert [decoder.next_message() for _ in messages] == messages
    assert decoder.next_message() is None
    assert decoder.buffered == 0


def test_frame_and_a_half() -> None:
    first, second = encode(Hello(5, "/a")), encode(Pong('{"x": 1}'))
    decoder = FrameDecoder()
    decoder.feed(first + second[:7])
    assert decoder.next_message() == Hello(5, "/a")
    assert decoder.next_message() is None
    assert decoder.buffered == 7
    decoder.feed(second[7:])
    assert decoder.next_message() == Pong('{"x": 1}')
    assert decoder.buffered == 0


def test_empty_feed_is_harmless() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"")
    assert decoder.next_message() is None
    assert decoder.buffered == 0


# --- maximum sizes --------------------------------------------------------------------------


def test_hello_at_max_payload() -> None:
    share = "/" + "a" * (MAX_PAYLOAD - 12 - 1)  # 4 + 4 + 2 + len(share) + 2 = MAX_PAYLOAD
    raw = encode(Hello(1, share))
    assert len(raw) == HEADER_SIZE + MAX_PAYLOAD
    assert decode_one(raw) == Hello(1, share)
    with pytest.raises(ValueError, match=f"exceeds {MAX_PAYLOAD}"):
        encode(Hello(1, share + "a"))


def test_accept_at_max_payload() -> None:
    text = "\u00e9" * ((MAX_PAYLOAD - 8 - 32 - 2) // 2)
    raw = encode(Accept(1, bytes(32), text))
    assert len(raw) == HEADER_SIZE + MAX_PAYLOAD
    assert decode_one(raw) == Accept(1, bytes(32), text)
    with pytest.raises(ValueError, match="exceeds"):
        encode(Accept(1, bytes(32), text + "a"))


@pytest.mark.parametrize("cls", [Pong, StatusReply])
def test_json_at_max_payload(cls: type[Pong] | type[StatusReply]) -> None:
    text = "x" * (MAX_PAYLOAD - 4)
    raw = encode(cls(text))
    assert len(raw) == HEADER_SIZE + MAX_PAYLOAD
    assert decode_one(raw) == cls(text)
    with pytest.raises(ValueError, match="exceeds"):
        encode(cls(text + "y"))


def test_refuse_reason_is_cut_to_4000_characters() -> None:
    reason = "\U0001F600" * 4500  # 4 bytes each: uncut it would not fit
    raw = encode(Refuse(5, reason))
    assert len(raw) == HEADER_SIZE + 4 + 2 + 4000 * 4
    assert decode_one(raw) == Refuse(5, reason[:4000])


def test_decoder_accepts_exactly_max_payload_length() -> None:
    decoder = FrameDecoder()
    decoder.feed(_frame(1, 5, b"", length=MAX_PAYLOAD))
    assert decoder.next_message() is None


# --- refusing bad frames early --------------------------------------------------------------


@pytest.mark.parametrize("position", range(4))
def test_bad_magic_rejected_at_the_first_wrong_byte(position: int) -> None:
    for wrong in range(256):
        if wrong == MAGIC[position]:
            continue
        decoder = FrameDecoder()
        for i in range(position):
            decoder.feed(MAGIC[i: i + 1])  # a correct prefix is fine
        with pytest.raises(ProtocolError, match="bad magic"):
            decoder.feed(bytes([wrong]))


@pytest.mark.parametrize("data", [b"{", b'{"ociVersion": "1.0.2"}', b"GET / HTTP/1.1\r\n",
                                  b"fhmn", b"FHMn", b"\x00" * 12])
def test_bad_magic_in_one_chunk(data: bytes) -> None:
    with pytest.raises(ProtocolError, match="bad magic"):
        FrameDecoder().feed(data)


@pytest.mark.parametrize("version", [0, 2, 3, 0x100, 0xFFFF])
def test_unsupported_version_rejected_when_header_completes(version: int) -> None:
    header = _frame(version, 1, b"", length=5)
    decoder = FrameDecoder()
    for i in range(HEADER_SIZE - 1):
        decoder.feed(header[i: i + 1])
        assert decoder.next_message() is None
    with pytest.raises(ProtocolError, match=f"unsupported protocol version {version}"):
        decoder.feed(header[-1:])


def test_hello_with_future_version_is_refused() -> None:
    raw = encode(Hello(1, "/a", version=2))
    assert raw[4:6] == b"\x00\x02"
    with pytest.raises(ProtocolError, match="unsupported protocol version 2"):
        decode_one(raw)


@pytest.mark.parametrize("length", [MAX_PAYLOAD + 1, 2**20, 2**32 - 1])
def test_oversize_rejected_from_the_header_alone(length: int) -> None:
    header = _frame(1, 5, b"", length=length)
    decoder = FrameDecoder()
    decoder.feed(header[:-1])
    with pytest.raises(ProtocolError, match=f"message of {length} bytes exceeds the limit "
                                            f"of {MAX_PAYLOAD}"):
        decoder.feed(header[-1:])


def test_custom_max_payload() -> None:
    decoder = FrameDecoder(max_payload=10)
    decoder.feed(_frame(1, 5, b"", length=10))
    with pytest.raises(ProtocolError, match="exceeds the limit of 10"):
        FrameDecoder(max_payload=10).feed(_frame(1, 5, b"", length=11))


@FEWER
@given(message=SMALL_MESSAGES)
def test_truncated_payload_returns_none_until_complete(message: Message) -> None:
    raw = encode(message)
    decoder = FrameDecoder()
    for i in range(len(raw) - 1):
        decoder.feed(raw[i: i + 1])
        assert decoder.next_message() is None
        assert decoder.buffered == i + 1
    decoder.feed(raw[-1:])
    assert decoder.next_message() == message
    assert decoder.buffered == 0


def _payloads() -> list[tuple[int, bytes]]:
    return [
        (1, struct.pack(">II", 5, 0) + _text("/srv") + _text("cli")),
        (2, struct.pack(">Q", 9) + bytes(32) + _text("ok")),
        (3, struct.pack(">I", 13) + _text("no")),
        (5, _text("{}", ">I")),
        (7, _text("[]", ">I")),
    ]


@pytest.mark.parametrize(("kind", "payload"), _payloads(), ids=lambda v: str(v)[:12])
@pytest.mark.parametrize("garbage", [b"\x00", b"junk", b"\x00\x00\x00\x00\x00\x00"])
def test_trailing_garbage_inside_a_payload(kind: int, payload: bytes, garbage: bytes) -> None:
    assert decode_one(_frame(1, kind, payload)) is not None  # the clean payload is fine
    with pytest.raises(ProtocolError, match="trailing bytes after the payload"):
        decode_one(_frame(1, kind, payload + garbage))


@pytest.mark.parametrize(("kind", "payload"), _payloads(), ids=lambda v: str(v)[:12])
def test_short_payload_inside_a_frame(kind: int, payload: bytes) -> None:
    name = Kind(kind).name
    for cut in range(len(payload)):
        with pytest.raises(ProtocolError, match=f"malformed {name} payload"):
            decode_one(_frame(1, kind, payload[:cut]))


@pytest.mark.parametrize("kind", [0, 8, 9, 100, 0x7FFF, 0xFFFF])
@pytest.mark.parametrize("payload", [b"", b"\x00\x00\x00\x00"])
def test_unknown_kind(kind: int, payload: bytes) -> None:
    with pytest.raises(ProtocolError, match=f"unknown message kind {kind}"):
        decode_one(_frame(1, kind, payload))


@pytest.mark.parametrize("kind", [Kind.PING, Kind.STATUS])
@pytest.mark.parametrize("payload", [b"\x00", b"ping", b"\x00" * 7, b"\x00" * 9,
                                     b"\x00" * 100])
def test_empty_messages_with_payload(kind: Kind, payload: bytes) -> None:
    words = "this message has no payload" if kind == Kind.PING else "no payload or a u64"
    with pytest.raises(ProtocolError, match=words):
        decode_one(_frame(1, kind, payload))


@pytest.mark.parametrize("bad", [b"\xff", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80",
                                 b"\xf4\x90\x80\x80", b"a\x80b"])
def test_invalid_utf8(bad: bytes) -> None:
    hello = struct.pack(">II", 1, 0) + struct.pack(">H", len(bad)) + bad + _text("")
    with pytest.raises(ProtocolError, match="malformed HELLO payload"):
        decode_one(_frame(1, 1, hello))
    client = struct.pack(">II", 1, 0) + _text("/a") + struct.pack(">H", len(bad)) + bad
    with pytest.raises(ProtocolError, match="malformed HELLO payload"):
        decode_one(_frame(1, 1, client))
    accept = struct.pack(">Q", 1) + bytes(32) + struct.pack(">H", len(bad)) + bad
    with pytest.raises(ProtocolError, match="malformed ACCEPT payload"):
        decode_one(_frame(1, 2, accept))
    refuse = struct.pack(">I", 1) + struct.pack(">H", len(bad)) + bad
    with pytest.raises(ProtocolError, match="malformed REFUSE payload"):
        decode_one(_frame(1, 3, refuse))
    with pytest.raises(ProtocolError, match="malformed PONG payload"):
        decode_one(_frame(1, 5, struct.pack(">I", len(bad)) + bad))


def test_string_length_beyond_payload() -> None:
    hello = struct.pack(">II", 1, 0) + struct.pack(">H", 0xFFFF) + b"/a" + _text("")
    with pytest.raises(ProtocolError, match="malformed HELLO payload"):
        decode_one(_frame(1, 1, hello))


# --- decode_one -----------------------------------------------------------------------------


def test_decode_one_truncated() -> None:
    raw = encode(Hello(3, "/share"))
    for n in range(len(raw)):
        with pytest.raises(ProtocolError):
            decode_one(raw[:n])
    with pytest.raises(ProtocolError, match="truncated frame"):
        decode_one(b"")
    with pytest.raises(ProtocolError, match="truncated frame"):
        decode_one(raw[:HEADER_SIZE])
    with pytest.raises(ProtocolError, match="truncated frame"):
        decode_one(raw[:-1])


def test_decode_one_extra_data() -> None:
    raw = encode(Ping())
    with pytest.raises(ProtocolError, match="bytes after the frame"):
        decode_one(raw + raw)
    with pytest.raises(ProtocolError, match="bytes after the frame"):
        decode_one(raw + b"F")
    with pytest.raises(ProtocolError, match="bytes after the frame"):
        decode_one(raw + b"FHMN\x00\x01")
    with pytest.raises(ProtocolError):
        decode_one(raw + b"X")


def test_garbage_after_a_frame_is_refused() -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError, match="bad magic"):
        decoder.feed(encode(Ping()) + b"{")
        _drain(decoder)


def test_bad_second_header_is_refused() -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError, match="unsupported protocol version 9"):
        decoder.feed(encode(Ping()) + _frame(9, 4, b""))
        _drain(decoder)


# --- robustness: arbitrary input ------------------------------------------------------------


def _feed_all(data: bytes, cuts: list[int]) -> list[Message]:
    """Feed `data` in chunks; only ProtocolError may escape, and it must terminate."""
    decoder = FrameDecoder()
    got: list[Message] = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        decoder.feed(data[start:cut])
        start = max(start, cut)
        got.extend(_drain(decoder))
        assert len(got) <= len(data) // HEADER_SIZE
    return got


@FAST
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=6))
def test_arbitrary_bytes_only_raise_protocol_error(data: bytes, cuts: list[int]) -> None:
    with contextlib.suppress(ProtocolError):
        _feed_all(data, cuts)


@st.composite
def _near_frames(draw: st.DrawFn) -> bytes:
    """Frames with a valid header and a random or mutated payload, to reach the parsers."""
    kind = draw(st.integers(0, 8))
    if draw(st.booleans()):
        payload = draw(st.binary(max_size=200))
    else:
        message = draw(SMALL_MESSAGES)
        buf = bytearray(encode(message)[HEADER_SIZE:])
        kind = encode(message)[7] if draw(st.booleans()) else kind
        for _ in range(draw(st.integers(1, 4))):
            op = draw(st.sampled_from(["flip", "insert", "delete", "set"]))
            pos = draw(st.integers(0, len(buf)))
            if op == "insert":
                buf[pos:pos] = draw(st.binary(min_size=1, max_size=4))
            elif buf and pos < len(buf):
                if op == "flip":
                    buf[pos] ^= 1 << draw(st.integers(0, 7))
                elif op == "delete":
                    del buf[pos]
                else:
                    buf[pos] = draw(st.integers(0, 255))
        payload = bytes(buf)
    length = len(payload) if draw(st.booleans()) else draw(st.integers(0, 300))
    tail = draw(st.binary(max_size=20))
    return _frame(1, kind, payload, length) + tail


@FAST
@given(data=_near_frames(), cuts=st.lists(st.integers(0, 300), max_size=4))
def test_near_frames_only_raise_protocol_error(data: bytes, cuts: list[int]) -> None:
    with contextlib.suppress(ProtocolError):
        _feed_all(data, cuts)


@FAST
@given(data=_near_frames())
def test_whatever_decodes_re_encodes_to_the_same_bytes(data: bytes) -> None:
    """The encoding is canonical: an accepted frame is exactly encode() of what it decoded to."""
    try:
        message = decode_one(data)
    except ProtocolError:
        return
    assert encode(message) == data


# --- STATUS in pages ------------------------------------------------------------------------


def test_status_request_after_bytes() -> None:
    """The first page is asked as before paging (no payload); later ones carry a u64."""
    assert encode(StatusRequest(0)) == encode(StatusRequest())
    assert encode(StatusRequest(0x0102030405060708)) == (
        b"FHMN\x00\x01\x00\x06\x00\x00\x00\x08\x01\x02\x03\x04\x05\x06\x07\x08")
    assert decode_one(encode(StatusRequest(77))) == StatusRequest(77)
    assert decode_one(_frame(1, Kind.STATUS, bytes(8))) == StatusRequest(0)


SUMMARY = {"counters": {"name_to_handle_at": {"success": 12, "EACCES": 3}},
           "keys": ["0a0b0c0d"], "signer": "0a0b0c0d", "pid": 4242, "workers": [], "fds": 19}


def _target(target_id: int, share: str = "") -> dict[str, Any]:
    """What Target.describe() gives (monitor/calls.py), at a realistic size."""
    share = share or (f"/var/lib/kubelet/pods/{target_id:036d}/volumes/kubernetes.io~csi/"
                      f"pvc-{target_id}/mount")
    return {"id": target_id, "pid": 100000 + target_id, "share": share,
            "share_in_target": "/var/run/kubevirt-private/vmi-disks/share", "convention": "native",
            "peer_uid": 107, "peer_pid": 9000 + target_id, "calls": 123456789,
            "registered_at": 1764600000.123456}


def _collect(summary: dict[str, Any], targets: list[dict[str, Any]],
             budget: int = MAX_PAYLOAD - 4) -> tuple[dict[str, Any], int]:
    """Run the client's pager against the server's page builder, through real frames."""
    pages = StatusPages()
    count = 0
    while pages.request is not None:
        after = pages.request.after
        request = decode_one(encode(pages.request))
        assert isinstance(request, StatusRequest) and request.after == after
        reply = intake_wire.status_page(summary, [t for t in targets if t["id"] > after], after,
                                        total=len(targets), budget=budget)
        frame = encode(reply)  # raises if over MAX_PAYLOAD
        assert len(frame) <= HEADER_SIZE + MAX_PAYLOAD
        pages.feed(decode_one(frame))
        count += 1
    return pages.status, count


def test_two_hundred_targets_come_in_bounded_pages() -> None:
    """The reply outgrew the 16 KiB frame at ~70 targets; now it is paged."""
    targets = [_target(i) for i in range(1, 201)]
    assert len(json.dumps({**SUMMARY, "targets": targets})) > MAX_PAYLOAD  # the old failure
    status, count = _collect(SUMMARY, targets)
    assert status["targets"] == targets
    assert status["total_targets"] == 200
    assert {k: status[k] for k in SUMMARY} == SUMMARY
    assert 2 <= count <= 5


def test_a_small_status_is_one_page_like_before() -> None:
    reply = intake_wire.status_page(SUMMARY, [_target(1), _target(2)], 0)
    body = json.loads(reply.json)
    assert body["targets"] == [_target(1), _target(2)] and body["next"] is None
    assert body["total_targets"] == 2


def test_no_targets() -> None:
    status, count = _collect(SUMMARY, [])
    assert (status["targets"], status["total_targets"], count) == ([], 0, 1)


def test_a_reply_of_a_server_without_paging_is_complete() -> None:
    pages = StatusPages()
    pages.feed(StatusReply(json.dumps({**SUMMARY, "targets": [_target(1)]})))
    assert pages.request is None and pages.status["targets"] == [_target(1)]


def test_a_target_too_large_for_a_page_is_cut_to_fit() -> None:
    huge = _target(5, share="/" + "\u00e9" * 4000)  # 6 bytes of JSON a character
    status, _ = _collect(SUMMARY, [_target(1), huge, _target(9)])
    got = [t["id"] for t in status["targets"]]
    assert got == [1, 5, 9]
    cut = status["targets"][1]
    assert cut["share"].endswith(intake_wire.TRUNCATED) and cut["pid"] == huge["pid"]


@FEWER
@given(st.lists(st.tuples(st.integers(1, 10_000), st.text(max_size=3000)), max_size=60,
                unique_by=lambda t: t[0]),
       st.integers(2_000, MAX_PAYLOAD - 4))
def test_pages_never_exceed_the_frame_and_lose_no_target(
        entries: list[tuple[int, str]], budget: int) -> None:
    targets = sorted((_target(i, share=text) for i, text in entries), key=lambda t: t["id"])
    status, _ = _collect(SUMMARY, targets, budget)
    assert [t["id"] for t in status["targets"]] == [t["id"] for t in targets]
    for got, sent in zip(status["targets"], targets, strict=True):
        assert got == sent or got["share"].endswith(intake_wire.TRUNCATED)


@pytest.mark.parametrize("reply,words", [
    (Pong("{}"), "expected STATUS_REPLY"),
    (StatusReply("not json"), "not JSON"),
    (StatusReply("[]"), "not a status object"),
    (StatusReply(json.dumps({"targets": [], "next": 0})), "do not progress"),
    (StatusReply(json.dumps({"targets": [], "next": "7"})), "do not progress"),
])
def test_the_pager_refuses_bad_replies(reply: Message, words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        StatusPages().feed(reply)


def test_the_pager_refuses_a_server_that_goes_backwards() -> None:
    pages = StatusPages()
    pages.feed(StatusReply(json.dumps({"targets": [_target(5)], "next": 5})))
    assert pages.request == StatusRequest(5)
    with pytest.raises(ProtocolError, match="do not progress"):
        pages.feed(StatusReply(json.dumps({"targets": [_target(3)], "next": 3})))
