"""Thin ctypes wrappers for the Linux syscalls Python's os module lacks.

Each wrapper raises OSError(errno) exactly as the kernel answered, so callers can hand the
kernel's own errno back to a target.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
from typing import Any, Final

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _proto(name: str, restype: type, *argtypes: type) -> Any:
    """A libc function with fixed argument types: no per-call argument conversion objects."""
    fn = getattr(_libc, name)
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


_c_void_p, _c_int, _c_uint, _c_ulong = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_ulong
_pvm_readv = _proto("process_vm_readv", ctypes.c_ssize_t, _c_int, _c_void_p, _c_ulong, _c_void_p,
                    _c_ulong, _c_ulong)
_pvm_writev = _proto("process_vm_writev", ctypes.c_ssize_t, _c_int, _c_void_p, _c_ulong,
                     _c_void_p, _c_ulong, _c_ulong)
_setfsuid = _proto("setfsuid", _c_int, _c_uint)
_setfsgid = _proto("setfsgid", _c_int, _c_uint)

SYS_SETGROUPS: Final = 116
SYS_CAPGET: Final = 125
SYS_CAPSET: Final = 126
SYS_NAME_TO_HANDLE_AT: Final = 303
SYS_OPEN_BY_HANDLE_AT: Final = 304
SYS_KCMP: Final = 312
SYS_STATX: Final = 332
SYS_PIDFD_SEND_SIGNAL: Final = 424
SYS_PIDFD_OPEN: Final = 434
SYS_OPENAT2: Final = 437
SYS_PIDFD_GETFD: Final = 438

PIDFD_THREAD: Final = os.O_EXCL
KCMP_FILE: Final = 0
RESOLVE_NO_XDEV: Final = 0x01
RESOLVE_NO_MAGICLINKS: Final = 0x02
RESOLVE_NO_SYMLINKS: Final = 0x04
RESOLVE_BENEATH: Final = 0x08
RESOLVE_IN_ROOT: Final = 0x10
STATX_MNT_ID: Final = 0x1000
STATX_MNT_ID_UNIQUE: Final = 0x4000
AT_EMPTY_PATH: Final = 0x1000
_LINUX_CAPABILITY_VERSION_3: Final = 0x20080522


def _check(result: int) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


class _IoVec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64))


def pidfd_open(pid: int, flags: int = 0) -> int:
    return _check(_syscall(SYS_PIDFD_OPEN, ctypes.c_int(pid), ctypes.c_uint(flags)))


def pidfd_alive(pidfd: int) -> bool:
    """Signal 0 through the pidfd: does its task (thread, for PIDFD_THREAD) still live?"""
    return int(_syscall(SYS_PIDFD_SEND_SIGNAL, ctypes.c_int(pidfd), ctypes.c_int(0), None,
                        ctypes.c_uint(0))) == 0


def pidfd_getfd(pidfd: int, targetfd: int) -> int:
    return _check(_syscall(SYS_PIDFD_GETFD, ctypes.c_int(pidfd), ctypes.c_int(targetfd),
                           ctypes.c_uint(0)))


def process_vm_read(pid: int, ranges: list[tuple[int, int]]) -> bytes:
    """Read remote ranges (one iovec each) into one buffer; a short result means a fault.

    process_vm_readv never splits an iovec, so callers pass page-sized ranges to learn
    exactly how far the readable memory goes.
    """
    total = sum(length for _, length in ranges)
    buf = ctypes.create_string_buffer(total)
    local = _IoVec(ctypes.cast(buf, ctypes.c_void_p), total)
    remote = (_IoVec * len(ranges))(*(_IoVec(addr, length) for addr, length in ranges))
    got = _pvm_readv(pid, ctypes.addressof(local), 1, ctypes.addressof(remote), len(ranges), 0)
    if got < 0:
        err = ctypes.get_errno()
        if err == 14:  # EFAULT on the first iovec: nothing readable
            return b""
        raise OSError(err, os.strerror(err))
    return buf.raw[:got]


def process_vm_write(pid: int, addr: int, data: bytes) -> int:
    """Write data at addr in the target; returns bytes written (short on a fault)."""
    if not data:
        return 0
    buf = ctypes.create_string_buffer(data, len(data))
    local = _IoVec(ctypes.addressof(buf), len(data))
    remote = _IoVec(addr, len(data))
    got = _pvm_writev(pid, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
    if got < 0:
        err = ctypes.get_errno()
        if err == 14:
            return 0
        raise OSError(err, os.strerror(err))
    return int(got)


def name_to_handle_at(dirfd: int, path: bytes, flags: int,
                      capacity: int = 128) -> tuple[int, bytes, int]:
    """The kernel's own call: (handle_type, f_handle bytes, mount id)."""
    buf = ctypes.create_string_buffer(8 + capacity)
    struct.pack_into("<Ii", buf, 0, capacity, 0)
    mnt = ctypes.c_uint64(0)
    _check(_syscall(SYS_NAME_TO_HANDLE_AT, ctypes.c_int(dirfd), ctypes.c_char_p(path), buf,
                    ctypes.byref(mnt), ctypes.c_int(flags)))
    hb, ht = struct.unpack_from("<Ii", buf, 0)
    return ht, buf.raw[8 : 8 + hb], mnt.value


