"""RECV without a poll first: the kernel behaviour the dispatch thread rests on.

The dispatch thread RECVs straight after epoll reports a call on a listener it alone
receives from (monitor/plane/answer_loop.py). RECV ignores O_NONBLOCK, so this is safe only
if a call withdrawn between the two (its caller was signalled, or died) leaves RECV
answering ENOENT at once instead of sleeping until the next call. These tests hold the
kernel to that, then make the withdrawal happen while the dispatch thread holds the event:
a blocked RECV would leave another target's call unanswered.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import signal
import threading
from collections.abc import Iterator

import pytest

from monitor import seccomp_filter
from monitor.listener import Listener, SharedReceiveLock
from monitor.plane.answer_loop import PythonAnswerLoop
from protocol import kernel
from tests.support import NOBODY, SYSTEM_PYTHON, readable, thread_syscalls, wait_until

# One name_to_handle_at (trapped by the filter), its result into a pipe, then a long sleep.
# SIGUSR1 has a handler (Python sets no SA_RESTART): it withdraws the waiting call, which
# fails EINTR.
CALLER = r"""
import ctypes, signal, sys, time
signal.signal(signal.SIGUSR1, lambda *_: None)
libc = ctypes.CDLL(None, use_errno=True)
handle = ctypes.create_string_buffer((128).to_bytes(4, "little"), 8 + 128)
mount_id = ctypes.c_int()
ret = libc.syscall(303, -100, b"/", handle, ctypes.byref(mount_id), 0)
import os; os.write(int(sys.argv[1]), f"{ret} {ctypes.get_errno()}".encode())
time.sleep(120)
"""
ANSWER = errno.EPERM  # what the test's answer function fails every call with
FUTEX = 202  # x86_64: the dispatch thread waits for its lock


class Caller:
    """A process under the handle filter that makes one call when started."""

    def __init__(self) -> None:
        self._result, result_w = os.pipe()
        os.set_inheritable(result_w, True)
        try:
            self.pid, fd, self._channel = seccomp_filter.fork_under_filter(
                (NOBODY, NOBODY), [SYSTEM_PYTHON, "-c", CALLER, str(result_w)])
        finally:
            os.close(result_w)
        self.listener = Listener(fd)

    def start(self) -> None:
        seccomp_filter.go(self._channel)

    def outcome(self, timeout: float = 10.0) -> tuple[int, int] | None:
        """(return value, errno) of its call, once it returned."""
        if not readable(self._result, timeout):
            return None
        ret, err = os.read(self._result, 64).split()
        return int(ret), int(err)

    def waiting(self, timeout: float = 10.0) -> bool:
        poller = select.poll()
        poller.register(self.listener.fd, select.POLLIN)
        return bool(poller.poll(int(timeout * 1000)))

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)

    def close(self) -> None:
        self.kill()  # also wakes a RECV left sleeping on its listener
        self._channel.close()
        self.listener.close()
        os.close(self._result)


@pytest.fixture
def callers() -> Iterator[list[Caller]]:
    made: list[Caller] = []
    yield made
    for caller in made:
        caller.close()


def recv_within(listener: Listener, timeout: float) -> tuple[bool, kernel.Notification | None]:
    """(whether RECV returned within timeout, what it returned)."""
    got: list[kernel.Notification | None] = []
    thread = threading.Thread(target=lambda: got.append(listener.receive_ready()), daemon=True)
    thread.start()
    thread.join(timeout)
    return (not thread.is_alive(), got[0] if got else None)


def test_recv_of_a_withdrawn_call_fails_at_once(callers: list[Caller]) -> None:
    caller = Caller()
    callers.append(caller)
    caller.start()
    assert caller.waiting(), "the call never reached the listener"
    os.kill(caller.pid, signal.SIGUSR1)
    assert caller.outcome() == (-1, errno.EINTR)
    assert caller.listener.poll() is False  # nothing waits any more ...
    returned, notif = recv_within(caller.listener, 5.0)
    assert returned, "RECV slept after its call was withdrawn"
    assert notif is None  # ... and RECV says so: ENOENT


def test_recv_after_the_caller_died_fails_at_once(callers: list[Caller]) -> None:
    caller = Caller()
    callers.append(caller)
    caller.start()
    assert caller.waiting(), "the call never reached the listener"
    caller.kill()
    assert caller.listener.poll() is None  # hung up
    returned, notif = recv_within(caller.listener, 5.0)
    assert returned, "RECV slept on a listener whose caller died"
    assert notif is None


def _in_syscall(thread: threading.Thread, nr: int) -> bool:
    fields = thread_syscalls(os.getpid()).get(thread.native_id or 0)
    return fields is not None and fields[0] == str(nr)


class _Served:
    def __init__(self, listener: Listener) -> None:
        self.listener = listener


def test_dispatch_thread_survives_a_call_withdrawn_before_its_recv(
        callers: list[Caller]) -> None:
    """The thread takes the event, the call is withdrawn, then it RECVs: it must go on to
    answer another listener's call."""
    withdrawn, other = Caller(), Caller()
    callers += [withdrawn, other]
    answered: list[int] = []

    def answer(target: _Served, notif: kernel.Notification) -> None:
        answered.append(notif.pid)
        target.listener.respond(notif.id, error=ANSWER)

    dispatch = PythonAnswerLoop(answer)  # type: ignore[arg-type]  # needs only .listener
    # Added before the thread first waits: a listener added during a wait is polled first.
    for caller in (withdrawn, other):
        dispatch.add(_Served(caller.listener), lambda: None)  # type: ignore[arg-type]
    thread = threading.Thread(target=dispatch.run, daemon=True)
    thread.start()
    try:
        with dispatch._busy:  # the thread wakes for the call but cannot serve it yet
            withdrawn.start()
            assert withdrawn.waiting()
            # epoll_wait returned with the event: the thread now waits for the lock
            assert wait_until(lambda: _in_syscall(thread, FUTEX))
            os.kill(withdrawn.pid, signal.SIGUSR1)
            assert withdrawn.outcome() == (-1, errno.EINTR)
        other.start()
        assert other.outcome() == (-1, ANSWER), "the dispatch thread stopped serving"
        assert answered == [other.pid]
    finally:
        dispatch.stop()
        withdrawn.kill()  # a RECV left sleeping on its listener returns
        thread.join(10)
        assert not thread.is_alive()
        dispatch.close()


def test_shared_receive_locks_exclude_each_other_per_target() -> None:
    """Each worker's lock is its own open file description of one file: a key held by one
    is busy for the other, another key is not, and a release frees it."""
    shared = os.memfd_create("test-receive-lock", os.MFD_CLOEXEC)
    first = SharedReceiveLock.adopt(os.dup(shared))
    second = SharedReceiveLock.adopt(shared)
    with pytest.raises(OSError):
        os.fstat(shared)  # adopt closed the fd it was given
    probe = SharedReceiveLock._FLOCK

    def busy(lock: SharedReceiveLock, key: int) -> bool:
        try:
            fcntl.fcntl(lock.fd, fcntl.F_OFD_SETLK, probe.pack(fcntl.F_WRLCK, 0, key, 1, 0))
        except BlockingIOError:
            return True
        fcntl.fcntl(lock.fd, fcntl.F_OFD_SETLK, probe.pack(fcntl.F_UNLCK, 0, key, 1, 0))
        return False

    try:
        assert first.try_acquire(7)
        assert busy(second, 7) and not second.try_acquire(7)
        assert not busy(second, 8)
        first.release(7)
        assert not busy(second, 7)
    finally:
        first.close()
        second.close()
