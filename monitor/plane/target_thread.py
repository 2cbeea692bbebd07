"""The calling thread as fhmon sees it: its memory, fds, cwd, root and credentials.

Everything read from a target is untrusted and can change under us (other threads of the
target keep running). Every read is followed by ID_VALID before its bytes are used: if the
thread died, its pid may already name another process.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Sequence

from monitor import linux
from monitor.listener import Listener, NotificationGone
from monitor.plane.thread_cache import ThreadCache
from monitor.proc_status import ThreadStatus, read_status
from protocol import kernel
from protocol.refusals import Refusal

# Out of fds or memory in fhmon while it answers: the kernel's own answer in that state,
# given to the caller (never "the caller went away", which leaves the call unanswered).
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


class SyscallError(Exception):
    """Answer the trapped call with this errno (positive)."""

    def __init__(self, err: int, reason: str = "") -> None:
        super().__init__(err, reason or os.strerror(err))
        self.errno = err
        self.reason = reason

    @classmethod
    def refusing(cls, refusal: Refusal, **parts: object) -> SyscallError:
        """A refusal of the one table (protocol/refusals.toml): its errno, and its reason
        with these variable parts (the audit line's text, the same on both planes)."""
        return cls(refusal.errno, refusal.text(**parts))


class TargetThread:
    """One trapped call's thread: memory access and fd lookups, each re-validated."""

    def __init__(self, listener: Listener, notif: kernel.Notification,
                 cache: ThreadCache | None = None) -> None:
        self.listener = listener
        self.notif = notif
        self.tid = notif.pid
        self._cache = cache
        self._status: ThreadStatus | None = None
        # the cache's entry for this TID names this thread (a take_fd through it worked)
        self._entry_alive = False
        self._prefetched: tuple[tuple[int, int], bytes] | None = None

    @property
    def status(self) -> ThreadStatus:
        if self._status is not None:
            return self._status
        cache = self._cache
        if cache is None:
            status = read_status(self.tid)
            self.listener.ensure_valid(self.notif.id)
            self._status = status
            return status
        cached = cache.status(self.tid, known_alive=self._entry_alive)
        if cached is not None:
            self._status = cached
            return cached
        # A new pidfd is opened before the read: the ID_VALID after the read then proves
        # the notifying thread held the TID all along, so the pidfd names it.
        pidfd = None
        if not (self._entry_alive or cache.has_live(self.tid)):
            try:
                pidfd = linux.pidfd_open(self.tid, kernel.PIDFD_THREAD)
            except OSError:
                pidfd = None
        try:
            status = read_status(self.tid)
            self.listener.ensure_valid(self.notif.id)
        except BaseException:
            if pidfd is not None:
                os.close(pidfd)
            raise
        self._status = status
        if pidfd is not None:
            if cache.put(self.tid, pidfd, status if status.frozen else None):
                self._entry_alive = True
            else:
                os.close(pidfd)
        elif status.frozen:
            cache.set_status(self.tid, status)
        return status

    def ensure_valid(self) -> None:
        """ID_VALID: the thread is still blocked in this call (its pid names it)."""
        self.listener.ensure_valid(self.notif.id)

    # --- memory --------------------------------------------------------------------
    def read_exact(self, addr: int, length: int, *, check: bool = True) -> bytes:
        """copy_from_user: all of it, or EFAULT.

        check=False defers the ID_VALID to the caller's next validated step; the bytes may
        then only steer checks that have no effect outside fhmon until that step.
        """
        if length == 0:
            return b""
        if addr == 0 or addr + length > 1 << 64:
            raise SyscallError(errno.EFAULT)
        if self._prefetched is not None and self._prefetched[0] == (addr, length):
            data = self._prefetched[1]
        else:
            data = self._read(((addr, length),))
        if check:
            self.ensure_valid()
        if len(data) != length:
            raise SyscallError(errno.EFAULT)
        return data

    def read_prefix(self, addr: int, length: int) -> bytes:
        """Up to length bytes at addr: as many as are readable (page-exact), with no
        ID_VALID (the caller validates before the bytes have an effect)."""
        if addr == 0:
            return b""
        return self._read(((addr, min(length, (1 << 64) - addr)),))

    def read_path(self, addr: int, *, check: bool = True,
                  prefetch: tuple[int, int] | None = None) -> bytes:
        """getname(): a NUL-terminated string of at most PATH_MAX bytes with the NUL.

        The first read stops at the end of the path's first page, where almost every path
        ends. prefetch=(addr, length) reads that region in the same syscall, for a later
        read_exact of exactly that region (the kernel reads it later: either order is an
        interleaving the target's other threads could have produced).
        """
        if addr == 0:
            raise SyscallError(errno.EFAULT)
        first = min(kernel.PATH_MAX, kernel.PAGE_SIZE - addr % kernel.PAGE_SIZE)
        regions = [(addr, first)]
        if prefetch is not None and prefetch[0] > 0 and prefetch[0] + prefetch[1] <= 1 << 64:
            regions.append(prefetch)
        data = self._read(regions)
        nul = data.find(b"\0", 0, first)
        if nul >= 0:
            if len(regions) == 2 and len(data) == first + regions[1][1]:
                self._prefetched = (regions[1], data[first:])
            path = data[:nul]
        elif len(data) < first:
            raise SyscallError(errno.EFAULT)
        else:
            rest = min(kernel.PATH_MAX - first, (1 << 64) - (addr + first))
            data = data[:first] + self._read(((addr + first, rest),))
            nul = data.find(b"\0")
            if nul < 0:
                raise SyscallError(errno.EFAULT if len(data) < kernel.PATH_MAX
                                   else errno.ENAMETOOLONG)
            path = data[:nul]
        if check:
            self.ensure_valid()
        return path

    def _read(self, regions: Sequence[tuple[int, int]]) -> bytes:
        try:
            return linux.process_vm_read_regions(self.tid, regions)
        except ProcessLookupError:
            raise NotificationGone(self.tid) from None

    def write(self, *chunks: tuple[int, bytes]) -> None:
        """copy_to_user for each (addr, data) in order: EFAULT at the first byte that cannot
        be written (earlier bytes stay written, as with the kernel). One ID_VALID first:
        the thread cannot go away between the writes without the writes failing."""
        self.ensure_valid()
        try:
            self._write_chunks(chunks)
        except ProcessLookupError:
            raise NotificationGone(self.tid) from None

    def _write_chunks(self, chunks: tuple[tuple[int, bytes], ...]) -> None:
        # One process_vm_writev for all chunks; it stops at the first page it cannot write,
        # as the kernel's copy_to_user calls, in order, stop at the first that faults.
        writable: list[tuple[int, bytes]] = []
        expected = 0
        for addr, data in chunks:
            if addr == 0 or addr + len(data) > 1 << 64:
                break
            writable.append((addr, data))
            expected += len(data)
        if linux.process_vm_write(self.tid, writable) != expected or len(writable) < len(chunks):
            raise SyscallError(errno.EFAULT)

    # --- fds, cwd, root ------------------------------------------------------------
    def take_fd(self, fd: int, *, check: bool = True) -> int:
        """A duplicate of the target's fd (same open file), or EBADF.

        check=False leaves the ID_VALID to the caller's next validated step (the handle
        write, the ADDFD): until then the fd may belong to a process that reused a dead
        target's TID, so it may only steer lookups and errno answers (an answer to a
        notification that is gone reaches nobody)."""
        if fd < 0:
            raise SyscallError(errno.EBADF)
        cache = self._cache
        ours: int | None = None
        if cache is not None:
            try:
                ours = cache.take_fd(self.tid, fd)
            except OSError as exc:
                self._entry_alive = True
                raise self._getfd_error(exc) from None
            self._entry_alive = ours is not None
        if ours is None:  # nothing cached, or the cached pidfd named a thread now gone
            ours = self._take_fd_fresh(fd)
        if check:
            try:
                self.ensure_valid()
            except NotificationGone:
                os.close(ours)
                raise
        return ours

    def _take_fd_fresh(self, fd: int) -> int:
        """pidfd_getfd through a new pidfd, kept in the cache afterwards."""
        thread_pidfd = True
        try:
            pidfd = linux.pidfd_open(self.tid, kernel.PIDFD_THREAD)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise self._resource_error(exc) from None
            thread_pidfd = False  # a kernel before PIDFD_THREAD (6.9)
            try:
                pidfd = linux.pidfd_open(self.status.tgid)
            except OSError as exc:
                raise self._resource_error(exc) from None
        try:
            ours = linux.pidfd_getfd(pidfd, fd)
        except OSError as exc:
            os.close(pidfd)
            raise self._getfd_error(exc) from None
        if thread_pidfd and self._cache is not None and self._cache.put(self.tid, pidfd, None):
            self._entry_alive = True  # the getfd through it just worked
        else:
            os.close(pidfd)
        return ours

    def _getfd_error(self, exc: OSError) -> Exception:
        """What a failed pidfd_getfd on the live notifying thread answers."""
        self.ensure_valid()
        if exc.errno == errno.EBADF or exc.errno in RESOURCE_ERRNOS:
            return SyscallError(exc.errno)
        return NotificationGone(self.tid)

    def _resource_error(self, exc: OSError) -> Exception:
        """A failed pidfd_open or /proc open: out of fds or memory is answered (EMFILE,
        ENFILE, ENOMEM) while the call is still waiting; anything else means it is gone."""
        if exc.errno in RESOURCE_ERRNOS:
            self.ensure_valid()
            return SyscallError(exc.errno)
        return NotificationGone(self.tid)

    def mount_fd_device(self, mount_fd: int, share_dev: int) -> int:
        """open_by_handle_at's mount_fd: EBADF as the kernel gives it (a bad fd, an O_PATH
        fd), else the st_dev of the fd (of the cwd for AT_FDCWD). Like take_fd(check=False):
        only an errno depends on it until the ADDFD validates the notification. Our
        duplicate is remembered only if it is on the share's filesystem: any other (a
        socket with SO_LINGER) could make our later close of it, the last one once the
        target closed its copy, wait on the thread that answers every target."""
        if mount_fd == kernel.AT_FDCWD:
            fd = self.open_cwd()
            try:
                return os.fstat(fd).st_dev
            finally:
                os.close(fd)
        known = self._known_mount_fd(mount_fd)
        if known is not None:
            return known
        fd = self.take_fd(mount_fd, check=False)
        try:
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_PATH:
                raise SyscallError(errno.EBADF)
            dev = os.fstat(fd).st_dev
        except BaseException:
            os.close(fd)
            raise
        if dev != share_dev or not self._remember_mount_fd(mount_fd, fd, dev):
            os.close(fd)  # the target still holds its copy: not the last close
        return dev

    def _known_mount_fd(self, fd: int) -> int | None:
        """The st_dev of the target's fd if it is still the open file it was when
        _remember_mount_fd saw it: one kcmp instead of pidfd_getfd, fcntl, fstat and close
        (virtiofsd passes the same mount_fd to every open_by_handle_at). Like
        take_fd(check=False), until the caller's next validated step."""
        memo = self._cache.mount_fd if self._cache is not None else None
        if memo is None or memo[0] != fd or not linux.is_open_file_of(self.tid, fd, memo[1]):
            return None
        return memo[2]

    def _remember_mount_fd(self, fd: int, ours: int, dev: int) -> bool:
        """Keep ours (a duplicate of the target's fd, which the cache then owns) for
        _known_mount_fd; False if there is no cache (the caller keeps ours)."""
        cache = self._cache
        if cache is None:
            return False
        if cache.mount_fd is not None:
            os.close(cache.mount_fd[1])
        cache.mount_fd = (fd, ours, dev)
        return True

    def open_cwd(self) -> int:
        return self._open_proc_link("cwd")

    def open_root(self) -> int:
        return self._open_proc_link("root")

    def _open_proc_link(self, name: str) -> int:
        try:
            fd = os.open(f"/proc/{self.tid}/{name}", os.O_PATH | os.O_CLOEXEC)
        except OSError as exc:
            raise self._resource_error(exc) from None
        try:
            self.ensure_valid()
        except NotificationGone:
            os.close(fd)
            raise
        return fd
