"""Thin ctypes wrappers for the Linux syscalls Python's os module lacks.

Each wrapper raises OSError(errno) exactly as the kernel answered, so callers can hand the
kernel's own errno back to a target.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import signal
import struct
import threading
from collections.abc import Sequence
from typing import Final

from protocol import kernel
from protocol.kernel import PAGE_SIZE, split_page_ranges

# Why not ctypes.CDLL(use_errno=True) with c_int-wrapped arguments: on this class of machine
# that costs ~2 us a call, of which the syscall itself is ~0.2 us (measured: plain ints and no
# errno swapping ~0.85 us; the two ctypes features cost the rest). fhmon makes about ten of
# these per emulated call, so:
# - PyDLL: the GIL stays held (no release/re-acquire); only for syscalls that do not wait on
#   another process. A call that may wait (RECV, ADDFD) goes through fcntl.ioctl instead;
# - no use_errno: on failure errno is read from glibc's thread-local errno right away; nothing
#   runs in between on this OS thread that could change it (the GIL is never released);
# - plain Python ints and bytes as arguments, into per-thread scratch buffers. A plain int
#   travels as a C int: a sixth syscall argument goes on the stack, where the upper half of
#   its 8-byte slot is not cleared, so an argument that must be 0 there is passed as None.
_libc = ctypes.PyDLL(None)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_errno_location = _libc.__errno_location
_errno_location.restype = ctypes.c_void_p


def _errno() -> int:
    return ctypes.c_int.from_address(_errno_location()).value


def _check(result: int) -> int:
    if result < 0:
        err = _errno()
        raise OSError(err, os.strerror(err))
    return result


class _Scratch(threading.local):
    """Per-thread buffers reused by every call (the trio thread and any RECV worker), with
    their pointers prebuilt: a ctypes pointer object costs ~0.25 us to make."""

    def __init__(self) -> None:
        self.iov = ctypes.create_string_buffer(16 * _MAX_IOV)  # struct iovec[_MAX_IOV]
        self.iov_ptr = ctypes.c_void_p(ctypes.addressof(self.iov))
        self.local_iov = ctypes.create_string_buffer(16)
        self.local_iov_ptr = ctypes.c_void_p(ctypes.addressof(self.local_iov))
        self.iovecs = (self.iov, self.iov_ptr, self.local_iov, self.local_iov_ptr)
        self.data = bytearray(_DATA_SIZE)
        self.data_addr = ctypes.addressof((ctypes.c_char * _DATA_SIZE).from_buffer(self.data))
        self.data_view = memoryview(self.data)
        self.handle = ctypes.create_string_buffer(8 + 128)
        self.mnt = ctypes.create_string_buffer(8)
        self.statx = ctypes.create_string_buffer(256)


_MAX_IOV: Final = 8
_DATA_SIZE: Final = 2 * PAGE_SIZE  # a PATH_MAX read, with room to spare
_scratch = _Scratch()
_IOV = struct.Struct("<QQ")
_HANDLE_HEADER = struct.Struct("<Ii")


def _iovecs(regions: Sequence[tuple[int, int]]) -> tuple[list[tuple[int, int]], int]:
    """One remote iovec per page touched, and their total length: process_vm_readv/writev
    never split an iovec, so this is what makes a short count say exactly where the
    accessible memory ends."""
    ranges: list[tuple[int, int]] = []
    total = 0
    for addr, length in regions:
        if addr % PAGE_SIZE + length <= PAGE_SIZE:
            ranges.append((addr, length))  # the common case, without the general split
        else:
            ranges.extend(split_page_ranges(addr, length))
        total += length
    return ranges, total


def pidfd_open(pid: int, flags: int = 0) -> int:
    return _check(_syscall(kernel.SYS_PIDFD_OPEN, pid, flags))


def pidfd_alive(pidfd: int) -> bool:
    """Signal 0 through the pidfd: does its task (thread, for PIDFD_THREAD) still live?
    The standard library's wrapper: 0.5 us against ctypes' 0.9 (bench.levers), on every
    open_by_handle_at; it raises ProcessLookupError (ESRCH) for a task that is gone."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except OSError:
        return False
    return True


