"""protocol.kernel: struct layouts, ioctl numbers and the small pure helpers, byte for byte.

Every expected value is built here independently (field by field with struct, or from the
_IOC formula of include/uapi/asm-generic/ioctl.h), never by calling the module's own packers.
"""

from __future__ import annotations

import itertools
import os
import platform
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import kernel
from protocol.kernel import (
    FileHandleHeader,
    Notification,
    arg_int,
    arg_ptr,
    handle_type_is_valid,
    pack_addfd,
    pack_file_handle,
    pack_response,
    pack_u64,
    split_page_ranges,
    unpack_response,
)

FAST = settings(max_examples=300, deadline=None)

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)


# --- sizes --------------------------------------------------------------------------------


def test_struct_sizes() -> None:
    assert kernel.SECCOMP_NOTIF_SIZE == 80
    assert kernel.SECCOMP_NOTIF_RESP_SIZE == 24
    assert kernel.SECCOMP_NOTIF_ADDFD_SIZE == 24
    assert kernel.FILE_HANDLE_HEADER_SIZE == 8
    assert kernel.MAX_HANDLE_SZ == 128
    assert kernel.PAGE_SIZE == 4096


def test_packers_produce_exact_sizes() -> None:
    notif = Notification(1, 2, 3, 4, 5, 6, (7, 8, 9, 10, 11, 12))
    assert len(notif.pack()) == 80
    assert len(pack_response(1)) == 24
    assert len(pack_addfd(1, 2)) == 24
    assert len(pack_u64(1)) == 8
    assert len(FileHandleHeader(1, 2).pack()) == 8


# --- ioctl numbers --------------------------------------------------------------------------

_IOC_NRBITS, _IOC_TYPEBITS, _IOC_SIZEBITS = 8, 8, 14
_IOC_NRSHIFT = 0
_IOC_TYPESHIFT = _IOC_NRSHIFT + _IOC_NRBITS
_IOC_SIZESHIFT = _IOC_TYPESHIFT + _IOC_TYPEBITS
_IOC_DIRSHIFT = _IOC_SIZESHIFT + _IOC_SIZEBITS
_IOC_WRITE, _IOC_READ = 1, 2
SECCOMP_IOC_MAGIC = ord("!")


def _ioc(direction: int, nr: int, size: int) -> int:
    assert size < (1 << _IOC_SIZEBITS)
    return ((direction << _IOC_DIRSHIFT) | (SECCOMP_IOC_MAGIC << _IOC_TYPESHIFT)
            | (nr << _IOC_NRSHIFT) | (size << _IOC_SIZESHIFT))


def _iowr(nr: int, size: int) -> int:
    return _ioc(_IOC_READ | _IOC_WRITE, nr, size)


def _iow(nr: int, size: int) -> int:
    return _ioc(_IOC_WRITE, nr, size)


def test_ioc_magic_is_bang() -> None:
    assert SECCOMP_IOC_MAGIC == 0x21


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (kernel.SECCOMP_IOCTL_NOTIF_RECV, _iowr(0, 80)),
        (kernel.SECCOMP_IOCTL_NOTIF_SEND, _iowr(1, 24)),
        (kernel.SECCOMP_IOCTL_NOTIF_ID_VALID, _iow(2, 8)),
        (kernel.SECCOMP_IOCTL_NOTIF_ADDFD, _iow(3, 24)),
        (kernel.SECCOMP_IOCTL_NOTIF_SET_FLAGS, _iow(4, 8)),
    ],
    ids=["RECV", "SEND", "ID_VALID", "ADDFD", "SET_FLAGS"],
)
def test_ioctl_number_matches_formula(value: int, expected: int) -> None:
    assert value == expected


