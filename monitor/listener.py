"""The seccomp listener fd: the five ioctls, with Python's fcntl.ioctl traps handled.

fcntl.ioctl returns a copy of an immutable buffer instead of the ioctl's value, so every
call whose value matters (ADDFD returns the target's new fd number) passes a bytearray.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import select
import signal
import struct
import threading

from monitor import linux
from protocol import kernel

# pthread_sigmask through libc with prebuilt sets: signal.pthread_sigmask converts whole
# sets to enums and costs ~30 us a call, on every fd injection. PyDLL: it never blocks and
# returns its error, so neither the GIL hand-off nor errno swapping is needed.
_SIG_BLOCK, _SIG_SETMASK = int(signal.SIG_BLOCK), int(signal.SIG_SETMASK)  # plain ints
_sigmask = ctypes.PyDLL(None).pthread_sigmask
_sigmask.restype = ctypes.c_int
_sigmask.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_FULL_SET = ctypes.create_string_buffer(b"\xff" * 128, 128)  # sigset_t: 1024 bits
_SAVED = threading.local()  # each answering thread saves its own mask


def mark_signals_blocked() -> None:
    """The calling thread keeps every signal blocked for its whole life (the dispatch
    thread): its fd injections need not block them again (two syscalls a call)."""
    _SAVED.all_blocked = True


def _saved_set() -> ctypes.Array[ctypes.c_char]:
    saved = getattr(_SAVED, "set", None)
    if saved is None:
        saved = _SAVED.set = ctypes.create_string_buffer(128)
    return saved


class NotificationGone(Exception):
    """The notification is no longer valid: the target thread died or was interrupted."""


class Listener:
    """One seccomp user-notification listener fd, owned (and closed) by this object."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def hung_up(self) -> bool:
        """POLLHUP: no task uses the filter any more (RECV would block forever)."""
        return self.poll() is None

    def poll(self) -> bool | None:
        """One poll: None once hung up, else whether a call waits (RECV will not block)."""
        for _, events in self._poller.poll(0):
            if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                return None
            return bool(events & select.POLLIN)
        return False

    def receive_ready(self) -> kernel.Notification | None:
        """RECV when poll said a call waits: through fcntl.ioctl, cheaper than ctypes. None
        if the caller went away in between (ENOENT)."""
        buf = bytearray(kernel.SECCOMP_NOTIF_SIZE)
        try:
            fcntl.ioctl(self.fd, kernel.SECCOMP_IOCTL_NOTIF_RECV, buf, True)
        except OSError as exc:
            if exc.errno in (errno.EINTR, errno.ENOENT):
                return None
            raise
        return kernel.Notification.parse(buf)

    def id_valid(self, notif_id: int) -> bool:
        try:
            # a mutable buffer: with bytes, fcntl.ioctl builds a copy to return (~0.4 us)
            fcntl.ioctl(self.fd, kernel.SECCOMP_IOCTL_NOTIF_ID_VALID,
                        bytearray(kernel.pack_u64(notif_id)), True)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def ensure_valid(self, notif_id: int) -> None:
        if not self.id_valid(notif_id):
            raise NotificationGone(notif_id)

    def respond(self, notif_id: int, *, val: int = 0, error: int = 0) -> bool:
        """Answer a call; False if the target is gone (nothing to answer)."""
        buf = bytearray(kernel.pack_response(notif_id, val=val, error=error))
        try:
            fcntl.ioctl(self.fd, kernel.SECCOMP_IOCTL_NOTIF_SEND, buf, True)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def inject_and_respond(self, notif_id: int, srcfd: int, *, cloexec: bool) -> int:
        """ADDFD + SEND in one step: the fd is installed only if the call is answered.

        Signals are blocked for the ioctl's duration. The kernel marks the call answered
        before the target installs the fd; if a signal interrupts the ioctl while it waits
        for the target, the request is withdrawn but the call stays "answered" and the
        target's syscall returns 0 with no fd (see docs/semantics.md, "Monitor death").
        Blocking makes that impossible for every signal but SIGKILL.
        """
        buf = kernel.pack_addfd(notif_id, srcfd,
                                newfd_flags=kernel.O_CLOEXEC if cloexec else 0,
                                flags=kernel.SECCOMP_ADDFD_FLAG_SEND)
        if getattr(_SAVED, "all_blocked", False):
            return int(fcntl.ioctl(self.fd, kernel.SECCOMP_IOCTL_NOTIF_ADDFD, buf, True))
        saved = _saved_set()
        _sigmask(_SIG_BLOCK, _FULL_SET, saved)
        try:
            return int(fcntl.ioctl(self.fd, kernel.SECCOMP_IOCTL_NOTIF_ADDFD, buf, True))
        finally:
            _sigmask(_SIG_SETMASK, saved, None)

    def set_sync_wakeup(self) -> bool:
        """SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP (6.6+); the flag is passed by value."""
        try:
            fcntl.ioctl(self.fd, kernel.SECCOMP_IOCTL_NOTIF_SET_FLAGS,
                        kernel.SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP)
        except OSError:
            return False
        return True


def is_seccomp_listener(fd: int) -> bool:
    try:
        return linux.fd_path(fd) == "anon_inode:seccomp notify"
    except OSError:
        return False


class SharedReceiveLock:
    """Serialises poll + RECV on a listener between the worker processes that share it.

    Every worker waits on every listener; two can see the same call, and the one whose
    RECV comes second would sleep in it (RECV ignores O_NONBLOCK) until that target calls
    again, answering no other listener meanwhile. Holding this lock, a worker polls and
    RECVs only if a call still waits, so no RECV of a worker can sleep.

    An open-file-description lock on one byte per target id of a file every worker opens
    for itself (a lock of the same description would not exclude); released by the kernel
    if its worker dies. Never waited for: a worker that finds it held leaves the listener
    to the holder, and epoll (level-triggered) reports it again while a call still waits.
    Waiting would cost a sleep and a cross-CPU wake-up per call (measured: a quarter of the
    calls/s at 4 caller threads).
    """

    _FLOCK = struct.Struct("hhqqi4x")  # struct flock: type, whence, start, len, pid

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def adopt(cls, shared_fd: int) -> SharedReceiveLock:
        """This process's own description of the file behind shared_fd (which it closes)."""
        try:
            return cls(linux.reopen(shared_fd, os.O_RDWR | os.O_CLOEXEC))
        finally:
            os.close(shared_fd)

    def try_acquire(self, key: int) -> bool:
        """Take key's lock unless another worker holds it."""
        try:
            fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, self._FLOCK.pack(fcntl.F_WRLCK, 0, key, 1, 0))
        except BlockingIOError:
            return False
        return True

    def release(self, key: int) -> None:
        fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, self._FLOCK.pack(fcntl.F_UNLCK, 0, key, 1, 0))

    def close(self) -> None:
        os.close(self.fd)
