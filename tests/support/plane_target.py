"""A real target served by a monitor._native.Plane made in the test's own process.

For the tests that need the plane's test hooks or its threads in reach (the panic hook,
the threads' waits in /proc/self/task): in_process_plane() makes the plane; the target
runs `python -c PROGRAM PATH OUT
ARGS...` as uid 65534 under the real handle filter, OUT the write end of a pipe the test
reads; it is registered with the plane and held until go(). Everything is closed and the
target reaped when the block ends, whatever happened in it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from monitor import policy, seccomp_filter
from monitor.dataplane import native_share_root
from tests.support.world import NOBODY, World


def _ignore_call(target_id: int, raw: bytes) -> None:
    pass


def _ignore_hang_up(target_id: int) -> None:
    pass


@contextlib.contextmanager
def in_process_plane(threads: int | str) -> Iterator[Any]:
    """A monitor._native.Plane in this process, signing with a fixed test key, with
    data_plane_threads = threads; its fallback and hang-up callbacks do nothing."""
    from monitor import _native
    from monitor.dataplane import native_threads
    from monitor.handlers.name_to_handle_at import ACCEPTED_FLAGS
    from monitor.metrics import LATENCY_BUCKETS

    count, auto = native_threads(threads)
    config = _native.PlaneConfig(accepted_flags=ACCEPTED_FLAGS, signing=True,
                                 threads_per_target=count, auto_threads=auto,
                                 buckets=list(LATENCY_BUCKETS))
    plane = _native.Plane(config, _ignore_call, _ignore_hang_up)
    plane.set_keys(_native.KeyRing({1: bytes(range(32))}, 1))
    try:
        yield plane
    finally:
        plane.stop()


@dataclass
class PlaneTarget:
    pid: int
    read_end: int
    channel: Any

    def go(self) -> None:
        """Release the target: it runs PROGRAM from here."""
        seccomp_filter.go(self.channel)

    def wait(self) -> int:
        """Reap the target; its wait status."""
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        return status


@contextlib.contextmanager
def plane_target(plane: Any, world: World, program: str, path: str, *args: str,
                 target_id: int = 7) -> Iterator[PlaneTarget]:
    """The target, added to `plane` as target_id for a share of world.main."""
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    share = policy.pin_share(root, str(world.main), [str(world.shares / "*")])
    os.close(root)
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    pid, listener, channel = seccomp_filter.fork_under_filter(
        (NOBODY, NOBODY), [sys.executable, "-c", program, path, str(write_end), *args])
    os.close(write_end)
    target = PlaneTarget(pid, read_end, channel)
    try:
        plane.add(target_id, listener, 0, native_share_root(share))
        yield target
    finally:
        if target.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target.pid, 9)
            os.waitpid(target.pid, 0)
        os.close(read_end)
        os.close(listener)
        channel.close()
        share.close()
