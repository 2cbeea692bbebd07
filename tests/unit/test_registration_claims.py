"""monitor/registration.py's sans-IO parts: which fds a HELLO must carry and what a pidfd's
fdinfo (or /proc/PID/status) says about the pids of a process."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

import pytest

from monitor.policy import RegistrationRefused
from monitor.registration import TargetClaim, hello_listener, nspids
from protocol import intake_wire

FDINFO = b"pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nPid:\t%s\nNSpid:\t%s\n"


@pytest.mark.parametrize(("pid", "nspid", "pids"), [
    (b"4242", b"4242", (4242,)),
    (b"4242", b"4242\t7\t1", (4242, 7, 1)),  # nested: fhmon's, then each one inside
    (b"-1", b"-1", ()),  # exited (and reaped)
    (b"0", b"0", ()),  # not in fhmon's pid namespace
    (b"4242", b"4243\t1", ()),  # inconsistent: trusted for nothing
    (b"4242", b"4242\t-1", ()),
])
def test_nspids_of_a_pidfds_fdinfo(pid: bytes, nspid: bytes, pids: tuple[int, ...]) -> None:
    assert nspids(FDINFO % (pid, nspid)) == pids


def test_nspids_of_a_status_file_and_of_other_fds() -> None:
    status = (b"Name:\tpython3\nTgid:\t9\nNgid:\t0\nPid:\t9\nPPid:\t3\nTracerPid:\t0\n"
              b"NSpid:\t9\t2\n")
    assert nspids(status) == (9, 2)
    assert nspids(b"Name:\tx\nPPid:\t3\nTracerPid:\t5\n") is None  # no "Pid:" line
    assert nspids(b"pos:\t0\nflags:\t02\neventfd-count:\t0\n") is None
    assert nspids(b"Pid:\t12\n") == (12,)  # a kernel without NSpid
    assert nspids(b"Pid:\t12\nNSpid:\t12\tx\n") is None


@pytest.fixture
def fds() -> Iterator[list[int]]:
    made: list[int] = []
    for _ in range(2):
        made.extend(os.pipe())
    inodes = {fd: os.fstat(fd).st_ino for fd in made}
    yield made
    for fd in made:  # only those still ours (a closed number may be reused meanwhile)
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == inodes[fd]:
                os.close(fd)


def closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_hello_carries_one_fd_or_with_target_pidfd_two(fds: list[int]) -> None:
    listener, claim = hello_listener(intake_wire.Hello(7, "/s"), fds[:1])
    assert (listener, claim) == (fds[0], TargetClaim(7, None))
    with_pidfd = intake_wire.Hello(7, "/s", flags=intake_wire.HELLO_TARGET_PIDFD)
    listener, claim = hello_listener(with_pidfd, fds[:2])
    assert (listener, claim) == (fds[0], TargetClaim(7, fds[1]))
    assert not closed(fds[0]) and not closed(fds[1])


@pytest.mark.parametrize(("flags", "count", "words"), [
    (0, 2, "exactly one fd (the listener), got 2"),
    (intake_wire.HELLO_TARGET_PIDFD, 1, "exactly two fds with TARGET_PIDFD"),
    (intake_wire.HELLO_TARGET_PIDFD, 3, "exactly two fds with TARGET_PIDFD"),
    (0x4, 1, "unknown HELLO flags 0x4"),
])
def test_a_hello_with_other_fds_is_refused_and_they_are_closed(
        fds: list[int], flags: int, count: int, words: str) -> None:
    with pytest.raises(RegistrationRefused) as refused:
        hello_listener(intake_wire.Hello(7, "/s", flags=flags), fds[:count])
    assert refused.value.errno == errno.EINVAL and words in refused.value.reason
    assert all(closed(fd) for fd in fds[:count])