def pidfd_getfd(pidfd: int, targetfd: int) -> int:
    return _check(_syscall(kernel.SYS_PIDFD_GETFD, pidfd, targetfd, 0))


def process_vm_read_regions(pid: int, regions: Sequence[tuple[int, int]]) -> bytes:
    """Read several (addr, length) regions in one call, concatenated: the readable prefix,
    which stops (page-exact) at the first page that cannot be read."""
    ranges, length = _iovecs(regions)
    if length <= _DATA_SIZE:
        got = _transfer(kernel.SYS_PROCESS_VM_READV, pid, ranges, _scratch.data_addr, length)
        return _scratch.data_view[:got].tobytes()
    buf = ctypes.create_string_buffer(length)
    got = _transfer(kernel.SYS_PROCESS_VM_READV, pid, ranges, ctypes.addressof(buf), length)
    return buf.raw[:got]


def process_vm_write(pid: int, chunks: Sequence[tuple[int, bytes]]) -> int:
    """Write each (addr, data) in order in one call; returns the bytes written, which stop
    (page-exact) at the first page that cannot be written."""
    payload = b"".join([data for _, data in chunks])
    ranges, size = _iovecs([(addr, len(data)) for addr, data in chunks])
    if not size:
        return 0
    if size <= _DATA_SIZE:
        _scratch.data[:size] = payload
        return _transfer(kernel.SYS_PROCESS_VM_WRITEV, pid, ranges, _scratch.data_addr, size)
    local = ctypes.create_string_buffer(payload, size)
    return _transfer(kernel.SYS_PROCESS_VM_WRITEV, pid, ranges, ctypes.addressof(local), size)


def _transfer(nr: int, pid: int, ranges: Sequence[tuple[int, int]], local_addr: int,
              length: int) -> int:
    """process_vm_readv/writev (nr) between length bytes at local_addr and the remote
    ranges, one iovec each: the bytes moved, 0 when the first remote iovec faults."""
    iov, iov_ptr, local_iov, local_iov_ptr = _scratch.iovecs  # one thread-local lookup
    if len(ranges) > _MAX_IOV:
        iov = ctypes.create_string_buffer(16 * len(ranges))
        iov_ptr = ctypes.c_void_p(ctypes.addressof(iov))
    offset = 0
    for start, size in ranges:
        _IOV.pack_into(iov, offset, start, size)
        offset += 16
    _IOV.pack_into(local_iov, 0, local_addr, length)
    got = _syscall(nr, pid, local_iov_ptr, 1, iov_ptr, len(ranges), None)
    if got < 0:
        err = _errno()
        if err == errno.EFAULT:  # at the first remote iovec: nothing moved
            return 0
        raise OSError(err, os.strerror(err))
    return int(got)


def name_to_handle_at(dirfd: int, path: bytes, flags: int,
                      capacity: int = 128) -> tuple[int, bytes, int]:
    """The kernel's own call: (handle_type, f_handle bytes, mount id)."""
    scratch = _scratch
    buf = scratch.handle if capacity <= 128 else ctypes.create_string_buffer(8 + capacity)
    _HANDLE_HEADER.pack_into(buf, 0, capacity, 0)
    _check(_syscall(kernel.SYS_NAME_TO_HANDLE_AT, dirfd, path, buf, scratch.mnt, flags))
    hb, ht = _HANDLE_HEADER.unpack_from(buf, 0)
    (mnt,) = _U64.unpack_from(scratch.mnt, 0)
    if not flags & kernel.AT_HANDLE_MNT_ID_UNIQUE:
        mnt &= 0xFFFFFFFF  # the kernel wrote an int: the upper half is stale
    return ht, buf.raw[8 : 8 + hb], mnt


def open_by_handle_at(mount_fd: int, handle_type: int, f_handle: bytes, flags: int) -> int:
    raw = _HANDLE_HEADER.pack(len(f_handle), handle_type) + f_handle
    return _check(_syscall(kernel.SYS_OPEN_BY_HANDLE_AT, mount_fd, raw, flags))


