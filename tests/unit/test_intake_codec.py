"""One definition of the intake wire format: protocol/native.py is the reference, and the
native launcher's codec (fhmon_native::intake, reached through monitor._native) must agree
with it byte for byte: every message encoded by both gives the same bytes, and each one's
bytes decode to the same message with the other. Arbitrary and mutated frames are accepted
or refused by both alike."""

from __future__ import annotations

import dataclasses
from typing import Any

import construct
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor import _native
from protocol import native
from tests.unit.test_native import MESSAGES, SMALL_MESSAGES

MANY = settings(max_examples=400, deadline=None)


def rust_encode(message: native.Message) -> bytes:
    fields = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    return _native.intake_encode(type(message).__name__, fields)


def rust_decode(data: bytes) -> native.Message:
    kind, fields = _native.intake_decode(data)
    cls: Any = getattr(native, kind)
    return cls(**fields)  # type: ignore[no-any-return]


def python_decode(data: bytes) -> native.Message | None:
    try:
        return native.decode_one(data)
    except native.ProtocolError:
        return None


def rust_decode_or_none(data: bytes) -> native.Message | None:
    try:
        return rust_decode(data)
    except ValueError:
        return None


@MANY
@given(MESSAGES)
def test_every_message_encodes_to_the_same_bytes_and_decodes_across(
        message: native.Message) -> None:
    python = native.encode(message)
    rust = rust_encode(message)
    assert rust == python
    assert rust_decode(python) == native.decode_one(python)
    assert native.decode_one(rust) == rust_decode(rust)


def test_one_of_each_kind_by_hand() -> None:
    """The ones the launcher sends and reads, named, so a failure says which."""
    share_id = bytes(range(32))
    for message in (
            native.Hello(4242, "/srv/share", "fhmon-launch/7", flags=native.HELLO_TARGET_PIDFD),
            native.Hello(1, "/s", "c", flags=native.HELLO_TARGET_PIDFD, share_id=share_id),
            native.Accept(2**64 - 1, share_id, "accepted"),
            native.Refuse(13, "not in the allow-list: /x"),
            native.Refuse(1, "é" * 5000),  # cut at 4000 characters by both
            native.Ping(), native.Pong("{}"), native.StatusRequest(),
            native.StatusRequest(9), native.StatusReply('{"targets": []}')):
        assert rust_encode(message) == native.encode(message), message
        assert rust_decode(native.encode(message)) == native.decode_one(native.encode(message))


@pytest.mark.parametrize("message", [
    native.Hello(1, "x" * 70000, "c"),  # a string over u16
    native.Pong("x" * (native.MAX_PAYLOAD + 1)),  # over the payload limit
    native.Hello(1, "s", "c", flags=native.HELLO_EXPECT_SHARE),  # the flag without an id
])
def test_both_refuse_what_cannot_be_encoded(message: native.Message) -> None:
    with pytest.raises((ValueError, construct.ConstructError)):  # the reference's own
        native.encode(message)
    with pytest.raises(ValueError):
        rust_encode(message)


@MANY
@given(SMALL_MESSAGES, st.data())
def test_mutated_frames_are_judged_alike(message: native.Message, data: st.DataObject) -> None:
    frame = bytearray(native.encode(message))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(frame) - 1))
        frame[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frame)))
    extra = data.draw(st.binary(max_size=4))
    for candidate in (bytes(frame), bytes(frame[:cut]), bytes(frame) + extra):
        assert rust_decode_or_none(candidate) == python_decode(candidate), candidate


@MANY
@given(st.binary(max_size=64))
def test_arbitrary_bytes_are_judged_alike(data: bytes) -> None:
    framed = native.MAGIC + data
    for candidate in (data, framed):
        assert rust_decode_or_none(candidate) == python_decode(candidate), candidate
