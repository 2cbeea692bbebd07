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
import struct
from collections.abc import Iterable

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


def install(program: bytes, no_new_privs: bool = True) -> int:
    """Set NO_NEW_PRIVS, load the program on the calling thread, return the listener fd.
    no_new_privs=False loads it without (which needs CAP_SYS_ADMIN), as a container runtime
    does for a container that does not ask for noNewPrivileges."""
    libc = ctypes.CDLL(None, use_errno=True)
    if no_new_privs and libc.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
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


# The channel between fork_under_filter's parent and child. Child to parent: L (with the
# listener), E text (setup failed), X errno NUL command (exec failed), R text (a probe's
# outcome, empty for success). Parent to child: frames of kind, u32 length, payload:
# G (exec the fork's argv), A (exec this argv, NUL-separated), P (probe this share).
_LISTENER, _ERROR, _EXEC_FAILED, _PROBED = b"L", b"E", b"X", b"R"
_GO, _GO_WITH, _PROBE = b"G", b"A", b"P"
_FRAME = struct.Struct("=cI")
# Dispositions a command must get back: the forwarded ones, and those CPython ignores.
RESET_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ)


def fork_under_filter(user: tuple[int, int] | None = None, argv: list[str] | None = None,
                      timeout: float | None = 30.0,
                      signal_mask: Iterable[int] | None = None,
                      no_new_privs: bool = True,
                      ) -> tuple[int, int, socket.socket]:
    """Fork a child that drops to `user` (uid, gid), installs the handle filter and hands
    its listener back; returns (pid, listener, channel). The child keeps no copy of the
    listener (a target holding its own could answer its own calls). It then waits on the
    channel: `go(channel)` makes it exec argv (when given), `probe(channel, share)` makes it
    try the two trapped calls; closing the channel ends it.
    The child keeps its end open (close-on-exec) through execvp, so that a failed exec can
    still be reported: see `exec_outcome`.
    signal_mask: the mask the child sets just before exec (a caller that blocked signals
    around the fork, so that none arrives before it can forward them, passes the old one).
    no_new_privs=False: the child (root) loads the filter first and drops to `user` after,
    without no_new_privs, as runc does for a container without noNewPrivileges.
    """
    restore_mask = None if signal_mask is None else set(signal_mask)
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # never returns
        parent_end.close()
        try:
            program = build_program()
            listener = -1 if no_new_privs else install(program, no_new_privs=False)
            if user is not None:
                os.setgroups([])
                os.setgid(user[1])
                os.setuid(user[0])
            if no_new_privs:
                listener = install(program)
            fdpass.send_fd(child_end, _LISTENER, listener)
            os.close(listener)
            while True:
                kind, payload = _recv_frame(child_end)
                if kind == _PROBE:
                    outcome = probe_handles(payload.decode(errors="surrogateescape"))
                    child_end.sendall(_PROBED + outcome.encode(errors="replace") + b"\0")
                    continue
                break
            if kind == _GO_WITH:
                argv = [arg.decode(errors="surrogateescape") for arg in payload.split(b"\0")]
            if kind not in (_GO, _GO_WITH) or not argv:
                os._exit(126 if argv else 0)  # the parent gave up, or nothing to run
            for sig in RESET_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            if restore_mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, restore_mask)
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


def _recv_frame(sock: socket.socket) -> tuple[bytes, bytes]:
    """One parent-to-child frame; (b"", b"") when the parent closed its end."""
    head = _recv_exactly(sock, _FRAME.size)
    if len(head) < _FRAME.size:
        return b"", b""
    kind, length = _FRAME.unpack(head)
    payload = _recv_exactly(sock, length)
    return (kind, payload) if len(payload) == length else (b"", b"")


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def go(channel: socket.socket, argv: list[str] | None = None) -> None:
    """Let a fork_under_filter child exec its command, or `argv` instead when given."""
    if argv is None:
        channel.sendall(_FRAME.pack(_GO, 0))
        return
    payload = b"\0".join(arg.encode(errors="surrogateescape") for arg in argv)
    channel.sendall(_FRAME.pack(_GO_WITH, len(payload)) + payload)


def ask_probe(channel: socket.socket, share: str) -> None:
    """Make a fork_under_filter child try the two handle calls on `share` (see
    probe_handles); its answer comes back as `probe_outcome` of what it writes."""
    payload = share.encode(errors="surrogateescape")
    channel.sendall(_FRAME.pack(_PROBE, len(payload)) + payload)


def probe_outcome(data: bytes) -> str | None:
    """The probe's answer once complete: "" when both calls succeeded, else why not;
    None while it is incomplete."""
    if not data.endswith(b"\0"):
        return None
    if not data.startswith(_PROBED):
        return "the child did not answer the probe"
    return data[1:-1].decode(errors="replace")


class _FileHandle(ctypes.Structure):
    _fields_ = (("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * kernel.MAX_HANDLE_SZ))


def probe_handles(share: str) -> str:
    """What virtiofsd does at start-up, done here under the filter before exec: a handle of
    the shared directory's root (name_to_handle_at, AT_EMPTY_PATH on an O_PATH fd), then
    open_by_handle_at of it. "" when both succeed (so both reached whoever holds the
    listener: the kernel alone would refuse open_by_handle_at without CAP_DAC_READ_SEARCH),
    else the call and its errno. A runtime's seccomp profile that answers ERRNO outranks
    the filter's USER_NOTIF, and shows here as that errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        root = os.open(share, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot open the share {share}: {exc.strerror}"
    try:
        mount = os.open(share, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        os.close(root)
        return f"cannot open the share {share}: {exc.strerror}"
    try:
        handle = _FileHandle(handle_bytes=kernel.MAX_HANDLE_SZ)
        mount_id = ctypes.c_int()
        if libc.name_to_handle_at(root, b"", ctypes.byref(handle), ctypes.byref(mount_id),
                                  kernel.AT_EMPTY_PATH) != 0:
            return _failed("name_to_handle_at", ctypes.get_errno())
        fd = libc.open_by_handle_at(mount, ctypes.byref(handle), os.O_PATH | os.O_CLOEXEC)
        if fd < 0:
            return _failed("open_by_handle_at", ctypes.get_errno())
        os.close(fd)
        return ""
    finally:
        os.close(root)
        os.close(mount)


def _failed(call: str, err: int) -> str:
    return f"{call} of the share's root: {errno.errorcode.get(err, err)} ({os.strerror(err)})"


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