# The one call here whose cost a target chooses: the walk of its path, which a target can
# make take seconds (symlink chains climbing thousands of mounts it stacked in its own
# namespace). It goes through CDLL, which releases the GIL for the syscall (and keeps errno
# per thread), so that such a walk holds only the thread that makes it, never every
# thread of fhmon (the intake, `fhmon probe`, the native plane's fallbacks).
_libc_releasing = ctypes.CDLL(None, use_errno=True)
_syscall_releasing = _libc_releasing.syscall
_syscall_releasing.restype = ctypes.c_long


def openat2(dirfd: int, path: bytes, flags: int, resolve: int, mode: int = 0) -> int:
    how = kernel.OPEN_HOW.pack(flags & 0xFFFFFFFFFFFFFFFF, mode, resolve)
    fd = _syscall_releasing(ctypes.c_long(kernel.SYS_OPENAT2), ctypes.c_long(dirfd), path,
                            how, ctypes.c_long(kernel.OPEN_HOW.size))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


def mount_id(fd: int) -> int:
    """The unique (never reused) mount id of an fd's mount, from statx."""
    return statx_mode_mount(fd)[1]


def statx_mode_mount(fd: int) -> tuple[int, int]:
    """(st_mode, unique mount id) of an fd in one statx."""
    buf = _scratch.statx
    _check(_syscall(kernel.SYS_STATX, fd, b"", kernel.AT_EMPTY_PATH,
                    kernel.STATX_TYPE | kernel.STATX_MODE | kernel.STATX_MNT_ID_UNIQUE, buf))
    mask, mode, mnt = kernel.STATX_FIELDS.unpack_from(buf, 0)
    if not mask & (kernel.STATX_MNT_ID_UNIQUE | kernel.STATX_MNT_ID):
        raise OSError(errno.EOPNOTSUPP, "statx reports no mount id")
    return mode, mnt


def statx_identity(fd: int, unique: bool = True) -> tuple[int, int, int, int]:
    """(st_mode, st_dev, st_ino, mount id) of an fd in one statx: the unique mount id, or
    the old (reusable, /proc/PID/mountinfo's first field) one when unique is False."""
    buf = _scratch.statx
    wanted = (kernel.STATX_TYPE | kernel.STATX_MODE | kernel.STATX_INO
              | (kernel.STATX_MNT_ID_UNIQUE if unique else kernel.STATX_MNT_ID))
    _check(_syscall(kernel.SYS_STATX, fd, b"", kernel.AT_EMPTY_PATH, wanted, buf))
    mask, mode, ino, major, minor, mnt = kernel.STATX_IDENTITY.unpack_from(buf, 0)
    if not mask & (kernel.STATX_MNT_ID_UNIQUE | kernel.STATX_MNT_ID):
        raise OSError(errno.EOPNOTSUPP, "statx reports no mount id")
    return mode, os.makedev(major, minor), ino, mnt


def fstatfs(fd: int) -> tuple[int, bytes, int]:
    """(f_type, f_fsid's 8 bytes, f_flags) of the filesystem an fd is on (O_PATH fds too);
    f_flags has ST_RDONLY when the mount or the superblock is read-only."""
    buf = ctypes.create_string_buffer(kernel.STATFS.size)
    _check(_syscall(kernel.SYS_FSTATFS, fd, buf))
    f_type, fsid, f_flags = kernel.STATFS.unpack_from(buf, 0)
    return f_type, fsid, f_flags


def fs_uuid(fd: int) -> bytes:
    """The superblock's UUID (kernel.FS_IOC_GETFSUUID, 6.5+) of an open (not O_PATH) fd's
    filesystem; b"" where the filesystem has none or the kernel lacks the ioctl."""
    buf = bytearray(kernel.FSUUID2_SIZE)
    try:
        fcntl.ioctl(fd, kernel.FS_IOC_GETFSUUID, buf, True)
    except OSError:
        return b""
    return bytes(buf[1 : 1 + min(buf[0], kernel.FSUUID2_SIZE - 1)])


_U64 = struct.Struct("<Q")


def kcmp_same_file(fd1: int, fd2: int) -> bool:
    pid = _ThisProcess.pid
    return _check(_syscall(kernel.SYS_KCMP, pid, pid, kernel.KCMP_FILE, fd1, fd2)) == 0


