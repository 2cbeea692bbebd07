"""Kernel ABI for seccomp user notifications and file handles (x86_64).

Pure data: struct layouts, constants and ioctl numbers. Nothing here performs I/O, so
every layout is tested byte for byte without a kernel.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

# --- syscalls and architecture -------------------------------------------------------
AUDIT_ARCH_X86_64: Final = 0xC000003E
SYS_NAME_TO_HANDLE_AT: Final = 303
SYS_OPEN_BY_HANDLE_AT: Final = 304
X32_SYSCALL_BIT: Final = 0x40000000  # x32 calls: AUDIT_ARCH_X86_64 with this bit set

# --- seccomp user notification ioctls (include/uapi/linux/seccomp.h) -------------------
SECCOMP_IOCTL_NOTIF_RECV: Final = 0xC0502100
SECCOMP_IOCTL_NOTIF_SEND: Final = 0xC0182101
SECCOMP_IOCTL_NOTIF_ID_VALID: Final = 0x40082102
SECCOMP_IOCTL_NOTIF_ADDFD: Final = 0x40182103
SECCOMP_IOCTL_NOTIF_SET_FLAGS: Final = 0x40082104

SECCOMP_USER_NOTIF_FLAG_CONTINUE: Final = 1
SECCOMP_ADDFD_FLAG_SETFD: Final = 1
SECCOMP_ADDFD_FLAG_SEND: Final = 2
SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP: Final = 1

# --- *at() flags -------------------------------------------------------------------
AT_FDCWD: Final = -100
AT_SYMLINK_NOFOLLOW: Final = 0x100
AT_SYMLINK_FOLLOW: Final = 0x400
AT_EMPTY_PATH: Final = 0x1000
AT_HANDLE_FID: Final = 0x200
AT_HANDLE_MNT_ID_UNIQUE: Final = 0x001
AT_HANDLE_CONNECTABLE: Final = 0x002

# --- open(2) flags (x86_64 values) -----------------------------------------------------
O_ACCMODE: Final = 0o3
O_RDONLY: Final = 0o0
O_WRONLY: Final = 0o1
O_RDWR: Final = 0o2
O_CREAT: Final = 0o100
O_EXCL: Final = 0o200
O_NOCTTY: Final = 0o400
O_TRUNC: Final = 0o1000
O_APPEND: Final = 0o2000
O_NONBLOCK: Final = 0o4000
O_DIRECTORY: Final = 0o200000
O_NOFOLLOW: Final = 0o400000
O_CLOEXEC: Final = 0o2000000
O_PATH: Final = 0o10000000
O_LARGEFILE: Final = 0o100000
O_TMPFILE: Final = 0o20000000 | O_DIRECTORY

# --- file handles (include/linux/exportfs.h, fs/fhandle.c) -------------------------------
MAX_HANDLE_SZ: Final = 128
FILE_HANDLE_HEADER_SIZE: Final = 8
FILEID_INVALID: Final = 255
# exportfs handle types of a file with its parent (include/linux/exportfs.h, xfs)
FILEID_INO32_GEN: Final = 1
FILEID_INO32_GEN_PARENT: Final = 2
FILEID_INO64_GEN: Final = 0x81  # xfs's 64-bit
FILEID_INO64_GEN_PARENT: Final = 0x82
FILEID_IS_CONNECTABLE: Final = 0x10000
FILEID_IS_DIR: Final = 0x20000
FILEID_USER_FLAGS_MASK: Final = 0xFFFF0000
FILEID_VALID_USER_FLAGS: Final = FILEID_IS_CONNECTABLE | FILEID_IS_DIR

PATH_MAX: Final = 4096
PAGE_SIZE: Final = 4096

# --- the rest of the kernel fhmon's monitor uses (x86_64) ------------------------------
# syscalls Python's standard library does not wrap (monitor/linux.py), and seccomp's own
SYS_SETGROUPS: Final = 116
SYS_SETFSUID: Final = 122
SYS_SETFSGID: Final = 123
SYS_CAPGET: Final = 125
SYS_CAPSET: Final = 126
SYS_FSTATFS: Final = 138
SYS_PROCESS_VM_READV: Final = 310
SYS_PROCESS_VM_WRITEV: Final = 311
SYS_KCMP: Final = 312
SYS_SECCOMP: Final = 317
SYS_STATX: Final = 332
SYS_PIDFD_OPEN: Final = 434
SYS_OPENAT2: Final = 437
SYS_PIDFD_GETFD: Final = 438
PIDFD_THREAD: Final = 0o200  # pidfd_open(2): a thread, not a process (O_EXCL's bit)
# ioctl(pidfd, PIDFD_GET_INFO) (6.13+): _IOWR(0xFF, 11, struct pidfd_info) of the first,
# 64-byte version; PIDFD_INFO_CREDS asks for ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid
PIDFD_GET_INFO: Final = 0xC040FF0B
PIDFD_INFO_CREDS: Final = 0x2
PIDFD_INFO_SIZE_VER0: Final = 64
SECCOMP_SET_MODE_FILTER: Final = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER: Final = 1 << 3
KCMP_FILE: Final = 0
# openat2(2) resolve flags
RESOLVE_NO_XDEV: Final = 0x01
RESOLVE_NO_MAGICLINKS: Final = 0x02
RESOLVE_NO_SYMLINKS: Final = 0x04
RESOLVE_BENEATH: Final = 0x08
RESOLVE_IN_ROOT: Final = 0x10
# statx(2) mask bits
STATX_TYPE: Final = 0x1
STATX_MODE: Final = 0x2
STATX_INO: Final = 0x100
STATX_MNT_ID: Final = 0x1000
STATX_MNT_ID_UNIQUE: Final = 0x4000
# prctl(2) options
PR_SET_DUMPABLE: Final = 4
PR_CAPBSET_DROP: Final = 24
PR_SET_NO_NEW_PRIVS: Final = 38
# capabilities (linux/capability.h)
LINUX_CAPABILITY_VERSION_3: Final = 0x20080522
CAP_CHOWN: Final = 0
CAP_DAC_OVERRIDE: Final = 1
CAP_DAC_READ_SEARCH: Final = 2
CAP_FOWNER: Final = 3
CAP_KILL: Final = 5
CAP_SETGID: Final = 6
CAP_SETUID: Final = 7
CAP_SETPCAP: Final = 8
CAP_SYS_PTRACE: Final = 19
# inode attribute flags (linux/fs.h) and the filesystem UUID ioctl
FS_IOC_GETFLAGS: Final = 0x80086601
FS_IMMUTABLE_FL: Final = 0x10
FS_APPEND_FL: Final = 0x20
FS_IOC_GETFSUUID: Final = 0x80111500  # _IOR(0x15, 0, struct fsuuid2 {u8 len; u8 uuid[16]})
FSUUID2_SIZE: Final = 17
# statfs(2) f_type of the local filesystems fhmon trusts to keep their own promises
# (linux/magic.h): ext2/3/4, xfs, btrfs, tmpfs, f2fs
EXT4_SUPER_MAGIC: Final = 0xEF53
XFS_SUPER_MAGIC: Final = 0x58465342
BTRFS_SUPER_MAGIC: Final = 0x9123683E
TMPFS_MAGIC: Final = 0x01021994
F2FS_SUPER_MAGIC: Final = 0xF2F52010
# struct statfs: f_type long @0, ..., f_fsid 2 x int @56, f_namelen, f_frsize, f_flags long
# @80, f_spare[4]
STATFS: Final = struct.Struct("<q48x8s16xq32x")
# struct statx: stx_mask u32 @0, stx_mode u16 @28, stx_ino u64 @32, stx_dev_major u32 @136,
# stx_dev_minor u32 @140, stx_mnt_id u64 @144
STATX_FIELDS: Final = struct.Struct("<I24xH114xQ")
STATX_IDENTITY: Final = struct.Struct("<I24xH2xQ96xIIQ")
OPEN_HOW: Final = struct.Struct("<QQQ")  # openat2(2): flags, mode, resolve

_NOTIF = struct.Struct("<QIIiIQ6Q")
_RESP = struct.Struct("<QqiI")
_ADDFD = struct.Struct("<QIIII")
_HANDLE_HEADER = struct.Struct("<Ii")
_U64 = struct.Struct("<Q")

SECCOMP_NOTIF_SIZE: Final = _NOTIF.size  # 80
SECCOMP_NOTIF_RESP_SIZE: Final = _RESP.size  # 24
SECCOMP_NOTIF_ADDFD_SIZE: Final = _ADDFD.size  # 24


class Notification(NamedTuple):
    """One `struct seccomp_notif`: who called what, with which raw arguments.

    A NamedTuple rather than a frozen dataclass: one is built for every call, in 0.5 us
    instead of 1.3 (a frozen dataclass sets each field through object.__setattr__).
    """

    id: int
    pid: int  # a thread id, in the receiver's pid namespace
    flags: int
    nr: int
    arch: int
    instruction_pointer: int
    args: tuple[int, int, int, int, int, int]

    @classmethod
    def parse(cls, raw: bytes | bytearray | memoryview) -> Notification:
        if len(raw) != SECCOMP_NOTIF_SIZE:
            raise ValueError(f"seccomp_notif is {SECCOMP_NOTIF_SIZE} bytes, got {len(raw)}")
        v = _NOTIF.unpack(raw)
        return cls(v[0], v[1], v[2], v[3], v[4], v[5], v[6:])

    def pack(self) -> bytes:
        return _NOTIF.pack(self.id, self.pid, self.flags, self.nr, self.arch,
                           self.instruction_pointer, *self.args)


def pack_response(notif_id: int, *, val: int = 0, error: int = 0, flags: int = 0) -> bytes:
    """`struct seccomp_notif_resp`. `error` is a positive errno here; the ABI wants it negated."""
    if error < 0:
        raise ValueError("pass a positive errno")
    return _RESP.pack(notif_id, val, -error, flags)


def unpack_response(raw: bytes) -> tuple[int, int, int, int]:
    nid, val, error, flags = _RESP.unpack(raw)
    return nid, val, error, flags


def pack_addfd(notif_id: int, srcfd: int, *, newfd: int = 0, newfd_flags: int = 0,
               flags: int = 0) -> bytearray:
    """`struct seccomp_notif_addfd`, mutable so that fcntl.ioctl returns the ioctl's value."""
    return bytearray(_ADDFD.pack(notif_id, flags, srcfd, newfd, newfd_flags))