def test_ioctl_numbers_use_the_module_struct_sizes() -> None:
    assert _iowr(0, kernel.SECCOMP_NOTIF_SIZE) == kernel.SECCOMP_IOCTL_NOTIF_RECV
    assert _iowr(1, kernel.SECCOMP_NOTIF_RESP_SIZE) == kernel.SECCOMP_IOCTL_NOTIF_SEND
    assert _iow(3, kernel.SECCOMP_NOTIF_ADDFD_SIZE) == kernel.SECCOMP_IOCTL_NOTIF_ADDFD
    # And the literal values documented in facts.md.
    assert (kernel.SECCOMP_IOCTL_NOTIF_RECV, kernel.SECCOMP_IOCTL_NOTIF_SEND,
            kernel.SECCOMP_IOCTL_NOTIF_ID_VALID, kernel.SECCOMP_IOCTL_NOTIF_ADDFD,
            kernel.SECCOMP_IOCTL_NOTIF_SET_FLAGS) == (
                0xC0502100, 0xC0182101, 0x40082102, 0x40182103, 0x40082104)


# --- constants ------------------------------------------------------------------------------


def test_syscall_numbers_and_arch() -> None:
    assert kernel.AUDIT_ARCH_X86_64 == 0xC000003E
    assert kernel.SYS_NAME_TO_HANDLE_AT == 303
    assert kernel.SYS_OPEN_BY_HANDLE_AT == 304


def test_at_and_fileid_constants() -> None:
    assert kernel.AT_FDCWD == -100
    assert kernel.AT_EMPTY_PATH == 0x1000
    assert kernel.AT_SYMLINK_FOLLOW == 0x400
    assert kernel.AT_HANDLE_FID == 0x200
    assert kernel.AT_HANDLE_MNT_ID_UNIQUE == 0x001
    assert kernel.AT_HANDLE_CONNECTABLE == 0x002
    assert kernel.FILEID_INVALID == 255
    assert kernel.FILEID_VALID_USER_FLAGS == 0x30000
    assert kernel.FILEID_USER_FLAGS_MASK == 0xFFFF0000


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86_64 open(2) flag values")
@pytest.mark.parametrize("name", ["O_RDONLY", "O_WRONLY", "O_RDWR", "O_ACCMODE", "O_CREAT",
                                  "O_EXCL", "O_NOCTTY", "O_TRUNC", "O_APPEND", "O_NONBLOCK",
                                  "O_DIRECTORY", "O_NOFOLLOW", "O_CLOEXEC", "O_PATH",
                                  "O_TMPFILE"])
def test_open_flags_match_the_platform(name: str) -> None:
    assert getattr(kernel, name) == getattr(os, name)


# --- struct seccomp_notif -------------------------------------------------------------------


def _notif_bytes(nid: int, pid: int, flags: int, nr: int, arch: int, ip: int,
                 args: tuple[int, ...]) -> bytes:
    """Field by field, with each field's own little-endian format."""
    out = (struct.pack("<Q", nid) + struct.pack("<I", pid) + struct.pack("<I", flags)
           + struct.pack("<i", nr) + struct.pack("<I", arch) + struct.pack("<Q", ip))
    for a in args:
        out += struct.pack("<Q", a)
    return out


def test_notification_layout_offsets() -> None:
    args = (0x1111111111111111, 0x2222222222222222, 0x3333333333333333,
            0x4444444444444444, 0x5555555555555555, 0x6666666666666666)
    notif = Notification(0x0102030405060708, 0x0A0B0C0D, 0x1, 303, 0xC000003E,
                         0x7FFF00001234, args)
    raw = notif.pack()
    assert raw == _notif_bytes(0x0102030405060708, 0x0A0B0C0D, 1, 303, 0xC000003E,
                               0x7FFF00001234, args)
    assert raw[0:8] == bytes([8, 7, 6, 5, 4, 3, 2, 1])
    assert raw[8:12] == bytes([0x0D, 0x0C, 0x0B, 0x0A])
    assert raw[12:16] == b"\x01\x00\x00\x00"
    assert raw[16:20] == (303).to_bytes(4, "little")
    assert raw[20:24] == bytes.fromhex("3e0000c0")
    assert raw[24:32] == (0x7FFF00001234).to_bytes(8, "little")
    for i, a in enumerate(args):
        assert raw[32 + 8 * i: 40 + 8 * i] == a.to_bytes(8, "little")


