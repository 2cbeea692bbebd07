"""data_plane_threads = "auto": the second reader reads only while it may use another CPU.

A real target (uid 65534 under the real handle filter) makes calls for a few seconds while
a monitor._native.Plane made in this process serves it with two threads, the second under
the "auto" rule (native/src/plane/spare.rs Spare). What each thread waits in is read from the
kernel (/proc/self/task/TID/syscall): a reader is in ioctl(SECCOMP_IOCTL_NOTIF_RECV), a
parked spare in futex. Unpinned, both read; with every thread of this process pinned to one
CPU, the spare parks within its once-a-second look at its affinity; unpinned again, it
reads again. Every call is answered throughout.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.kernel import SECCOMP_IOCTL_NOTIF_RECV
from tests.support import NOBODY, World, readable, thread_syscalls, wait_until
from tests.support.plane_target import in_process_plane, plane_target
from tests.support.world import lease_break_time

_native = pytest.importorskip("monitor._native")

SYS_IOCTL = 16
SYS_FUTEX = 202
SYS_OPENAT = 257

# The target: name_to_handle_at(AT_FDCWD, path) for `seconds`, then "calls failures".
CALLER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
path, out, seconds = sys.argv[1].encode(), int(sys.argv[2]), float(sys.argv[3])
calls = failures = 0
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    buf = ctypes.create_string_buffer(8 + 128)
    ctypes.c_uint32.from_buffer(buf).value = 128
    mnt = ctypes.c_int(0)
    calls += 1
    if libc.name_to_handle_at(-100, path, buf, ctypes.byref(mnt), 0) != 0:
        failures += 1
os.write(out, b"%d %d\n" % (calls, failures))
"""


@pytest.fixture
def auto_plane() -> Iterator[object]:
    with in_process_plane("auto") as plane:
        yield plane


def _plane_threads(target_id: int) -> dict[int, int]:
    """TID of each of the target's plane threads, by index (thread name fhmon-tID-K)."""
    found = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            prefix = f"fhmon-t{target_id}-"
            if name.startswith(prefix):
                found[int(name[len(prefix):])] = int(tid)
    return found


def _waits_in(tid: int) -> str:
    """What the kernel says the thread is blocked in: "recv", "futex", "openat" or "other"
    (running, or in another syscall)."""
    return _wait_of(thread_syscalls(os.getpid())[tid])


def _wait_of(fields: list[str]) -> str:
    """_waits_in for the fields of one thread's /proc/.../syscall."""
    if fields[0] == str(SYS_IOCTL) and int(fields[2], 16) == SECCOMP_IOCTL_NOTIF_RECV:
        return "recv"
    if fields[0] == str(SYS_FUTEX):
        return "futex"
    if fields[0] == str(SYS_OPENAT):
        return "openat"
    return "other"


def _pin_every_thread(cpus: set[int]) -> None:
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


def test_the_spare_reads_only_while_it_may_use_a_second_cpu(world: World,
                                                            auto_plane: object) -> None:
    p: _native.Plane = auto_plane  # type: ignore[assignment]
    every_cpu = os.sched_getaffinity(0)
    if len(every_cpu) < 2:
        pytest.skip("needs two CPUs: the rule under test is about a second one")
    seen: list[tuple[str, str]] = []
    try:
        with plane_target(p, world, CALLER, str(world.main / "file"), "12") as target:
            assert wait_until(lambda: len(_plane_threads(7)) == 2, 5), _plane_threads(7)
            threads = _plane_threads(7)
            assert sorted(threads) == [0, 1], threads
            spare = threads[1]
            # unpinned and idle: both threads read
            assert wait_until(lambda: _waits_in(spare) == "recv", 5), _waits_in(spare)
            target.go()
            _pin_every_thread({min(every_cpu)})
            assert wait_until(lambda: _waits_in(spare) == "futex", 6), "the spare never parked"
            seen.append(("pinned", _waits_in(spare)))
            time.sleep(1.5)  # still parked a full recheck later
            assert _waits_in(spare) == "futex"
            _pin_every_thread(every_cpu)
            assert wait_until(lambda: _waits_in(spare) == "recv", 6), "the spare never read again"
            seen.append(("unpinned", _waits_in(spare)))
            status = target.wait()
            calls, failures = (int(x) for x in os.read(target.read_end, 100).split())
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
            assert calls > 0 and failures == 0, (calls, failures)
            p.remove(7)
    finally:
        _pin_every_thread(every_cpu)
    print(seen)


# The target: a signed handle of its own file (through the plane), a write lease on that
# file (never let go: the kernel breaks it after lease-break-time), then two threads that
# open it by handle at once; "errno errno" at the end.
LEASER = r"""
import ctypes, fcntl, os, signal, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
path, out = sys.argv[1].encode(), int(sys.argv[2])
buf = ctypes.create_string_buffer(8 + 128)
ctypes.c_uint32.from_buffer(buf).value = 128
mnt = ctypes.c_int(0)
assert libc.name_to_handle_at(-100, path, buf, ctypes.byref(mnt), 0) == 0, ctypes.get_errno()
signal.signal(signal.SIGIO, signal.SIG_IGN)
held = os.open(path, os.O_RDONLY)
fcntl.fcntl(held, 1024, 1)  # F_SETLEASE F_WRLCK
share = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
errnos = [None, None]
def open_it(i):
    fd = libc.syscall(304, share, buf, os.O_RDONLY)
    errnos[i] = 0 if fd >= 0 else ctypes.get_errno()
threads = [threading.Thread(target=open_it, args=(i,)) for i in range(2)]
for t in threads: t.start()
for t in threads: t.join()
os.write(out, b"%d %d\n" % tuple(errnos))
"""


def test_under_auto_a_targets_calls_work_one_at_a_time(world: World,
                                                       auto_plane: object) -> None:
    """Two opens of one target, each waiting for the break of the target's own lease: the
    plane's two threads must not both wait in the kernel's open at once (the work lock:
    at most one CPU of the plane per target); the second waits for the lock, in futex."""
    p: _native.Plane = auto_plane  # type: ignore[assignment]
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs: on one the second thread parks anyway")
    leased = world.main / "leased_by_the_target"
    leased.write_text("the target's own file\n")
    os.chown(leased, NOBODY, NOBODY)
    samples: list[tuple[str, str]] = []
    try:
        with lease_break_time(3), plane_target(p, world, LEASER, str(leased)) as target:
            assert wait_until(lambda: len(_plane_threads(7)) == 2, 5)
            threads = _plane_threads(7)
            target.go()
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                now = thread_syscalls(os.getpid())  # both threads in one look
                states = tuple(_wait_of(now[threads[k]]) for k in (0, 1))
                samples.append(states)  # type: ignore[arg-type]
                if readable(target.read_end, 0.02):
                    break
            answers = [int(x) for x in os.read(target.read_end, 100).split()]
            status = target.wait()
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
            assert answers == [0, 0], answers  # both opened once the lease was broken
            p.remove(7)
    finally:
        leased.unlink()
    both_in_open = [s for s in samples if s == ("openat", "openat")]
    one_waits = [s for s in samples if set(s) == {"openat", "futex"}]
    # the lease held the first open about 3 s: sampled every 20 ms, the second thread
    # waited for the work lock in futex meanwhile, and never opened alongside
    assert len(one_waits) >= 20, samples
    assert not both_in_open, both_in_open
