"""The target-side filter: USER_NOTIF for the two handle syscalls, ALLOW for the rest.

pyseccomp (libseccomp) compiles the BPF program, including the architecture check that
refuses non-native ABIs (i386, x32) with ENOSYS. We load the program ourselves with the
seccomp(2) syscall so that kernel.SECCOMP_FILTER_FLAG_NEW_LISTENER's fd comes straight back as the
return value, without reaching into libseccomp's private state.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket

import pyseccomp

from monitor import fdpass
from protocol import kernel

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
    if libc.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(NO_NEW_PRIVS): {os.strerror(err)}")
    if len(program) % 8 or not program:
        raise ValueError("a BPF program is a non-empty array of 8-byte instructions")
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    fd = libc.syscall(kernel.SYS_SECCOMP, kernel.SECCOMP_SET_MODE_FILTER,
                      kernel.SECCOMP_FILTER_FLAG_NEW_LISTENER, ctypes.byref(prog))
    if fd < 0:
        err = ctypes.get_errno()
        if err == errno.EBUSY:
            raise ListenerBusy(ALREADY_LISTENED)
        raise OSError(err, f"seccomp(SET_MODE_FILTER, NEW_LISTENER): {os.strerror(err)}")
    os.set_inheritable(fd, False)
    return int(fd)




class FilterSetupError(Exception):
    """The child could not drop to its user or install the filter; the text says why."""


class ListenerBusy(FilterSetupError):
    """The kernel allows one notify listener per filter chain: a second NEW_LISTENER in a
    process that already runs under one fails with EBUSY."""


ALREADY_LISTENED = (
    "this process already runs under another seccomp notify listener (a container "
    "runtime's seccomp agent, or an enclosing `fhmon launch`), and the kernel allows only "
    "one (EBUSY): run fhmon launch outside it, or register the process through that agent")


_LISTENER, _ERROR, _GO, _EXEC_FAILED = b"L", b"E", b"G", b"X"


def fork_under_filter(user: tuple[int, int] | None = None, argv: list[str] | None = None,
                      timeout: float | None = 30.0) -> tuple[int, int, socket.socket]:
    """Fork a child that drops to `user` (uid, gid), installs the handle filter and hands
    its listener back; returns (pid, listener, channel). The child keeps no copy of the
    listener (a target holding its own could answer its own calls). It then waits on the
    channel: `go(channel)` makes it exec argv (when given); closing the channel ends it.
    The child keeps its end open (close-on-exec) through execvp, so that a failed exec can
    still be reported: see `exec_outcome`.
    """
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # never returns
        parent_end.close()
        try:
            program = build_program()
            if user is not None:
                os.setgroups([])
                os.setgid(user[1])
                os.setuid(user[0])
            listener = install(program)
            fdpass.send_fd(child_end, _LISTENER, listener)
            os.close(listener)
            if child_end.recv(1) != _GO or argv is None:
                os._exit(126 if argv else 0)  # the parent gave up, or nothing to run
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            try:
                os.execvp(argv[0], argv)  # child_end is close-on-exec: EOF means it ran
            except OSError as exc:
                code = exc.errno or errno.ENOEXEC
                with contextlib.suppress(OSError):
                    child_end.sendall(_EXEC_FAILED + f"{code}\0{argv[0]}".encode(
                        errors="surrogateescape"))
                os._exit(exec_exit_status(code))
        except BaseException as exc:  # report to the parent, then die without cleanup
            with contextlib.suppress(OSError):
                name = argv[0] if argv else "child"
                text = str(exc) if isinstance(exc, FilterSetupError) else f"{name}: {exc}"
                child_end.sendall(_ERROR + text.encode(errors="replace"))
            os._exit(127)
    child_end.close()
    try:
        parent_end.settimeout(timeout)
        data, fds, _ = fdpass.recv_fds(parent_end, 4096, 4)
        parent_end.settimeout(None)
        if data[:1] != _LISTENER or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise FilterSetupError(data[1:].decode(errors="replace") or "the child exited")
    except BaseException:
        parent_end.close()
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    return pid, fds[0], parent_end


def go(channel: socket.socket) -> None:
    """Let a fork_under_filter child exec its command."""
    channel.sendall(_GO)


def exec_exit_status(code: int) -> int:
    """A shell's convention: 127 when the command is not there, 126 when it cannot run."""
    return 127 if code in (errno.ENOENT, errno.ENOTDIR) else 126


def exec_outcome(data: bytes) -> tuple[int, str] | None:
    """What the child's end of the channel said after `go`: None if the command runs
    (the channel closed on exec), else (errno, the command) for a failed execvp."""
    if not data.startswith(_EXEC_FAILED):
        return None
    code, _, command = data[1:].partition(b"\0")
    return (int(code) if code.isdigit() else errno.ENOEXEC,
            command.decode(errors="replace"))