def test_notification_negative_nr() -> None:
    raw = _notif_bytes(1, 2, 0, -1, 0, 0, (0,) * 6)
    assert raw[16:20] == b"\xff\xff\xff\xff"
    assert Notification.parse(raw).nr == -1


def test_notification_parse_from_zeroed_buffer() -> None:
    notif = Notification.parse(bytes(80))
    assert notif == Notification(0, 0, 0, 0, 0, 0, (0, 0, 0, 0, 0, 0))


@pytest.mark.parametrize("size", [0, 1, 24, 79, 81, 160])
def test_notification_parse_rejects_wrong_size(size: int) -> None:
    with pytest.raises(ValueError, match="80 bytes"):
        Notification.parse(bytes(size))


def test_notification_parse_accepts_bytearray_and_memoryview() -> None:
    raw = _notif_bytes(9, 8, 7, 6, 5, 4, (3, 2, 1, 0, 1, 2))
    expected = Notification(9, 8, 7, 6, 5, 4, (3, 2, 1, 0, 1, 2))
    assert Notification.parse(bytearray(raw)) == expected
    assert Notification.parse(memoryview(raw)) == expected


@FAST
@given(nid=U64, pid=U32, flags=U32, nr=I32, arch=U32, ip=U64,
       args=st.tuples(U64, U64, U64, U64, U64, U64))
def test_notification_round_trip(nid: int, pid: int, flags: int, nr: int, arch: int, ip: int,
                                 args: tuple[int, int, int, int, int, int]) -> None:
    notif = Notification(nid, pid, flags, nr, arch, ip, args)
    raw = notif.pack()
    assert raw == _notif_bytes(nid, pid, flags, nr, arch, ip, args)
    assert Notification.parse(raw) == notif


@FAST
@given(raw=st.binary(min_size=80, max_size=80))
def test_notification_bytes_round_trip(raw: bytes) -> None:
    assert Notification.parse(raw).pack() == raw


# --- struct seccomp_notif_resp --------------------------------------------------------------


def test_response_layout() -> None:
    raw = pack_response(0x1122334455667788, val=7, error=13, flags=1)
    assert raw == (struct.pack("<Q", 0x1122334455667788) + struct.pack("<q", 7)
                   + struct.pack("<i", -13) + struct.pack("<I", 1))
    assert raw[16:20] == b"\xf3\xff\xff\xff"  # -13 (EACCES), two's complement


def test_response_defaults_are_success() -> None:
    assert pack_response(5) == struct.pack("<Q", 5) + bytes(16)


def test_response_negative_val() -> None:
    raw = pack_response(1, val=-1)
    assert raw[8:16] == b"\xff" * 8


@pytest.mark.parametrize("errno_value", [1, 2, 9, 13, 22, 38, 75, 95, 116, 4095])
def test_response_error_is_negated(errno_value: int) -> None:
    raw = pack_response(1, error=errno_value)
    assert struct.unpack_from("<i", raw, 16)[0] == -errno_value
    assert unpack_response(raw) == (1, 0, -errno_value, 0)


@pytest.mark.parametrize("bad", [-1, -13, -4095])
def test_response_refuses_negative_errno(bad: int) -> None:
    with pytest.raises(ValueError, match="positive errno"):
        pack_response(1, error=bad)


@FAST
@given(nid=U64, val=I64, error=st.integers(0, 2**31 - 1), flags=U32)
def test_response_round_trip(nid: int, val: int, error: int, flags: int) -> None:
    raw = pack_response(nid, val=val, error=error, flags=flags)
    assert len(raw) == 24
    assert unpack_response(raw) == (nid, val, -error, flags)


# --- struct seccomp_notif_addfd -------------------------------------------------------------


def test_addfd_layout() -> None:
    raw = pack_addfd(0xAABBCCDD00112233, 7, newfd=42, newfd_flags=kernel.O_CLOEXEC,
                     flags=kernel.SECCOMP_ADDFD_FLAG_SEND | kernel.SECCOMP_ADDFD_FLAG_SETFD)
    assert bytes(raw) == (struct.pack("<Q", 0xAABBCCDD00112233) + struct.pack("<I", 3)
                          + struct.pack("<I", 7) + struct.pack("<I", 42)
                          + struct.pack("<I", 0o2000000))


