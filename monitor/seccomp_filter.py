"""The target-side filter: USER_NOTIF for the two handle syscalls, ALLOW for the rest.

pyseccomp (libseccomp) compiles the BPF program, including the architecture check that
refuses non-native ABIs (i386, x32) with ENOSYS. We load the program ourselves with the
seccomp(2) syscall so that SECCOMP_FILTER_FLAG_NEW_LISTENER's fd comes straight back as the
return value, without reaching into libseccomp's private state.
"""

from __future__ import annotations

import ctypes
import errno
import os

import pyseccomp

SYS_SECCOMP = 317
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
PR_SET_NO_NEW_PRIVS = 38
TRAPPED_SYSCALLS = ("name_to_handle_at", "open_by_handle_at")


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def build_program(syscalls: tuple[str, ...] = TRAPPED_SYSCALLS) -> bytes:
    """The raw BPF program (struct sock_filter[]), native architecture only."""
    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    flt.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.ERRNO(errno.ENOSYS))
    for name in syscalls:
        flt.add_rule(pyseccomp.NOTIFY, name)
    memfd = os.memfd_create("fhmon-bpf", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(memfd), "wb") as out:
            flt.export_bpf(out)
        size = os.lseek(memfd, 0, os.SEEK_END)
        return os.pread(memfd, size, 0)
    finally:
        os.close(memfd)


def install(program: bytes) -> int:
    """Set NO_NEW_PRIVS, load the program on the calling thread, return the listener fd."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(NO_NEW_PRIVS): {os.strerror(err)}")
    if len(program) % 8 or not program:
        raise ValueError("a BPF program is a non-empty array of 8-byte instructions")
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    fd = libc.syscall(SYS_SECCOMP, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER,
                      ctypes.byref(prog))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp(SET_MODE_FILTER, NEW_LISTENER): {os.strerror(err)}")
    os.set_inheritable(fd, False)
    return int(fd)


