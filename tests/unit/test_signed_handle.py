"""protocol.signed_handle: the MAC'd message is unambiguous, the trailer splits back exactly."""

from __future__ import annotations

import struct

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from protocol import signed_handle as sh
from protocol.kernel import MAX_HANDLE_SZ

FAST = settings(max_examples=300, deadline=None)

SHARE_IDS = st.binary(min_size=32, max_size=32)
TYPES = st.integers(-(2**31), 2**31 - 1)
KEY_IDS = st.integers(0, 2**32 - 1)
KERNEL = st.binary(min_size=0, max_size=sh.MAX_KERNEL_HANDLE_SIZE)
MACS = st.binary(min_size=16, max_size=16)


def test_sizes() -> None:
    assert sh.KEY_ID_SIZE == 4
    assert sh.MAC_SIZE == 16
    assert sh.TRAILER_SIZE == 20
    assert sh.SHARE_ID_SIZE == 32
    assert sh.MAX_KERNEL_HANDLE_SIZE == 108
    assert sh.MAX_KERNEL_HANDLE_SIZE + sh.TRAILER_SIZE == MAX_HANDLE_SZ
    assert sh.DOMAIN_TAG == b"fhmon/handle/v1\x00"
    assert len(sh.DOMAIN_TAG) == 16


# --- mac_message ----------------------------------------------------------------------------


def test_mac_message_exact_bytes() -> None:
    share = bytes(range(32))
    msg = sh.mac_message(share, 0x10081, b"\xaa\xbb\xcc", 0x01020304)
    expected = (b"fhmon/handle/v1\x00" + share
                + b"\x00\x01\x00\x81"  # handle_type, i32 big endian
                + b"\x00\x00\x00\x03"  # len(kernel_bytes), u32 big endian
                + b"\xaa\xbb\xcc"
                + b"\x01\x02\x03\x04")  # key id, u32 big endian
    assert msg == expected


def test_mac_message_negative_type() -> None:
    msg = sh.mac_message(bytes(32), -1, b"", 0)
    assert msg[48:52] == b"\xff\xff\xff\xff"
    assert len(msg) == 16 + 32 + 8 + 0 + 4


@pytest.mark.parametrize("size", [0, 16, 31, 33, 64])
def test_mac_message_refuses_share_id_size(size: int) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        sh.mac_message(bytes(size), 1, b"x", 1)


def _parse_message(msg: bytes) -> tuple[bytes, int, bytes, int]:
    """The inverse of mac_message: if it exists, mac_message is injective."""
    tag_len = len(sh.DOMAIN_TAG)
    assert msg[:tag_len] == sh.DOMAIN_TAG
    share = msg[tag_len: tag_len + 32]
    handle_type, length = struct.unpack_from(">iI", msg, tag_len + 32)
    start = tag_len + 32 + 8
    kernel_bytes = msg[start: start + length]
    assert len(kernel_bytes) == length
    (key_id,) = struct.unpack_from(">I", msg, start + length)
    assert len(msg) == start + length + 4, "no bytes beyond the key id"
    return share, handle_type, kernel_bytes, key_id


@FAST
@given(share=SHARE_IDS, ht=TYPES, kb=KERNEL, kid=KEY_IDS)
def test_mac_message_is_invertible(share: bytes, ht: int, kb: bytes, kid: int) -> None:
    assert _parse_message(sh.mac_message(share, ht, kb, kid)) == (share, ht, kb, kid)


@FAST
@given(a=st.tuples(SHARE_IDS, TYPES, KERNEL, KEY_IDS),
       b=st.tuples(SHARE_IDS, TYPES, KERNEL, KEY_IDS))
def test_mac_message_injective(a: tuple[bytes, int, bytes, int],
                               b: tuple[bytes, int, bytes, int]) -> None:
    assume(a != b)
    assert sh.mac_message(*a) != sh.mac_message(*b)


@FAST
@given(share=SHARE_IDS, ht=TYPES, kb=st.binary(min_size=1, max_size=40), kid=KEY_IDS,
       field=st.sampled_from(["share", "type", "kernel", "key"]), data=st.data())