def is_open_file_of(pid: int, fd: int, ours: int) -> bool:
    """Whether process (or thread) pid's fd is the open file our fd `ours` duplicates; False
    too when pid or its fd is gone (kcmp's ESRCH, EBADF)."""
    return int(_syscall(kernel.SYS_KCMP, pid, _ThisProcess.pid, kernel.KCMP_FILE, fd, ours)) == 0


# --- per-thread credentials -------------------------------------------------------------
# glibc's setgroups() and friends change every thread (its setxid broadcast); the raw
# syscalls change only the calling thread, which is what a temporary switch needs.

def setfsuid(uid: int) -> int:
    """Per-thread by nature (glibc's wrapper is the bare syscall too); returns the old fsuid."""
    return int(_syscall(kernel.SYS_SETFSUID, uid))


def setfsgid(gid: int) -> int:
    return int(_syscall(kernel.SYS_SETFSGID, gid))


@functools.lru_cache(maxsize=256)
def _groups_array(groups: tuple[int, ...]) -> ctypes.Array[ctypes.c_uint]:
    return (ctypes.c_uint * max(1, len(groups)))(*groups)


def setgroups_thread(groups: tuple[int, ...]) -> None:
    _check(_syscall(kernel.SYS_SETGROUPS, len(groups), _groups_array(groups)))


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32))


def capget_thread() -> tuple[int, int, int]:
    """(effective, permitted, inheritable) of the calling thread, as 64-bit masks."""
    header = _CapHeader(kernel.LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_syscall(kernel.SYS_CAPGET, ctypes.byref(header), data))
    return (data[0].effective | data[1].effective << 32,
            data[0].permitted | data[1].permitted << 32,
            data[0].inheritable | data[1].inheritable << 32)


@functools.lru_cache(maxsize=64)
def _capset_args(effective: int, permitted: int,
                 inheritable: int) -> tuple[_CapHeader, ctypes.Array[_CapData]]:
    """Prebuilt capset(2) arguments: credential switches run on every call."""
    header = _CapHeader(kernel.LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)(
        _CapData(effective & 0xFFFFFFFF, permitted & 0xFFFFFFFF, inheritable & 0xFFFFFFFF),
        _CapData(effective >> 32, permitted >> 32, inheritable >> 32))
    return header, data


def capset_thread(effective: int, permitted: int, inheritable: int) -> None:
    header, data = _capset_args(effective, permitted, inheritable)
    _check(_syscall(kernel.SYS_CAPSET, ctypes.byref(header), data))


# --- this process: its pid, its own fds by number ------------------------------------------

class _ThisProcess:
    """What a call needs about fhmon's own process, kept rather than asked each time, and
    renewed in a forked child (whose pid and /proc/self differ):
    - the pid: os.getpid() is a syscall each time (glibc caches no pid);
    - an open /proc/self/fd: opening or reading a link relative to it walks one path
      component instead of four ("/proc", "self", "fd", N), ~0.9 us less for each of the
      per-call readlinks (the inside-the-share checks) and reopens (open_by_handle_at).
      Opened on first use, or by open_own_fd_dir at startup."""

    pid = os.getpid()
    fd_dir = -1

    @classmethod
    def own_fd_dir(cls) -> int:
        if cls.fd_dir < 0:
            cls.fd_dir = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return cls.fd_dir

    @classmethod
    def after_fork_in_child(cls) -> None:
        cls.pid = os.getpid()
        if cls.fd_dir >= 0:
            os.close(cls.fd_dir)
            cls.fd_dir = -1


os.register_at_fork(after_in_child=_ThisProcess.after_fork_in_child)


def open_own_fd_dir() -> None:
    """Open it now (at startup, so that fd baselines include it)."""
    _ThisProcess.own_fd_dir()


def fd_path(fd: int) -> str:
    """The path of one of fhmon's own fds, as the kernel prints it (d_path)."""
    return os.readlink(str(fd), dir_fd=_ThisProcess.own_fd_dir())


def reopen(fd: int, flags: int) -> int:
    """open("/proc/self/fd/FD", flags): a new open file for the object fd names, with the
    permission checks of an open (O_NOFOLLOW would refuse the link itself)."""
    return os.open(str(fd), flags, dir_fd=_ThisProcess.own_fd_dir())
