"""The Python plane's answer loop: one OS thread waits on every listener with epoll and
answers their calls (the "dispatch thread" of the docs).

Why not trio's wait_readable, the first design: per call it re-arms epoll, switches tasks
and runs the scheduler, ~20 us of fhmon's CPU on the machines fhmon was measured on (a
fifth of a whole call; docs/performance.md). A thread blocked in epoll_wait skips all of
it. Why one thread for every listener, not one per listener (the retired `recv_thread`):
with many threads every syscall that releases the GIL becomes a hand-off between threads,
and at 8 busy targets the CPU per call tripled.

trio still owns the lifetimes: a target's task adds its listener here and sleeps until the
thread reports the hang-up (or until the task is cancelled); `remove` returns only when
the thread is not answering a call, so the task may then close the target's fds.

RECV blocks (it ignores O_NONBLOCK), and a blocked RECV would stop every target's calls.
It cannot block when epoll reported a call on a listener this thread alone receives from:
the kernel counts each call it queues, only a RECV takes from that count, and a call
withdrawn before the RECV (its caller was signalled or died) leaves its count behind, so
the RECV answers ENOENT at once (tests/kernel/test_listener_recv.py holds the kernel to
that). A `poll` of the listener first is needed where that reasoning does not hold: for
a listener added after epoll_wait began (its fd number may be a just-closed listener's
that epoll reported), and for listeners that worker processes share (another may have
taken the call), where the poll and the RECV happen under a lock the workers share
(listener.SharedReceiveLock).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from monitor.listener import SharedReceiveLock, mark_signals_blocked
from protocol import kernel

if TYPE_CHECKING:
    from monitor.calls import Target

Answer = Callable[["Target", kernel.Notification], None]
_HANGUP = select.EPOLLHUP | select.EPOLLERR


class PythonAnswerLoop:
    """Answers the calls of every added target on one thread; `run` is that thread's body."""

    def __init__(self, answer: Answer, *, shared: SharedReceiveLock | None = None) -> None:
        """shared: other processes RECV from the listeners added here too (workers), and
        every one of them holds this lock around its poll + RECV (or leaves the call to
        the one that holds it)."""
        self._answer = answer
        self._shared = shared
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        # listener fd -> (target, its hung_up, the _added count when it was added)
        self._targets: dict[int, tuple[Target, Callable[[], None], int]] = {}
        self._added = 0
        self._busy = threading.Lock()  # held while the thread works on events
        # add() takes only this one: a registration must not wait for the call in progress
        # (a target can make one take seconds); a listener added during a batch is told
        # apart by its _added count (see _serve)
        self._adding = threading.Lock()
        self._stopping = False

    def add(self, target: Target, hung_up: Callable[[], None]) -> None:
        """Serve target's listener; hung_up runs (on the thread) once its filter has no task."""
        fd = target.listener.fd
        with self._adding:
            self._targets[fd] = (target, hung_up, self._added + 1)
            self._added += 1
            # EPOLLEXCLUSIVE: with worker processes, every worker waits on every listener;
            # a call then wakes one of them, not all (measured: the others' wasted wake-ups
            # cost more CPU per call than the call itself at one caller).
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLEXCLUSIVE)

    def remove(self, target: Target) -> None:
        """Stop serving target; afterwards the thread holds no reference to its fds."""
        fd = target.listener.fd
        with self._busy:
            entry = self._targets.get(fd)
            if entry is not None and entry[0] is target:
                del self._targets[fd]
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(fd)

    def stop(self) -> None:
        """Make run() return (from any thread)."""
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def close(self) -> None:
        self._epoll.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def run(self) -> None:
        # Signals go to trio's thread; this one must never run a handler mid-call.
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        mark_signals_blocked()
        while not self._stopping:
            added_before_wait = self._added  # a listener added later is polled first
            events = self._epoll.poll()
            with self._busy:
                for fd, mask in events:
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 64)
                        continue
                    self._serve(fd, mask, added_before_wait)

    def _serve(self, fd: int, mask: int, added_before_wait: int) -> None:
        entry = self._targets.get(fd)
        if entry is None:
            return  # removed after epoll_wait returned
        target, hung_up, added = entry
        notif: kernel.Notification | None
        if mask & _HANGUP:
            self._forget(fd, hung_up)
            return
        if self._shared is not None:
            if not self._shared.try_acquire(target.target_id):
                os.sched_yield()  # let the worker that holds it (maybe on our CPU) go on
                return
            try:
                notif = self._poll_and_receive(fd, target, hung_up)
            finally:
                self._shared.release(target.target_id)
        elif mask & select.EPOLLIN and added <= added_before_wait:
            notif = target.listener.receive_ready()  # cannot block: the module docstring
        else:
            notif = self._poll_and_receive(fd, target, hung_up)
        if notif is not None:
            self._answer(target, notif)

    def _poll_and_receive(self, fd: int, target: Target,
                          hung_up: Callable[[], None]) -> kernel.Notification | None:
        """RECV only if the listener says a call waits: RECV must never block here."""
        ready = target.listener.poll()
        if ready is None:
            self._forget(fd, hung_up)
            return None
        return target.listener.receive_ready() if ready else None

    def _forget(self, fd: int, hung_up: Callable[[], None]) -> None:
        """The filter has no task left: stop watching its listener and say so."""
        del self._targets[fd]
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(fd)
        hung_up()
