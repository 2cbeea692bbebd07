"""Per target: each calling thread's pidfd and, while they cannot change, its
credentials (saves a /proc read and a pidfd_open per call)."""

from __future__ import annotations

import os
import resource
import threading
from typing import Final

from monitor import linux
from monitor.proc_status import ThreadStatus

MAX_CACHED_THREADS: Final = 1024  # the most pidfds one target's cache ever holds
MIN_CACHED_THREADS: Final = 16  # even a small fd limit keeps a cache worth having
# a target's fds besides its cache: the listener, the share's path and directory fds, a
# mount_fd duplicate, an fd in flight to inject, the worker processes' copies
FDS_PER_TARGET_BESIDES_CACHE: Final = 8


def cached_threads_per_target(max_targets: int, nofile: int | None = None) -> int:
    """How many thread pidfds each target may hold in fhmon: its fair share of the fd
    limit (RLIMIT_NOFILE's soft limit, as fhmon serve raised it, over max_targets, less
    the target's other fds), between MIN_CACHED_THREADS and MAX_CACHED_THREADS. A target
    with more calling threads than that pays a pidfd_open per call of the others; a
    target with thousands of threads no longer holds 1,024 fds, which with many targets
    reached the fd limit."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    share = nofile // max(1, max_targets) - FDS_PER_TARGET_BESIDES_CACHE
    return max(MIN_CACHED_THREADS, min(MAX_CACHED_THREADS, share))


class ThreadCache:
    """Per target: a pidfd for each thread seen, and its credentials when they are frozen.

    A TID names the same thread for as long as that thread lives; a cached pidfd that still
    names a live thread therefore names the notifying one (which is blocked in our call).
    But a thread may have died and its TID gone to a new thread: an entry is used only once
    something proved its pidfd's thread alive, and a pidfd_getfd through it is that proof.
    Every use of a cached pidfd happens under the lock, because the sweeper (trio's thread)
    closes the pidfds of dead threads, and a closed fd number may name another file next.
    Saves reading /proc/TID/status (~11 us) and pidfd_open on every call.

    A full cache takes no new entry (O(1)): the threads it holds keep their hits, the others
    pay a pidfd_open per call, and the periodic sweep() (every second, on trio's thread)
    makes room as threads exit. It used to sweep every entry on each put once full, which,
    on the thread that answers every target, slowed the neighbours of a 2,000-thread
    target 13x (bench/thread_cache.py). Evicting the least recently used entry instead was
    measured too: a target whose threads call in turn then never hits (5.5x vs 4.7x).
    """

    def __init__(self, limit: int = MAX_CACHED_THREADS) -> None:
        self._entries: dict[int, tuple[int, ThreadStatus | None]] = {}
        self._limit = limit
        self._lock = threading.Lock()
        # The target's last mount_fd: (its number, our duplicate, its st_dev). Used only by
        # the one thread that answers this target's calls, and closed with the cache.
        self.mount_fd: tuple[int, int, int] | None = None

    def take_fd(self, tid: int, fd: int) -> int | None:
        """pidfd_getfd(fd) through tid's cached pidfd: None if nothing is cached, or if its
        thread is gone (the entry is then forgotten). OSError if the live thread has no
        such fd (the kernel's own answer)."""
        with self._lock:
            entry = self._entries.get(tid)
            if entry is None:
                return None
            try:
                return linux.pidfd_getfd(entry[0], fd)
            except OSError:
                if linux.pidfd_alive(entry[0]):
                    raise
                self._drop(tid)
                return None

    def status(self, tid: int, *, known_alive: bool) -> ThreadStatus | None:
        """The cached frozen credentials of tid's live thread. known_alive: a take_fd
        through the entry already proved it (no pidfd_alive needed)."""
        with self._lock:
            entry = self._entries.get(tid)
            if entry is None or entry[1] is None:
                return None
            if not known_alive and not linux.pidfd_alive(entry[0]):
                self._drop(tid)
                return None
            return entry[1]

    def has_live(self, tid: int) -> bool:
        """Whether tid's entry names a live thread (a dead one's entry is forgotten)."""
        with self._lock:
            entry = self._entries.get(tid)
            if entry is None:
                return False
            if linux.pidfd_alive(entry[0]):
                return True
            self._drop(tid)
            return False

    def set_status(self, tid: int, status: ThreadStatus) -> bool:
        """Add frozen credentials to tid's entry, which the caller proved alive."""
        with self._lock:
            entry = self._entries.get(tid)
            if entry is None:
                return False
            self._entries[tid] = (entry[0], status)
            return True

    def put(self, tid: int, pidfd: int, status: ThreadStatus | None) -> bool:
        """Cache pidfd (a new one, of tid's live thread) for tid; False if the cache is full
        (not kept: the caller still owns pidfd and must close it). Never sweeps: that is
        sweep()'s, periodically."""
        with self._lock:
            old = self._entries.pop(tid, None)
            if old is not None:
                os.close(old[0])
            if len(self._entries) >= self._limit:
                return False
            self._entries[tid] = (pidfd, status)
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

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
            if self.mount_fd is not None:
                os.close(self.mount_fd[1])
                self.mount_fd = None
