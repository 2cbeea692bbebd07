"""open_by_handle_at(mount_fd, handle, flags), emulated for a target.

Kernel checks first and in the kernel's order (header EFAULT, handle_bytes EINVAL, type
EINVAL, handle bytes EFAULT, mount_fd EBADF); then the MAC (ESTALE), the decode on the
share's own mount, the inside-the-share check, and the open itself with the target's
credentials. The handler returns the opened fd (InjectFd); the answerer (monitor/handlers/reply.py)
hands it over through ADDFD with SECCOMP_ADDFD_FLAG_SEND, which installs it and answers
the call in one step.

O_PATH: ADDFD cannot carry O_PATH files, so an O_PATH request gets a real open instead:
O_RDONLY|O_DIRECTORY for a directory, O_RDONLY (else O_WRONLY) for a regular file, each
checked against the target's own permissions. When neither is permitted but the target
could chmod itself read access right now (it owns the object, on a writable local
filesystem, and the inode is neither immutable nor append-only), it gets a read-only fd
opened by fhmon: virtiofsd keeps O_PATH fds to its own mode-000 files and execute-only
directories. Otherwise EACCES, the answer of the target's own open(2). See
docs/semantics.md.

Nothing here may wait in the kernel on a target's behalf: this plane answers every target
on one thread. A regular file is opened O_NONBLOCK (cleared afterwards unless the target
asked for it), so that a file lease someone holds (the target itself, even) is answered
EWOULDBLOCK at once, the lease break started, instead of waiting lease-break-time where
the kernel would make the target's own open wait (the native plane waits, on the
target's own thread). The mount_fd memo keeps only fds on the share's filesystem, whose
last close cannot linger (a socket's can, with SO_LINGER).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from monitor import linux
from monitor.credentials import acting_as
from monitor.handlers.base import CallContext, InjectFd
from monitor.plane.target_thread import SyscallError
from monitor.policy import check_opened, chmod_would_succeed
from protocol import kernel, refusals

# Flags that only make sense for the open we do ourselves, or that the magic-link reopen
# would misread (O_NOFOLLOW would refuse the /proc/self/fd link itself).
_STRIP = kernel.O_CLOEXEC | kernel.O_NOFOLLOW | kernel.O_PATH


def open_by_handle_at(ctx: CallContext) -> InjectFd:
    args = ctx.notif.args
    mount_fd = kernel.arg_int(args[0])
    handle_ptr = kernel.arg_ptr(args[1])
    flags = kernel.arg_int(args[2])

    # One read for the header and the largest handle: the readable prefix says which of the
    # kernel's two copy_from_user calls would fault. No ID_VALID until the ADDFD, which
    # validates the notification itself: until then these bytes (maybe from a process that
    # reused a dead target's TID) steer only fhmon's own checks and errno answers, and an
    # answer to a notification that is gone reaches nobody. (A policy refusal is audited
    # only after an ID_VALID: monitor/plane/audit.py.)
    raw = ctx.thread.read_prefix(handle_ptr, 8 + kernel.MAX_HANDLE_SZ)
    if len(raw) < 8:
        raise SyscallError(errno.EFAULT)
    header = kernel.FileHandleHeader.parse(raw[:8])
    if header.handle_bytes == 0 or header.handle_bytes > kernel.MAX_HANDLE_SZ:
        raise SyscallError(errno.EINVAL)
    if not kernel.handle_type_is_valid(header.handle_type):
        raise SyscallError(errno.EINVAL)
    if len(raw) < 8 + header.handle_bytes:
        raise SyscallError(errno.EFAULT)
    f_handle = raw[8 : 8 + header.handle_bytes]
    mount_dev = ctx.thread.mount_fd_device(mount_fd, ctx.share.facts.dev)

    if ctx.signing:
        kernel_bytes = ctx.keys.verify(ctx.share.facts.share_id, header.handle_type, f_handle)
        if kernel_bytes is None:
            raise SyscallError.refusing(refusals.MAC_INVALID)
    else:
        kernel_bytes = f_handle
    if mount_dev != ctx.share.facts.dev:
        raise SyscallError.refusing(refusals.MOUNT_FD_FOREIGN)
    try:
        obj = linux.open_by_handle_at(ctx.share.dir_fd, header.handle_type, kernel_bytes,
                                      os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise SyscallError(exc.errno or errno.ESTALE) from None
    try:
        mode, obj_mount = linux.statx_mode_mount(obj)
        is_dir = stat.S_ISDIR(mode)
        if not (is_dir or stat.S_ISREG(mode)):
            raise SyscallError.refusing(refusals.FILE_TYPE_REFUSED)
        check_opened(ctx.share, obj, is_dir, obj_mount)
        opened = _reopen_as_target(ctx, obj, flags, is_dir)
    finally:
        os.close(obj)
    # answered by ADDFD|SEND (monitor/handlers/reply.py), which closes `opened`
    return InjectFd(opened, cloexec=bool(flags & kernel.O_CLOEXEC))


def _reopen_as_target(ctx: CallContext, obj: int, flags: int, is_dir: bool) -> int:
    creds = ctx.thread.status.credentials
    if flags & kernel.O_PATH:
        if flags & kernel.O_DIRECTORY and not is_dir:
            raise SyscallError(errno.ENOTDIR)
        attempts = ([os.O_RDONLY | os.O_DIRECTORY] if is_dir else [os.O_RDONLY, os.O_WRONLY])
    else:
        attempts = [(flags & ~_STRIP) | os.O_NOCTTY]
    first_error = 0  # the answer is the first attempt's error (O_RDONLY for O_PATH)
    keep_nonblock = bool(flags & os.O_NONBLOCK) and not flags & kernel.O_PATH
    with acting_as(creds, reopen_only=True):
        for attempt in attempts:
            try:
                return _reopen_without_waiting(obj, attempt, is_dir, keep_nonblock)
            except OSError as exc:
                first_error = first_error or exc.errno or errno.EACCES
    if flags & kernel.O_PATH and first_error == errno.EACCES and chmod_would_succeed(
            obj, creds.fsuid):
        # The target could chmod itself read access right now and then open it, so a
        # read-only fd grants it nothing new; opened by fhmon (CAP_DAC_READ_SEARCH passes
        # the read check), after _chmod_would_succeed asked the open file once more.
        fd = _reopen_without_waiting(obj, attempts[0], is_dir, keep_nonblock=False)
        if chmod_would_succeed(fd, creds.fsuid):
            return fd
        os.close(fd)
    raise SyscallError(first_error)


def _reopen_without_waiting(obj: int, flags: int, is_dir: bool, keep_nonblock: bool) -> int:
    """linux.reopen, O_NONBLOCK for a regular file so that a lease on it is answered
    EWOULDBLOCK instead of waited for (see the module's docstring); the flag is cleared
    again unless the target asked for it."""
    if is_dir:
        return linux.reopen(obj, flags | os.O_CLOEXEC)
    fd = linux.reopen(obj, flags | os.O_NONBLOCK | os.O_CLOEXEC)
    if not keep_nonblock:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        except BaseException:
            os.close(fd)
            raise
    return fd