def test_addfd_is_mutable() -> None:
    raw = pack_addfd(1, 2)
    assert isinstance(raw, bytearray)
    assert bytes(raw) == struct.pack("<Q", 1) + bytes(4) + struct.pack("<I", 2) + bytes(8)


@FAST
@given(nid=U64, srcfd=U32, newfd=U32, newfd_flags=U32, flags=U32)
def test_addfd_fields(nid: int, srcfd: int, newfd: int, newfd_flags: int, flags: int) -> None:
    raw = pack_addfd(nid, srcfd, newfd=newfd, newfd_flags=newfd_flags, flags=flags)
    assert struct.unpack("<QIIII", raw) == (nid, flags, srcfd, newfd, newfd_flags)


def test_pack_u64() -> None:
    assert pack_u64(0x0102030405060708) == bytes([8, 7, 6, 5, 4, 3, 2, 1])
    assert pack_u64(kernel.SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP) == b"\x01" + bytes(7)


# --- syscall argument decoding -------------------------------------------------------------


@pytest.mark.parametrize(
    ("register", "expected"),
    [
        (0, 0),
        (1, 1),
        (0x7FFFFFFF, 2**31 - 1),
        (0x80000000, -(2**31)),
        (0xFFFFFFFF, -1),
        (0xFFFFFF9C, -100),
        (0xFFFFFFFF_FFFFFF9C, -100),
        (0xFFFFFFFF_00000005, 5),
        (0xDEADBEEF_00000000, 0),
        (0x00000001_FFFFFFFF, -1),
        (0x12345678_00001000, 0x1000),
    ],
)
def test_arg_int(register: int, expected: int) -> None:
    assert arg_int(register) == expected


def test_arg_int_at_fdcwd() -> None:
    assert arg_int(0xFFFFFF9C) == kernel.AT_FDCWD
    assert arg_int(0xFFFFFFFFFFFFFF9C) == kernel.AT_FDCWD


@FAST
@given(high=U32, low=U32)
def test_arg_int_ignores_high_bits(high: int, low: int) -> None:
    expected = struct.unpack("<i", struct.pack("<I", low))[0]
    assert arg_int((high << 32) | low) == expected
    assert arg_int(low) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0), (0x7FFF_FFFF_F000, 0x7FFF_FFFF_F000), (2**64 - 1, 2**64 - 1), (2**64, 0),
     (2**64 + 5, 5), (-1, 2**64 - 1)],
)
def test_arg_ptr(value: int, expected: int) -> None:
    assert arg_ptr(value) == expected


# --- handle types ---------------------------------------------------------------------------


def _signed32(value: int) -> int:
    return value - (1 << 32) if value & 0x80000000 else value


@pytest.mark.parametrize("low", [0, 1, 2, 0x81, 0xFF, 0xFFFF])
def test_handle_type_every_user_flag_combination(low: int) -> None:
    """All 2**16 values of the upper half, for several fs-specific lower halves."""
    accepted = []
    for user_flags in range(1 << 16):
        handle_type = _signed32((user_flags << 16) | low)
        valid = handle_type_is_valid(handle_type)
        # The kernel: type >= 0 and no user flag outside FILEID_IS_CONNECTABLE|FILEID_IS_DIR.
        assert valid == (user_flags & ~0x3 == 0), hex(handle_type)
        if valid:
            accepted.append(user_flags)
    assert accepted == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("handle_type", "valid"),
    [
        (0, True),
        (1, True),
        (0x81, True),
        (kernel.FILEID_INVALID, True),  # type-wise fine; the fs decides later
        (0x10001, True),  # FILEID_IS_CONNECTABLE
        (0x20001, True),  # FILEID_IS_DIR
        (0x30001, True),
        (0x40001, False),
        (0x7FFF0000, False),
        (2**31 - 1, False),
        (-1, False),
        (-(2**31), False),
        (-255, False),
    ],
)
def test_handle_type_examples(handle_type: int, valid: bool) -> None:
    assert handle_type_is_valid(handle_type) is valid


