"""One definition of the intake wire format: protocol/intake_wire.py is the reference, and the
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
from protocol import intake_wire
from tests.unit.test_intake_wire import MESSAGES, SMALL_MESSAGES

MANY = settings(max_examples=400, deadline=None)


def rust_encode(message: intake_wire.Message) -> bytes:
    fields = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    return _native.intake_encode(type(message).__name__, fields)


def rust_decode(data: bytes) -> intake_wire.Message:
    kind, fields = _native.intake_decode(data)
    cls: Any = getattr(intake_wire, kind)
    return cls(**fields)  # type: ignore[no-any-return]


def python_decode(data: bytes) -> intake_wire.Message | None:
    try:
        return intake_wire.decode_one(data)
    except intake_wire.ProtocolError:
        return None


def rust_decode_or_none(data: bytes) -> intake_wire.Message | None:
    try:
        return rust_decode(data)
    except ValueError:
        return None


@MANY
@given(MESSAGES)
def test_every_message_encodes_to_the_same_bytes_and_decodes_across(
        message: intake_wire.Message) -> None:
    python = intake_wire.encode(message)
    rust = rust_encode(message)
    assert rust == python
    assert rust_decode(python) == intake_wire.decode_one(python)
    assert intake_wire.decode_one(rust) == rust_decode(rust)


def test_one_of_each_kind_by_hand() -> None:
    """The ones the launcher sends and reads, named, so a failure says which."""
    share_id = bytes(range(32))
    for message in (
            intake_wire.Hello(4242, "/srv/share", "fhmon-launch/7",
                              flags=intake_wire.HELLO_TARGET_PIDFD),
            intake_wire.Hello(1, "/s", "c", flags=intake_wire.HELLO_TARGET_PIDFD,
                              share_id=share_id),
            intake_wire.Accept(2**64 - 1, share_id, "accepted"),
            intake_wire.Refuse(13, "not in the allow-list: /x"),
            intake_wire.Refuse(1, "é" * 5000),  # cut at 4000 characters by both
            intake_wire.Ping(), intake_wire.Pong("{}"), intake_wire.StatusRequest(),
            intake_wire.StatusRequest(9), intake_wire.StatusReply('{"targets": []}')):
        assert rust_encode(message) == intake_wire.encode(message), message
        frame = intake_wire.encode(message)
        assert rust_decode(frame) == intake_wire.decode_one(frame)


@pytest.mark.parametrize("message", [
    intake_wire.Hello(1, "x" * 70000, "c"),  # a string over u16
    intake_wire.Pong("x" * (intake_wire.MAX_PAYLOAD + 1)),  # over the payload limit
    intake_wire.Hello(1, "s", "c", flags=intake_wire.HELLO_EXPECT_SHARE),  # the flag without an id
])
def test_both_refuse_what_cannot_be_encoded(message: intake_wire.Message) -> None:
    with pytest.raises((ValueError, construct.ConstructError)):  # the reference's own
        intake_wire.encode(message)
    with pytest.raises(ValueError):
        rust_encode(message)


@MANY
@given(SMALL_MESSAGES, st.data())
def test_mutated_frames_are_judged_alike(message: intake_wire.Message, data: st.DataObject) -> None:
    frame = bytearray(intake_wire.encode(message))
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
    framed = intake_wire.MAGIC + data
    for candidate in (data, framed):
        assert rust_decode_or_none(candidate) == python_decode(candidate), candidate
