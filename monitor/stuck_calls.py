"""Making a target's stuck calls trap again, for a new fhmon.

Calls a dead fhmon had received but not answered stay blocked until answered by their id,
which died with it. SIGSTOP interrupts the wait (the kernel drops the notification) and,
since neither signal has a handler, SIGCONT resumes the thread into the restarted
syscall, which traps again with a new id for the next fhmon. Nothing runs twice with a
visible effect: an answer (and ADDFD_FLAG_SEND's fd) either reached the target before
fhmon died, or nothing did.

Used by the keeper and fhmon serve's restore (the native launcher, native/launcher, does the
same for its own child). Every
signal goes through a pidfd, so a pid that passed to another process is never signalled;
/proc/PID is read only to see when every thread has stopped, and only while the pidfd
says the process lives (a stopped process cannot exit, so its pid is still its).
"""

from __future__ import annotations

import contextlib
import os
import signal

import trio

STOP_WAIT = 2.0  # seconds for every thread to stop before SIGCONT regardless


async def restart_stuck_calls(pidfd: int, pid: int) -> bool:
    """SIGSTOP, wait until every thread of pid stopped, SIGCONT; False if it is gone."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    try:
        with trio.move_on_after(STOP_WAIT):
            while _alive(pidfd) and not all_threads_stopped(pid):
                await trio.sleep(0.001)
    finally:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGCONT)
    return True


async def restart_stuck_calls_of(pid: int) -> bool:
    """The same for a pid with no pidfd yet (one is opened now): for a process that cannot
    have been reaped meanwhile (the launcher's own child) or as a best effort."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        return await restart_stuck_calls(pidfd, pid)
    finally:
        os.close(pidfd)


def all_threads_stopped(pid: int) -> bool:
    """Every thread of pid is stopped (T/t) or dead: its pending call has been dropped."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"T", b"t", b"Z", b"X"):
            return False
    return True


def _alive(pidfd: int) -> bool:
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
