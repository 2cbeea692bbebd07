"""The native plane survives a panic in a call's work.

A real target (uid 65534 under the real handle filter) is served by a monitor._native.Plane
made in this process, so that its test hook (Plane.panic_next_calls) can make the work of
the next call panic. The call must be answered EIO (what the reference's registry answers
when a handler raises), the panic counted, and the same thread must answer the calls after
it: with a single thread per target, a thread that died would leave the next call waiting.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.support import World, readable
from tests.support.native_hooks import require_test_hooks
from tests.support.plane_target import in_process_plane, plane_target

_native = pytest.importorskip("monitor._native")

# The target: name_to_handle_at(AT_FDCWD, path, ...) `calls` times, each errno on a line.
CALLER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
path, out, calls = sys.argv[1].encode(), int(sys.argv[2]), int(sys.argv[3])
for _ in range(calls):
    buf = ctypes.create_string_buffer(8 + 128)
    ctypes.c_uint32.from_buffer(buf).value = 128
    mnt = ctypes.c_int(0)
    ret = libc.name_to_handle_at(-100, path, buf, ctypes.byref(mnt), 0)
    os.write(out, b"%d\n" % (0 if ret == 0 else ctypes.get_errno()))
"""


@pytest.fixture
def plane() -> Iterator[object]:
    require_test_hooks()  # Plane.panic_next_calls
    with in_process_plane(1) as p:
        yield p


def _answers(read_end: int, count: int, timeout: float) -> list[int]:
    """The target's errnos, one per call; fewer if a call is not answered in time."""
    data = b""
    deadline = time.monotonic() + timeout
    while data.count(b"\n") < count and time.monotonic() < deadline:
        if readable(read_end, deadline - time.monotonic()):
            chunk = os.read(read_end, 4096)
            if not chunk:
                break
            data += chunk
    return [int(line) for line in data.split()]


def test_a_panic_is_answered_eio_and_its_thread_serves_on(world: World, plane: object) -> None:
    p: _native.Plane = plane  # type: ignore[assignment]
    calls = 4
    with plane_target(p, world, CALLER, str(world.main / "file"), str(calls)) as target:
        p.panic_next_calls(2)
        target.go()
        answers = _answers(target.read_end, calls, timeout=20)
        # the two panicking calls answered EIO, the next ones by the same (only) thread
        assert answers == [errno.EIO, errno.EIO, 0, 0], answers
        # a call is counted just after its answer: gather until all four are
        results: Counter[tuple[str, int]] = Counter()
        counted: Counter[int] = Counter()
        panics = 0
        deadline = time.monotonic() + 10
        while sum(counted.values()) < calls and time.monotonic() < deadline:
            stats = p.take_stats()
            results.update({(s, code): k for s, code, k in stats.results})
            counted.update(dict(stats.calls))
            panics += stats.panics
            time.sleep(0.01)
        assert panics == 2
        assert results == {("name_to_handle_at", errno.EIO): 2,
                           ("name_to_handle_at", 0): 2}, results
        assert counted == {7: calls}, counted
        p.remove(7)
    print(json.dumps({"answers": answers, "panics": panics}))


def _kept_fd_dirs() -> int:
    """Our fds on /proc/<pid>/fd: one per native thread (its Baseline keeps one)."""
    ours = f"/proc/{os.getpid()}/fd"
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}") == ours
        except OSError:
            continue  # the listing's own fd, closed by now
    return count


def test_a_target_is_set_up_when_add_returns(world: World) -> None:
    """Plane.add returns once each of the target's threads holds what it keeps (its
    Baseline's /proc/self/fd): what fhmon holds for a target must not still grow after the
    registration, or a count taken then (an operator's, the adversarial suite's fd guard)
    sees a leak that is none. Ten targets of two threads each, counted at once."""
    path = world.main / "file"
    with in_process_plane(2) as p:
        before = _kept_fd_dirs()
        for i in range(10):
            with plane_target(p, world, CALLER, str(path), "0", target_id=100 + i):
                assert _kept_fd_dirs() == before + 2 * (i + 1)
