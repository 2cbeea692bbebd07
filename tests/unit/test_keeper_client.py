"""KeeperClient.sync against a real unix socket: a deposit that fails inside a session ends
that session only, never fhmon."""

from __future__ import annotations

import os
import resource
import socket
import tempfile
from types import SimpleNamespace
from typing import Any

import trio

from monitor.keeper_client import KeeperClient


class Deposits:
    def __init__(self) -> None:
        self.outcomes: list[str] = []

    def count_deposit(self, outcome: str) -> None:
        self.outcomes.append(outcome)


def oci_target(listener_fd: int) -> Any:
    """What keeper_record and the deposit read of a registered OCI target."""
    return SimpleNamespace(target_id=1, convention="oci", pid=os.getpid(),
                           listener=SimpleNamespace(fd=listener_fd),
                           share=SimpleNamespace(facts=SimpleNamespace(
                               target_path="/s", share_id=b"\x01" * 32)),
                           peer=SimpleNamespace(uid=0, gid=0))


async def test_a_deposit_that_fails_in_a_session_is_retried_not_raised() -> None:
    """sendmsg fails inside the session's nursery (here EBADF, the kernel's own error),
    which trio raises as an exception group: it escaped sync's `except OSError` and would
    have ended `fhmon serve`. Now the session ends and sync connects again, as for any
    keeper error."""
    # under /tmp: pytest's tmp_path may be longer than a socket path may be (a long TMPDIR)
    with tempfile.TemporaryDirectory(prefix="fhmon-kc-", dir="/tmp") as short:
        await _retried(os.path.join(short, "k.sock"))


async def _retried(path: str) -> None:
    server = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await server.bind(path)
    server.listen(16)
    # an fd number above the fd limit: never open, so sendmsg's SCM_RIGHTS fails EBADF (a
    # freshly closed number would be reused by the session's own socket)
    never_open = resource.getrlimit(resource.RLIMIT_NOFILE)[1] + 1
    client = KeeperClient(path, Deposits(), lambda: [oci_target(never_open)])  # type: ignore[arg-type]
    accepted: list[trio.socket.SocketType] = []
    with server:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.sync)
            with trio.fail_after(10):
                while len(accepted) < 3:  # it came back, again and again
                    conn, _ = await server.accept()
                    accepted.append(conn)
            nursery.cancel_scope.cancel()
    for conn in accepted:
        conn.close()
