"""protocol.native: the framed intake protocol, as a sans-IO encoder and incremental decoder."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import native
from protocol.native import (
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
    assert native.PROTOCOL_VERSION == 1
    assert sorted(native.SUPPORTED_VERSIONS) == [1]
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
    assert native.looks_native(b"FHMN\x00\x01")
    assert native.looks_native(b"F")
    assert not native.looks_native(b"{")
    assert not native.looks_native(b' {"ociVersion"')
    assert not native.looks_native(b"\n")
    assert not native.looks_native(b"")


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
@pytest.mark.parametrize("payload", [b"\x00", b"ping", b"\x00" * 100])
def test_empty_messages_with_payload(kind: Kind, payload: bytes) -> None:
    with pytest.raises(ProtocolError, match="this message has no payload"):
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
