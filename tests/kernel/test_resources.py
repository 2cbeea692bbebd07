"""fhmon out of fds while it answers: the call gets the errno the kernel would give
(EMFILE), never silence, and fhmon goes on once fds are free again."""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Iterator

import pytest

from tests.support import Agent, Service, World
from tests.support.handles import N2HResult


def lowest_free_fd(pid: int) -> int:
    used = {int(n) for n in os.listdir(f"/proc/{pid}/fd")}
    return next(n for n in range(len(used) + 1) if n not in used)


@pytest.fixture
def service(world: World) -> Iterator[Service]:
    with Service(world.base, [str(world.shares / "*")], name="fd-limit") as s:
        yield s


def test_out_of_fds_the_target_gets_emfile_and_fhmon_goes_on(service: Service,
                                                             world: World) -> None:
    """fhmon's RLIMIT_NOFILE set to its lowest free fd number: every fd it would open
    fails with EMFILE. Lookups (which open the target's cwd or dirfd) and opens by handle
    (pidfd_getfd, the reopen) are answered, with EMFILE or success, within seconds;
    afterwards the same calls succeed."""
    agent = Agent(world, "fhmon", world.main, service.socket)
    try:
        h = N2HResult.of(agent.call("n2h", path="file"))
        assert h.errno == 0
        limits = resource.prlimit(service.pid, resource.RLIMIT_NOFILE)
        calls = [("n2h", {"path": "file"}), ("n2h", {"path": "dir/inner"}),
                 ("obh", {"handle_type": h.handle_type, "f_handle": h.f_handle.hex()}),
                 ("n2h", {"path": "missing"})]
        answers: list[tuple[str, int]] = []
        try:
            free = lowest_free_fd(service.pid)
            resource.prlimit(service.pid, resource.RLIMIT_NOFILE, (free, limits[1]))
            for op, args in calls * 3:
                got = agent.call(op, answer_within=10, **args)
                answers.append((op, int(got["errno"])))
        finally:
            resource.prlimit(service.pid, resource.RLIMIT_NOFILE, limits)
        assert service.proc is not None and service.proc.poll() is None
        assert {e for _, e in answers} <= {0, errno.EMFILE, errno.ENOENT}, answers
        assert errno.EMFILE in {e for _, e in answers}, answers  # the limit did bite
        for op, args in calls[:3]:
            assert agent.call(op, answer_within=10, **args)["errno"] == 0
    finally:
        agent.close()