def test_mac_message_changes_with_each_field(share: bytes, ht: int, kb: bytes, kid: int,
                                             field: str, data: st.DataObject) -> None:
    """The tricky collisions: moving bytes between kernel_bytes and key id, or the type."""
    base = sh.mac_message(share, ht, kb, kid)
    if field == "share":
        other = data.draw(SHARE_IDS.filter(lambda s: s != share))
        assert sh.mac_message(other, ht, kb, kid) != base
    elif field == "type":
        other_t = data.draw(TYPES.filter(lambda t: t != ht))
        assert sh.mac_message(share, other_t, kb, kid) != base
    elif field == "kernel":
        # Shift the last kernel byte into the key id, or the first key-id byte into kernel.
        shifted_kid = (kb[-1] << 24) | (kid >> 8)
        assert sh.mac_message(share, ht, kb[:-1], shifted_kid) != base
        assert sh.mac_message(share, ht, kb + bytes([kid >> 24]), kid & 0xFFFFFF) != base
    else:
        other_k = data.draw(KEY_IDS.filter(lambda k: k != kid))
        assert sh.mac_message(share, ht, kb, other_k) != base


def test_mac_message_concatenation_collision_candidates() -> None:
    share = bytes(32)
    # Without the length prefix these two would be the same byte string.
    m1 = sh.mac_message(share, 1, b"\x00\x00\x00\x01", 2)
    m2 = sh.mac_message(share, 1, b"\x00\x00\x00\x01\x00\x00\x00", 0x02000000)
    assert m1 != m2
    m3 = sh.mac_message(share, 1, b"", 1)
    m4 = sh.mac_message(share, 1, b"\x00\x00\x00\x01", 0)
    assert m3 != m4


# --- assemble / split -----------------------------------------------------------------------


def test_assemble_layout() -> None:
    mac = bytes(range(100, 116))
    raw = sh.assemble(b"\x01\x02", 0xDEADBEEF, mac)
    assert raw == b"\x01\x02" + b"\xde\xad\xbe\xef" + mac
    assert len(raw) == 2 + 20


@pytest.mark.parametrize("size", [0, 8, 15, 17, 32])
def test_assemble_refuses_mac_size(size: int) -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        sh.assemble(b"abc", 1, bytes(size))


def test_split_layout() -> None:
    mac = bytes(range(16))
    parts = sh.split(b"KERNEL" + b"\x00\x00\x01\x02" + mac)
    assert parts == sh.SignedHandle(b"KERNEL", 0x102, mac)


@pytest.mark.parametrize("length", range(0, sh.TRAILER_SIZE + 1))
def test_split_refuses_up_to_trailer_size(length: int) -> None:
    assert sh.split(bytes(range(length))) is None


def test_split_smallest_accepted() -> None:
    raw = b"\x7f" + b"\x00\x00\x00\x09" + b"\x55" * 16
    assert sh.split(raw) == sh.SignedHandle(b"\x7f", 9, b"\x55" * 16)


@FAST
@given(kb=st.binary(min_size=1, max_size=sh.MAX_KERNEL_HANDLE_SIZE), kid=KEY_IDS, mac=MACS)
def test_assemble_split_round_trip(kb: bytes, kid: int, mac: bytes) -> None:
    raw = sh.assemble(kb, kid, mac)
    assert len(raw) == len(kb) + sh.TRAILER_SIZE
    assert len(raw) <= MAX_HANDLE_SZ
    assert sh.split(raw) == sh.SignedHandle(kb, kid, mac)


@FAST
@given(raw=st.binary(min_size=sh.TRAILER_SIZE + 1, max_size=MAX_HANDLE_SZ))
def test_split_assemble_round_trip(raw: bytes) -> None:
    parts = sh.split(raw)
    assert parts is not None
    assert len(parts.mac) == 16
    assert 0 <= parts.key_id < 2**32
    assert sh.assemble(parts.kernel_bytes, parts.key_id, parts.mac) == raw
