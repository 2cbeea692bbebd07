"""The calling thread as fhmon sees it: its memory, fds, cwd, root and credentials.

Everything read from a target is untrusted and can change under us (other threads of the
target keep running). Every read is followed by ID_VALID before its bytes are used: if the
thread died, its pid may already name another process.
"""

from __future__ import annotations

import errno
import os
import re
import threading
from collections.abc import Sequence
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
    frozen: bool = False  # these credentials can never change for this thread's life
    seccomp_filtered: bool = True  # "Seccomp: 2": the thread runs under a filter


_STATUS_FIELDS = re.compile(
    rb"^(Tgid|Uid|Gid|Groups|CapEff|CapPrm|CapAmb|NoNewPrivs|Seccomp):[ \t]*([^\n]*)$",
    re.MULTILINE)


def _user_ns(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


_OUR_USER_NS = _user_ns("/proc/self/ns/user")


def _in_our_user_ns(tid: int) -> bool:
    theirs = _user_ns(f"/proc/{tid}/ns/user")
    return theirs is not None and theirs == _OUR_USER_NS


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
        # CapEff is relative to the task's own user namespace: a target that made itself
        # "root" in a new user namespace holds no capability over fhmon's files.
        caps = int(fields[b"CapEff"], 16) if _in_our_user_ns(tid) else 0
        creds = Credentials(int(uids[3]), int(gids[3]), groups, caps)
        # No capabilities, one uid and one gid everywhere, no_new_privs: nothing the thread
        # can do (setfsuid to its only uid; no setgroups, no capset gains, no setuid exec)
        # changes what permission checks see.
        frozen = (len(set(uids)) == 1 and len(set(gids)) == 1 and creds.cap_effective == 0
                  and int(fields.get(b"CapPrm", b"1"), 16) == 0
                  and int(fields.get(b"CapAmb", b"1"), 16) == 0
                  and fields.get(b"NoNewPrivs") == b"1")
        return ThreadStatus(int(fields[b"Tgid"]), creds, int(uids[0]), frozen,
                            fields.get(b"Seccomp") == b"2")
    except (KeyError, IndexError, ValueError):
        raise NotificationGone(tid) from None


class ThreadCache:
    """Per target: a pidfd for each thread seen, and its credentials when they are frozen.

    A TID names the same thread for as long as that thread lives; a cached pidfd that still
    names a live thread therefore names the notifying one (which is blocked in our call).
    Saves reading /proc/TID/status (~11 us) and pidfd_open on every call.
    """

    def __init__(self, limit: int = 1024) -> None:
        self._entries: dict[int, tuple[int, ThreadStatus | None]] = {}
        self._limit = limit
        # The sweeper (trio's thread) and a RECV worker thread may both use the cache.
        self._lock = threading.Lock()

    def get(self, tid: int) -> tuple[int, ThreadStatus | None] | None:
        """The entry for tid, not yet checked alive: a TID may name a newer thread than the
        cached pidfd's (see TargetThread._alive)."""
        with self._lock:
            return self._entries.get(tid)

    def discard(self, tid: int, pidfd: int) -> None:
        """Forget tid if its entry still holds pidfd (its thread was found dead)."""
        with self._lock:
            entry = self._entries.get(tid)
            if entry is not None and entry[0] == pidfd:
                self._drop(tid)

    def put(self, tid: int, pidfd: int, status: ThreadStatus | None) -> bool:
        """Cache pidfd for tid; False if the cache is full of live threads (not kept: the
        caller still owns pidfd and must close it)."""
        with self._lock:
            old = self._entries.pop(tid, None)
            if old is not None and old[0] != pidfd:
                os.close(old[0])
            if len(self._entries) >= self._limit:
                self._sweep()
            if len(self._entries) >= self._limit:
                return False
            self._entries[tid] = (pidfd, status)
            return True

    def sweep(self) -> int:
        """Forget threads that exited; returns how many remain."""
        with self._lock:
            return self._sweep()

    def _sweep(self) -> int:
        for tid, (pidfd, _) in list(self._entries.items()):
            if not linux.pidfd_alive(pidfd):
                self._drop(tid)
        return len(self._entries)

    def _drop(self, tid: int) -> None:
        pidfd, _ = self._entries.pop(tid)
        os.close(pidfd)

    def close(self) -> None:
        with self._lock:
            for tid in list(self._entries):
                self._drop(tid)


class TargetThread:
    """One trapped call's thread: memory access and fd lookups, each re-validated."""

    def __init__(self, listener: Listener, notif: kernel.Notification,
                 cache: ThreadCache | None = None) -> None:
        self.listener = listener
        self.notif = notif
        self.tid = notif.pid
        self._cache = cache
        self._status: ThreadStatus | None = None
        self._entry: tuple[int, ThreadStatus | None] | None = None
        self._looked_up = False
        self._proven_alive = False
        self._prefetched: tuple[tuple[int, int], bytes] | None = None

    def _cached(self) -> tuple[int, ThreadStatus | None] | None:
        """The cache's entry for this thread, looked up once per call."""
        if not self._looked_up and self._cache is not None:
            self._entry = self._cache.get(self.tid)
            self._looked_up = True
        return self._entry

    def _alive(self, entry: tuple[int, ThreadStatus | None]) -> bool:
        """Whether the entry's pidfd names a live thread, and so the notifying one: the
        TID is ours while that thread lives, and the thread is blocked in this call (if it
        lives now, it lives until we answer). Checked at most once per call, and not at all
        after a pidfd_getfd through it succeeded (which proves the same)."""
        if self._proven_alive:
            return True
        if linux.pidfd_alive(entry[0]):
            self._proven_alive = True
            return True
        self._forget(entry)
        return False

    def _forget(self, entry: tuple[int, ThreadStatus | None]) -> None:
        """The cached pidfd names a thread that is gone: a new thread reuses its TID."""
        if self._cache is not None:
            self._cache.discard(self.tid, entry[0])
        self._entry = None

    def _pidfd(self) -> int | None:
        """A cached pidfd for this thread (maybe not yet checked alive), opening (and
        caching) one if needed."""
        if self._cache is None:
            return None
        entry = self._cached()
        if entry is not None:
            return entry[0]
        try:
            pidfd = linux.pidfd_open(self.tid, linux.PIDFD_THREAD)
        except OSError:
            return None
        if not self._cache.put(self.tid, pidfd, None):
            os.close(pidfd)
            return None
        self._entry = (pidfd, None)
        self._proven_alive = True  # pidfd_open found the TID's thread now
        return pidfd

    @property
    def status(self) -> ThreadStatus:
        if self._status is not None:
            return self._status
        entry = self._cached()
        if entry is not None and entry[1] is not None and self._alive(entry):
            self._status = entry[1]
            return self._status
        status = read_status(self.tid)
        self.listener.ensure_valid(self.notif.id)
        self._status = status
        if self._cache is not None and status.frozen:
            pidfd = self._pidfd()
            if pidfd is not None and self._cache.put(self.tid, pidfd, status):
                self._entry = (pidfd, status)
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
        if prefetch is not None and prefetch[0] > 0 and sum(prefetch) <= 1 << 64:
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
        for addr, data in chunks:
            if addr == 0 or addr + len(data) > 1 << 64:
                break
            writable.append((addr, data))
        expected = sum(len(data) for _, data in writable)
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
        ours = self._getfd_cached(fd)
        if ours is None:  # nothing cached, or the cached pidfd named a thread now gone
            pidfd = self._pidfd()
            transient = pidfd is None
            if pidfd is None:
                try:
                    pidfd = linux.pidfd_open(self.tid, linux.PIDFD_THREAD)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise NotificationGone(self.tid) from None
                    pidfd = linux.pidfd_open(self.status.tgid)
            try:
                ours = linux.pidfd_getfd(pidfd, fd)
            except OSError as exc:
                raise self._getfd_error(exc) from None
            finally:
                if transient:
                    os.close(pidfd)
        if check:
            try:
                self.ensure_valid()
            except NotificationGone:
                os.close(ours)
                raise
        return ours

    def _getfd_cached(self, fd: int) -> int | None:
        """pidfd_getfd through the cached pidfd; None if there is none or its thread is
        gone. A success proves the thread alive, saving _alive's check."""
        entry = self._cached()
        if entry is None:
            return None
        try:
            ours = linux.pidfd_getfd(entry[0], fd)
        except OSError as exc:
            if not self._alive(entry):
                return None
            raise self._getfd_error(exc) from None
        self._proven_alive = True
        return ours

    def _getfd_error(self, exc: OSError) -> Exception:
        """What a failed pidfd_getfd on the live notifying thread answers."""
        self.ensure_valid()
        if exc.errno == errno.EBADF:
            return SyscallError(errno.EBADF)
        return NotificationGone(self.tid)

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
            self.ensure_valid()
        except NotificationGone:
            os.close(fd)
            raise
        return fd
