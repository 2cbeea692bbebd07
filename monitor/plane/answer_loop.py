"""The Python plane's answer loop: one OS thread waits on every listener with epoll and
answers their calls (the "dispatch thread" of the docs), and hands that role on when one
call keeps it too long.

Why not trio's wait_readable, the first design: per call it re-arms epoll, switches tasks
and runs the scheduler, ~20 us of fhmon's CPU on the machines fhmon was measured on (a
fifth of a whole call; docs/performance.md). A thread blocked in epoll_wait skips all of
it. Why one thread for every listener, not one per listener (the retired `recv_thread`):
with many threads every syscall that releases the GIL becomes a hand-off between threads,
and at 8 busy targets the CPU per call tripled.

But a target can make one of its calls take seconds in the kernel (a lookup through 40
symlinks climbing 10,000 mounts stacked in its own mount namespace), and while the
dispatch thread performs it every other target would wait. So a watcher looks every
SLOW_CALL seconds: if the dispatch thread is still in the call it was in at the last look,
a new thread takes over the epoll loop, and the slow call's target is set aside (its
listener out of epoll) until its call is answered. The old thread answers that one call,
puts its listener back and ends. Each target thus has at most one call in progress and
holds at most one thread, as on the native plane under "auto"; the common case (no slow
call) stays one thread and no hand-off.

trio still owns the lifetimes: a target's task adds its listener here and sleeps until the
thread reports the hang-up (or until the task is cancelled); `remove` returns only when no
thread is answering a call of that target, so the task may then close the target's fds.

RECV blocks (it ignores O_NONBLOCK), and a blocked RECV would stop every target's calls.
It cannot block when epoll reported a call on a listener this thread alone receives from:
the kernel counts each call it queues, only a RECV takes from that count, and a call
withdrawn before the RECV (its caller was signalled or died) leaves its count behind, so
the RECV answers ENOENT at once (tests/kernel/test_listener_recv.py holds the kernel to
that). Only the dispatch thread of the moment RECVs, and a thread that handed the role on
stops before its next event. A `poll` of the listener first is needed where that
reasoning does not hold: for a listener added after epoll_wait began (its fd number may be
a just-closed listener's that epoll reported), and for listeners that worker processes
share (another may have taken the call), where the poll and the RECV happen under a lock
the workers share (listener.SharedReceiveLock).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from monitor.listener import SharedReceiveLock, mark_signals_blocked
from protocol import kernel

if TYPE_CHECKING:
    from monitor.calls import Target

Answer = Callable[["Target", kernel.Notification], None]
_HANGUP = select.EPOLLHUP | select.EPOLLERR
# Seconds between the watcher's looks: a call still in progress at two looks in a row
# (0.1-0.2 s) gets the epoll loop handed to a new thread. Calls take microseconds; only
# one the kernel makes slow, or a machine far too loaded, ever gets there.
SLOW_CALL = 0.1


@dataclass(eq=False)
class _Entry:
    target: Target
    hung_up: Callable[[], None]
    added: int  # the loop's _added count when it was added
    # held while a call of it is answered: remove() waits for it
    serving: threading.Lock = field(default_factory=threading.Lock)


class PythonAnswerLoop:
    """Answers the calls of every added target; `run` is the first dispatch thread's body and
    returns once every thread it started has ended."""

    def __init__(self, answer: Answer, *, shared: SharedReceiveLock | None = None) -> None:
        """shared: other processes RECV from the listeners added here too (workers), and
        every one of them holds this lock around its poll + RECV (or leaves the call to
        the one that holds it)."""
        self._answer = answer
        self._shared = shared
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._targets: dict[int, _Entry] = {}  # by listener fd
        self._added = 0
        # Held only for bookkeeping, never across a call: add() must not wait for the call
        # in progress (a target can make one take seconds). Guards _targets, _dispatcher,
        # _current and _calls; a listener added during a batch is told apart by its
        # _added count (see _serve).
        self._busy = threading.Lock()
        self._dispatcher = 0  # which thread is the dispatch thread (its number)
        self._current: _Entry | None = None  # whose call the dispatch thread answers
        self._calls = 0  # calls the dispatch threads began (the watcher compares)
        self._threads: list[threading.Thread] = []  # started by the watcher
        self._stopped = threading.Event()
        self._stopping = False

    def add(self, target: Target, hung_up: Callable[[], None]) -> None:
        """Serve target's listener; hung_up runs (on the thread) once its filter has no task."""
        fd = target.listener.fd
        with self._busy:
            self._added += 1
            self._targets[fd] = _Entry(target, hung_up, self._added)
            self._watch(fd)

    def _watch(self, fd: int) -> None:
        # EPOLLEXCLUSIVE: with worker processes, every worker waits on every listener;
        # a call then wakes one of them, not all (measured: the others' wasted wake-ups
        # cost more CPU per call than the call itself at one caller).
        self._epoll.register(fd, select.EPOLLIN | select.EPOLLEXCLUSIVE)

    def remove(self, target: Target) -> None:
        """Stop serving target; afterwards no thread holds a reference to its fds."""
        fd = target.listener.fd
        with self._busy:
            entry = self._targets.get(fd)
            if entry is None or entry.target is not target:
                return
            del self._targets[fd]
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)
        with entry.serving:  # a call of it in progress (on any thread) is answered
            pass

    def stop(self) -> None:
        """Make run() return (from any thread)."""
        self._stopping = True
        self._stopped.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def close(self) -> None:
        self._epoll.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def run(self) -> None:
        # Signals go to trio's thread; no thread of the loop may run a handler mid-call
        # (the threads started here inherit the mask).
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        watcher = threading.Thread(target=self._watch_calls, name="fhmon-slow-call-watch")
        watcher.start()
        try:
            self._dispatch(0)
            self._stopped.wait()  # handed on: the others serve until stop()
        finally:
            self.stop()
            watcher.join()
            for thread in self._threads:
                thread.join()  # each ends after the call it answers

    def _dispatch(self, me: int) -> None:
        """Wait for calls and answer them for as long as this thread is the dispatch thread."""
        mark_signals_blocked()
        while not self._stopping and self._dispatcher == me:
            added_before_wait = self._added  # a listener added later is polled first
            events = self._epoll.poll()
            for fd, mask in events:
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 64)
                    continue
                with self._busy:
                    if self._dispatcher != me:
                        return  # handed on: the new dispatch thread polls afresh
                    entry = self._current = self._targets.get(fd)
                    self._calls += 1
                if entry is not None:
                    self._serve(entry, fd, mask, added_before_wait)
                with self._busy:
                    if self._dispatcher != me:
                        self._put_back(entry, fd)
                        return
                    self._current = None

    def _watch_calls(self) -> None:
        """Every SLOW_CALL: a call in progress since the last look gets the loop handed on."""
        seen = -1
        while not self._stopped.wait(SLOW_CALL):
            with self._busy:
                if self._current is None or self._calls != seen:
                    seen = self._calls
                    continue
                slow, self._current = self._current, None
                # set aside until its call is answered: its next call waits for that one
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(slow.target.listener.fd)
                self._dispatcher += 1
                thread = threading.Thread(target=self._dispatch, args=(self._dispatcher,),
                                          name=f"fhmon-dispatch-{self._dispatcher}")
                self._threads = [t for t in self._threads if t.is_alive()]
                self._threads.append(thread)
                seen = -1
            thread.start()

    def _put_back(self, entry: _Entry | None, fd: int) -> None:
        """After a slow call, with _busy held: its target's listener back in epoll, unless
        the target is gone (removed, hung up, its fd number maybe another's now)."""
        if entry is not None and self._targets.get(fd) is entry:
            with contextlib.suppress(OSError, ValueError):
                self._watch(fd)

    def _serve(self, entry: _Entry, fd: int, mask: int, added_before_wait: int) -> None:
        with entry.serving:
            if self._targets.get(fd) is not entry:
                return  # removed after epoll_wait returned
            target = entry.target
            notif: kernel.Notification | None
            if mask & _HANGUP:
                self._forget(fd, entry)
                return
            if self._shared is not None:
                if not self._shared.try_acquire(target.target_id):
                    os.sched_yield()  # let the worker that holds it (maybe on our CPU) go on
                    return
                try:
                    notif = self._poll_and_receive(fd, entry)
                finally:
                    self._shared.release(target.target_id)
            elif mask & select.EPOLLIN and entry.added <= added_before_wait:
                notif = target.listener.receive_ready()  # cannot block: the module docstring
            else:
                notif = self._poll_and_receive(fd, entry)
            if notif is not None:
                self._answer(target, notif)

    def _poll_and_receive(self, fd: int, entry: _Entry) -> kernel.Notification | None:
        """RECV only if the listener says a call waits: RECV must never block here."""
        ready = entry.target.listener.poll()
        if ready is None:
            self._forget(fd, entry)
            return None
        return entry.target.listener.receive_ready() if ready else None

    def _forget(self, fd: int, entry: _Entry) -> None:
        """The filter has no task left: stop watching its listener and say so."""
        with self._busy:
            if self._targets.get(fd) is not entry:
                return  # removed meanwhile: its task is told already
            del self._targets[fd]
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)
        entry.hung_up()