# --- page ranges ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("addr", "length", "expected"),
    [
        (0x1000, 0, []),
        (0x1000, 1, [(0x1000, 1)]),
        (0x1000, 4096, [(0x1000, 4096)]),
        (0x1000, 4097, [(0x1000, 4096), (0x2000, 1)]),
        (0x1FFF, 1, [(0x1FFF, 1)]),
        (0x1FFF, 2, [(0x1FFF, 1), (0x2000, 1)]),
        (0x1FF8, 8 + 128, [(0x1FF8, 8), (0x2000, 128)]),
        (0x1F00, 8192 + 512, [(0x1F00, 256), (0x2000, 4096), (0x3000, 4096), (0x4000, 256)]),
        (0, 4096, [(0, 4096)]),
    ],
)
def test_split_page_ranges_examples(addr: int, length: int,
                                    expected: list[tuple[int, int]]) -> None:
    assert split_page_ranges(addr, length) == expected


@FAST
@given(addr=st.integers(0, 2**47 - 1), length=st.integers(0, 6 * 4096 + 17))
def test_split_page_ranges_properties(addr: int, length: int) -> None:
    ranges = split_page_ranges(addr, length)
    page = kernel.PAGE_SIZE
    if length == 0:
        assert ranges == []
        return
    # Covers exactly [addr, addr+length), contiguous, in order.
    assert ranges[0][0] == addr
    assert sum(n for _, n in ranges) == length
    for (a, n), (b, _) in itertools.pairwise(ranges):
        assert a + n == b
    # No range is empty or crosses a page boundary; every cut is on a boundary.
    for start, n in ranges:
        assert n > 0
        assert start // page == (start + n - 1) // page
    for start, n in ranges[:-1]:
        assert (start + n) % page == 0
    # One range per page touched: minimal.
    pages_touched = (addr + length - 1) // page - addr // page + 1
    assert len(ranges) == pages_touched


@FAST
@given(addr=st.integers(0, 2**47 - 1), length=st.integers(-5000, 0))
def test_split_page_ranges_empty_for_non_positive(addr: int, length: int) -> None:
    assert split_page_ranges(addr, length) == []


# --- struct file_handle ---------------------------------------------------------------------


def test_file_handle_header_layout() -> None:
    header = FileHandleHeader(handle_bytes=128, handle_type=0x10001)
    assert header.pack() == struct.pack("<I", 128) + struct.pack("<i", 0x10001)
    assert FileHandleHeader.parse(b"\x08\x00\x00\x00\xff\xff\xff\xff") == FileHandleHeader(8, -1)


@pytest.mark.parametrize("size", [0, 4, 7, 9, 16])
def test_file_handle_header_parse_rejects_wrong_size(size: int) -> None:
    with pytest.raises(ValueError, match="8 bytes"):
        FileHandleHeader.parse(bytes(size))


@FAST
@given(hb=U32, ht=I32)
def test_file_handle_header_round_trip(hb: int, ht: int) -> None:
    raw = FileHandleHeader(hb, ht).pack()
    assert raw == struct.pack("<I", hb) + struct.pack("<i", ht)
    assert FileHandleHeader.parse(raw) == FileHandleHeader(hb, ht)


@FAST
@given(raw=st.binary(min_size=8, max_size=8))
def test_file_handle_header_bytes_round_trip(raw: bytes) -> None:
    assert FileHandleHeader.parse(raw).pack() == raw


@FAST
@given(ht=I32, f_handle=st.binary(max_size=kernel.MAX_HANDLE_SZ))
def test_pack_file_handle(ht: int, f_handle: bytes) -> None:
    raw = pack_file_handle(ht, f_handle)
    assert raw == struct.pack("<I", len(f_handle)) + struct.pack("<i", ht) + f_handle
    header = FileHandleHeader.parse(raw[:8])
    assert header == FileHandleHeader(len(f_handle), ht)
    assert raw[8:] == f_handle
