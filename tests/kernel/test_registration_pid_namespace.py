"""A HELLO from a client in another pid namespace (a launcher in a Kubernetes container) names
its target by that namespace's numbers; fhmon must find the same process by its own.

Found running the injected virt-launcher pod under runc (tests/e2e/test_runc_e2e.py): every
container has its own pid namespace, the launcher's child is pid 6 there, and fhmon refused
"process 6 does not belong to uid 107". The kernel is the oracle: a real pid namespace.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time

import pytest

from monitor.policy import RegistrationRefused
from monitor.registration import pid_in_our_namespace

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a new pid namespace needs root")


def children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found += [int(p) for p in handle.read().split()]
    return found


def test_a_pid_from_the_clients_pid_namespace_is_translated() -> None:
    # unshare's child is pid 1 of the new namespace (the "launcher"); its sleep is pid 2.
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "/bin/sh", "-c",
                             "sleep 60 & echo ready; wait"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 10
        while True:
            (shell,) = children(proc.pid)
            sleepers = children(shell)
            if sleepers or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        (sleeper,) = sleepers
        assert pid_in_our_namespace(2, shell) == sleeper
        assert pid_in_our_namespace(1, shell) == shell
        with pytest.raises(RegistrationRefused) as refused:
            pid_in_our_namespace(3, shell)   # no such process there
        assert refused.value.errno == errno.ESRCH
        # The host's own pid 2 (kthreadd) is not the namespace's pid 2.
        assert pid_in_our_namespace(2, shell) != 2
    finally:
        proc.kill()   # --kill-child: its pid 1 goes too, and the namespace with it
        proc.wait(10)


def test_a_client_in_our_pid_namespace_keeps_its_numbers() -> None:
    assert pid_in_our_namespace(12345678, os.getpid()) == 12345678


def test_an_unreadable_client_namespace_is_refused() -> None:
    with pytest.raises(RegistrationRefused) as refused:
        pid_in_our_namespace(2, 2**22 + 12345)   # no such client process
    assert refused.value.errno == errno.ESRCH