def pack_u64(value: int) -> bytes:
    return _U64.pack(value)


def arg_int(value: int) -> int:
    """A syscall's `int` argument: the low 32 bits of the register, sign-extended."""
    low = value & 0xFFFFFFFF
    return low - (1 << 32) if low & 0x80000000 else low


def arg_ptr(value: int) -> int:
    return value & 0xFFFFFFFFFFFFFFFF


class FileHandleHeader(NamedTuple):
    """The fixed part of `struct file_handle`: u32 handle_bytes; i32 handle_type.
    (A NamedTuple for the same reason as Notification: parsed on every call.)"""

    handle_bytes: int
    handle_type: int

    @classmethod
    def parse(cls, raw: bytes) -> FileHandleHeader:
        if len(raw) != FILE_HANDLE_HEADER_SIZE:
            raise ValueError("file_handle header is 8 bytes")
        return cls._make(_HANDLE_HEADER.unpack(raw))

    def pack(self) -> bytes:
        return _HANDLE_HEADER.pack(self.handle_bytes, self.handle_type)


def pack_file_handle(handle_type: int, f_handle: bytes) -> bytes:
    """A complete `struct file_handle` with handle_bytes = len(f_handle)."""
    return _HANDLE_HEADER.pack(len(f_handle), handle_type) + f_handle


def handle_type_is_valid(handle_type: int) -> bool:
    """The type check open_by_handle_at makes before it looks at the fs (EINVAL otherwise)."""
    if handle_type < 0:
        return False
    user_flags = handle_type & FILEID_USER_FLAGS_MASK
    return not (user_flags & ~FILEID_VALID_USER_FLAGS)


def split_page_ranges(addr: int, length: int) -> list[tuple[int, int]]:
    """Cut [addr, addr+length) at page boundaries, so a fault costs only the pages past it."""
    ranges: list[tuple[int, int]] = []
    end = addr + length
    while addr < end:
        chunk = min(end, (addr // PAGE_SIZE + 1) * PAGE_SIZE) - addr
        ranges.append((addr, chunk))
        addr += chunk
    return ranges
