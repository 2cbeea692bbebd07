"""The calling thread as fhmon sees it: its memory, fds, cwd, root and credentials.

Everything read from a target is untrusted and can change under us (other threads of the
target keep running). Every read is followed by ID_VALID before its bytes are used: if the
thread died, its pid may already name another process.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

from monitor import linux
from monitor.listener import Listener, NotificationGone
from protocol import kernel


class SyscallError(Exception):
    """Answer the trapped call with this errno (positive)."""

    def __init__(self, err: int, reason: str = "") -> None:
        super().__init__(err, reason or os.strerror(err))
        self.errno = err
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the kernel would check an open against: fs ids, groups, effective caps."""

    fsuid: int
    fsgid: int
    groups: tuple[int, ...]
    cap_effective: int


@dataclass(frozen=True, slots=True)
class ThreadStatus:
    tgid: int
    credentials: Credentials
    uid: int  # real uid: who owns the process


_STATUS_FIELDS = re.compile(rb"^(Tgid|Uid|Gid|Groups|CapEff):[ \t]*([^\n]*)$", re.MULTILINE)


def read_status(tid: int) -> ThreadStatus:
    """Parse /proc/TID/status (per-thread credentials; the thread group id)."""
    try:
        fd = os.open(f"/proc/{tid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotificationGone(tid) from None
    try:
        raw = os.read(fd, 65536)
    finally:
        os.close(fd)
    fields = dict(_STATUS_FIELDS.findall(raw))
    try:
        uids = fields[b"Uid"].split()
        gids = fields[b"Gid"].split()
        groups = tuple(int(g) for g in fields[b"Groups"].split())
        creds = Credentials(int(uids[3]), int(gids[3]), groups, int(fields[b"CapEff"], 16))
        return ThreadStatus(int(fields[b"Tgid"]), creds, int(uids[0]))
    except (KeyError, IndexError, ValueError):
        raise NotificationGone(tid) from None


class TargetThread:
    """One trapped call's thread: memory access and fd lookups, each re-validated."""

    def __init__(self, listener: Listener, notif: kernel.Notification) -> None:
        self.listener = listener
        self.notif = notif
        self.tid = notif.pid
        self._status: ThreadStatus | None = None

    @property
    def status(self) -> ThreadStatus:
        if self._status is None:
            self._status = read_status(self.tid)
            self.listener.ensure_valid(self.notif.id)
        return self._status

    def _valid(self) -> None:
        self.listener.ensure_valid(self.notif.id)

    # --- memory --------------------------------------------------------------------
    def read_exact(self, addr: int, length: int) -> bytes:
        """copy_from_user: all of it, or EFAULT."""
        if length == 0:
            return b""
        if addr == 0 or addr + length > 1 << 64:
            raise SyscallError(errno.EFAULT)
        if (addr ^ (addr + length - 1)) < kernel.PAGE_SIZE:  # within one page
            data = linux.process_vm_read_one(self.tid, addr, length)
        else:
            data = linux.process_vm_read(self.tid, kernel.split_page_ranges(addr, length))
        self._valid()
        if len(data) != length:
            raise SyscallError(errno.EFAULT)
        return data

    def read_path(self, addr: int) -> bytes:
        """getname(): a NUL-terminated string of at most PATH_MAX bytes with the NUL."""
        if addr == 0:
            raise SyscallError(errno.EFAULT)
        data = linux.process_vm_read(self.tid, kernel.split_page_ranges(addr, kernel.PATH_MAX))
        self._valid()
        nul = data.find(b"\0")
        if nul >= 0:
            return data[:nul]
        if len(data) < kernel.PATH_MAX:
            raise SyscallError(errno.EFAULT)
        raise SyscallError(errno.ENAMETOOLONG)

    def write(self, *chunks: tuple[int, bytes]) -> None:
        """copy_to_user for each (addr, data) in order: EFAULT at the first byte that cannot
        be written (earlier bytes stay written, as with the kernel). One ID_VALID first:
        the thread cannot go away between the writes without the writes failing."""
        self._valid()
        for addr, data in chunks:
            if addr == 0:
                raise SyscallError(errno.EFAULT)
            if (addr ^ (addr + len(data) - 1)) < kernel.PAGE_SIZE:  # within one page
                if linux.process_vm_write(self.tid, addr, data) != len(data):
                    raise SyscallError(errno.EFAULT)
                continue
            for start, length in kernel.split_page_ranges(addr, len(data)):
                offset = start - addr
                got = linux.process_vm_write(self.tid, start, data[offset : offset + length])
                if got != length:
                    raise SyscallError(errno.EFAULT)

    # --- fds, cwd, root ------------------------------------------------------------
    def take_fd(self, fd: int) -> int:
        """A duplicate of the target's fd (same open file), or EBADF."""
        if fd < 0:
            raise SyscallError(errno.EBADF)
        try:
            pidfd = linux.pidfd_open(self.tid, linux.PIDFD_THREAD)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise NotificationGone(self.tid) from None
            pidfd = linux.pidfd_open(self.status.tgid)
        try:
            ours = linux.pidfd_getfd(pidfd, fd)
        except OSError as exc:
            self._valid()
            if exc.errno == errno.EBADF:
                raise SyscallError(errno.EBADF) from None
            raise NotificationGone(self.tid) from None
        finally:
            os.close(pidfd)
        try:
            self._valid()
        except NotificationGone:
            os.close(ours)
            raise
        return ours

    def open_cwd(self) -> int:
        return self._open_proc_link("cwd")

    def open_root(self) -> int:
        return self._open_proc_link("root")

    def _open_proc_link(self, name: str) -> int:
        try:
            fd = os.open(f"/proc/{self.tid}/{name}", os.O_PATH | os.O_CLOEXEC)
        except OSError:
            raise NotificationGone(self.tid) from None
        try:
            self._valid()
        except NotificationGone:
            os.close(fd)
            raise
        return fd