def open_by_handle_at(mount_fd: int, handle_type: int, f_handle: bytes, flags: int) -> int:
    raw = struct.pack("<Ii", len(f_handle), handle_type) + f_handle
    buf = ctypes.create_string_buffer(raw, len(raw))
    return _check(_syscall(SYS_OPEN_BY_HANDLE_AT, ctypes.c_int(mount_fd), buf,
                           ctypes.c_int(flags)))


def openat2(dirfd: int, path: bytes, flags: int, resolve: int, mode: int = 0) -> int:
    how = _OpenHow(flags & 0xFFFFFFFFFFFFFFFF, mode, resolve)
    return _check(_syscall(SYS_OPENAT2, ctypes.c_int(dirfd), ctypes.c_char_p(path),
                           ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how))))


def mount_id(fd: int) -> int:
    """The unique (never reused) mount id of an fd's mount, from statx."""
    buf = ctypes.create_string_buffer(256)
    _check(_syscall(SYS_STATX, ctypes.c_int(fd), ctypes.c_char_p(b""),
                    ctypes.c_int(AT_EMPTY_PATH), ctypes.c_uint(STATX_MNT_ID_UNIQUE), buf))
    (mask,) = struct.unpack_from("<I", buf, 0)
    if not mask & (STATX_MNT_ID_UNIQUE | STATX_MNT_ID):
        raise OSError(95, "statx reports no mount id")
    (mnt,) = struct.unpack_from("<Q", buf, 144)
    return int(mnt)


def kcmp_same_file(fd1: int, fd2: int) -> bool:
    pid = os.getpid()
    return _check(_syscall(SYS_KCMP, ctypes.c_int(pid), ctypes.c_int(pid), ctypes.c_int(KCMP_FILE),
                           ctypes.c_ulong(fd1), ctypes.c_ulong(fd2))) == 0


# --- per-thread credentials -------------------------------------------------------------
# glibc's setgroups() and friends change every thread (its setxid broadcast); the raw
# syscalls change only the calling thread, which is what a temporary switch needs.

def setfsuid(uid: int) -> int:
    return int(_setfsuid(uid))  # glibc's setfsuid is a plain per-thread syscall


def setfsgid(gid: int) -> int:
    return int(_setfsgid(gid))


@functools.lru_cache(maxsize=256)
def _groups_array(groups: tuple[int, ...]) -> ctypes.Array[ctypes.c_uint]:
    return (ctypes.c_uint * max(1, len(groups)))(*groups)


def setgroups_thread(groups: tuple[int, ...]) -> None:
    _check(_syscall(SYS_SETGROUPS, ctypes.c_int(len(groups)), _groups_array(groups)))


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32))


def capget_thread() -> tuple[int, int, int]:
    """(effective, permitted, inheritable) of the calling thread, as 64-bit masks."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_syscall(SYS_CAPGET, ctypes.byref(header), data))
    return (data[0].effective | data[1].effective << 32,
            data[0].permitted | data[1].permitted << 32,
            data[0].inheritable | data[1].inheritable << 32)


@functools.lru_cache(maxsize=64)
def _capset_args(effective: int, permitted: int,
                 inheritable: int) -> tuple[_CapHeader, ctypes.Array[_CapData]]:
    """Prebuilt capset(2) arguments: credential switches run on every call."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)(
        _CapData(effective & 0xFFFFFFFF, permitted & 0xFFFFFFFF, inheritable & 0xFFFFFFFF),
        _CapData(effective >> 32, permitted >> 32, inheritable >> 32))
    return header, data


def capset_thread(effective: int, permitted: int, inheritable: int) -> None:
    header, data = _capset_args(effective, permitted, inheritable)
    _check(_syscall(SYS_CAPSET, ctypes.byref(header), data))
