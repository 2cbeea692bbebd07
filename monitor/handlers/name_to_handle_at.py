"""name_to_handle_at(dirfd, pathname, handle, mount_id, flags), emulated for a target.

Mirrors fs/fhandle.c step by step so that errors come in the kernel's order: flags, the
path walk (as the target, from the target's dirfd/cwd/root), EOPNOTSUPP, the handle header,
handle_bytes, EOVERFLOW, then the writes (mount id first, then the handle).
"""

from __future__ import annotations

import errno
import os
import stat
import struct

from monitor import linux
from monitor.credentials import acting_as
from monitor.handlers.base import CallContext, Return
from monitor.plane.target_thread import SyscallError, TargetThread
from monitor.policy import check_resolved
from protocol import kernel, refusals, signed_handle


def probe_kernel_flags() -> int:
    """The flags this kernel's name_to_handle_at accepts (EINVAL for the others)."""
    accepted = kernel.AT_SYMLINK_FOLLOW | kernel.AT_EMPTY_PATH
    for flag in (kernel.AT_HANDLE_FID, kernel.AT_HANDLE_MNT_ID_UNIQUE,
                 kernel.AT_HANDLE_CONNECTABLE):
        try:
            linux.name_to_handle_at(kernel.AT_FDCWD, b"/", flag)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                continue
        accepted |= flag
    return accepted


ACCEPTED_FLAGS = probe_kernel_flags()
_INT = struct.Struct("<i")
_U64 = struct.Struct("<Q")


def _same_root_as_ours(root_fd: int) -> bool:
    ours = os.stat("/")
    theirs = os.fstat(root_fd)
    return (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino) and linux.mount_id(
        root_fd) == _our_root_mount()


_root_mount: int | None = None


def _our_root_mount() -> int:
    global _root_mount
    if _root_mount is None:
        fd = os.open("/", os.O_PATH | os.O_CLOEXEC)
        try:
            _root_mount = linux.mount_id(fd)
        finally:
            os.close(fd)
    return _root_mount


def resolve(thread: TargetThread, dirfd: int, path: bytes, follow: bool) -> int:
    """The object the target's own lookup would find, as an O_PATH fd of ours.

    The walk runs with the target's credentials (search permission is checked as for the
    target). Magic links (/proc/PID/fd/N and friends) are refused with ELOOP: they would
    resolve in fhmon's context, not the target's.
    """
    resolve_flags = kernel.RESOLVE_NO_MAGICLINKS
    if path.startswith(b"/"):
        base = thread.open_root()
        if not _same_root_as_ours(base):
            resolve_flags |= kernel.RESOLVE_IN_ROOT
    elif dirfd == kernel.AT_FDCWD:
        base = thread.open_cwd()
    else:
        base = thread.take_fd(dirfd, check=False)  # validated by the status read or the write
    if not path:
        return base
    try:
        open_flags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
        try:
            with acting_as(thread.status.credentials):
                return linux.openat2(base, path, open_flags, resolve_flags)
        except OSError as exc:
            raise SyscallError(exc.errno or errno.EINVAL) from None
    finally:
        os.close(base)


def name_to_handle_at(ctx: CallContext) -> Return:
    args = ctx.notif.args
    dirfd = kernel.arg_int(args[0])
    path_ptr = kernel.arg_ptr(args[1])
    handle_ptr = kernel.arg_ptr(args[2])
    mount_id_ptr = kernel.arg_ptr(args[3])
    flags = kernel.arg_int(args[4])

    if flags & ~ACCEPTED_FLAGS:
        raise SyscallError(errno.EINVAL)
    if flags & kernel.AT_HANDLE_CONNECTABLE and flags & (kernel.AT_HANDLE_FID
                                                         | kernel.AT_EMPTY_PATH):
        raise SyscallError(errno.EINVAL)

    # resolve() validates next; the handle header comes along in the same read
    path = ctx.thread.read_path(path_ptr, check=False, prefetch=(handle_ptr, 8))
    if not path and not flags & kernel.AT_EMPTY_PATH:
        raise SyscallError(errno.ENOENT)
    obj = resolve(ctx.thread, dirfd, path, bool(flags & kernel.AT_SYMLINK_FOLLOW))
    try:
        mode, obj_mount = linux.statx_mode_mount(obj)
        check_resolved(ctx.share, obj, obj_mount)
        handle_type, kernel_bytes, mnt = _kernel_handle(obj, flags)
    finally:
        os.close(obj)
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise SyscallError.refusing(refusals.FILE_TYPE_NO_HANDLE)
    if len(kernel_bytes) > signed_handle.MAX_KERNEL_HANDLE_SIZE:
        raise SyscallError.refusing(refusals.HANDLE_TOO_LARGE)

    # write() validates before anything reaches the target
    header = kernel.FileHandleHeader.parse(ctx.thread.read_exact(handle_ptr, 8, check=False))
    if header.handle_bytes > kernel.MAX_HANDLE_SZ:
        raise SyscallError(errno.EINVAL)
    f_handle = (ctx.keys.sign(ctx.share.facts.share_id, handle_type, kernel_bytes) if ctx.signing
                else kernel_bytes)
    mount_bytes = (_U64.pack(mnt) if flags & kernel.AT_HANDLE_MNT_ID_UNIQUE
                   else _INT.pack(_signed32(mnt)))
    if len(f_handle) > header.handle_bytes:
        ctx.thread.write((mount_id_ptr, mount_bytes), (handle_ptr, kernel.FileHandleHeader(
            len(f_handle), kernel.FILEID_INVALID).pack()))
        raise SyscallError(errno.EOVERFLOW)
    ctx.thread.write((mount_id_ptr, mount_bytes),
                     (handle_ptr, kernel.pack_file_handle(handle_type, f_handle)))
    return Return(0)


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _kernel_handle(obj: int, flags: int) -> tuple[int, bytes, int]:
    """The kernel's own answer for the object, with a buffer that is always big enough."""
    passthrough = flags & (kernel.AT_HANDLE_FID | kernel.AT_HANDLE_MNT_ID_UNIQUE)
    try:
        if flags & kernel.AT_HANDLE_CONNECTABLE:
            return linux.name_to_handle_at(
                kernel.AT_FDCWD, f"/proc/self/fd/{obj}".encode(),
                passthrough | kernel.AT_HANDLE_CONNECTABLE | kernel.AT_SYMLINK_FOLLOW)
        return linux.name_to_handle_at(obj, b"", passthrough | kernel.AT_EMPTY_PATH)
    except OSError as exc:
        raise SyscallError(exc.errno or errno.EINVAL) from None
