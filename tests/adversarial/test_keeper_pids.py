"""After a restart, the keeper's stop/continue reaches only its own targets.

Found: after a restart the keeper's records were acted on by pid: fhmon SIGSTOPped and
SIGCONTinued the pid a deposited target once had, which had passed to another user's
process. Now the keeper opens a pidfd when first told of a target and signals only through
it (pidfd_send_signal): once that process has exited, the signal fails with ESRCH.

What is forced here, and how: the target process (uid 65534, under the real filter,
registered over the OCI convention) forks a child that keeps the filter alive and exits;
the test reaps it, then makes the kernel give that very pid to a new process of uid 65533
(writing /proc/sys/kernel/ns_last_pid just before the fork, retried if some other process
of the machine took the number first, with a new target if that process lives on). Then
fhmon is SIGKILLed and restarted, so that the keeper hands the listener back and restarts
stuck calls. The uid-65533 process records any
SIGCONT it gets (a SIGSTOP alone cannot be caught, but the continue that follows it can).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from monitor import fdpass, seccomp_filter
from tests.adversarial.common import PRIVILEGE
from tests.adversarial.recording import Recorder
from tests.support import SYSTEM_PYTHON, Service, World, readable, wait_until
from tests.support.keeper import KeeperProc
from tests.support.pids import SCENARIOS, reuse_number

# The target: forks a child that stays (under the same filter) and writes its pid; exits.
TARGET = """
import os, sys, time
child = os.fork()
if child == 0:
    time.sleep(3600)
    os._exit(0)
with open(sys.argv[1], "w") as out:
    out.write(str(child))
os._exit(0)
"""

# The bystander that takes the pid: notes every SIGCONT it receives.
BYSTANDER = """
import signal, sys, time
def noted(*_):
    with open(sys.argv[1], "a") as out:
        out.write("SIGCONT\\n")
signal.signal(signal.SIGCONT, noted)
print("ready", flush=True)
time.sleep(3600)
"""


def spawn_at_pid(pid: int, argv: list[str], uid: int) -> subprocess.Popen[str] | str:
    """A new process of uid at exactly `pid`, or why not (tests/support/pids.py)."""
    def spawn() -> subprocess.Popen[str]:
        return subprocess.Popen(argv, user=uid, group=uid, extra_groups=[],
                                stdout=subprocess.PIPE, text=True)

    def discard(proc: subprocess.Popen[str]) -> None:
        proc.kill()
        proc.wait()

    return reuse_number(pid, spawn, lambda proc: proc.pid, discard)


def oci_state(pid: int, share: str) -> bytes:
    return json.dumps({"ociVersion": "1.0.2", "fds": ["seccompFd"], "pid": pid,
                       "metadata": f"share={share}",
                       "state": {"ociVersion": "1.0.2", "id": "reuse", "status": "creating",
                                 "pid": pid, "bundle": "/tmp/b"}},
                      separators=(",", ":")).encode()


def test_a_reused_pid_is_never_stopped_by_the_keeper(world: World, record: Recorder) -> None:
    """If a task elsewhere takes the freed pid first and lives on, the scenario starts over
    with a new target (a new pid), each time with a new keeper and fhmon."""
    missed: list[str] = []
    while len(missed) < SCENARIOS:
        why_not = reused_pid_scenario(world, record, len(missed))
        if why_not is None:
            return
        missed.append(why_not)
    pytest.fail("the target's pid never came to the bystander: " + "; ".join(missed))


def reused_pid_scenario(world: World, record: Recorder, n: int) -> str | None:
    """The scenario once (recorded), or why the freed pid could not be handed on."""
    keeper = KeeperProc(world.base, f"reuse-keeper-{n}")
    keeper.start()
    service = Service(world.base, [str(world.shares / "*")], name=f"reuse-{n}",
                      extra=["--keeper", keeper.socket])
    child_file = world.base / f"reuse-child-{n}.pid"
    noted = world.base / f"reuse-sigcont-{n}.txt"
    noted.touch()
    noted.chmod(0o666)
    os.chmod(world.base, 0o755)
    bystander: subprocess.Popen[str] | None = None
    grandchild = 0
    try:
        pid, listener, channel = seccomp_filter.fork_under_filter(
            (65534, 65534), [SYSTEM_PYTHON, "-c", TARGET, str(child_file)])
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:  # like runc
            sock.connect(service.socket)
            sock.sendmsg([oci_state(pid, str(world.main))], fdpass.rights([listener]))
        assert wait_until(lambda: keeper.holds() == 1, 15), service.log_text()[-2000:]
        os.close(listener)  # runc keeps no copy
        child_file.touch()
        os.chown(child_file, 65534, 65534)
        seccomp_filter.go(channel)
        os.waitpid(pid, 0)  # the target process is gone; its child keeps the filter alive
        channel.close()
        assert wait_until(lambda: child_file.read_text().strip().isdigit(), 10)
        grandchild = int(child_file.read_text())
        spawned = spawn_at_pid(pid, [SYSTEM_PYTHON, "-c", BYSTANDER, str(noted)], 65533)
        if isinstance(spawned, str):
            return spawned
        bystander = spawned
        assert bystander.stdout is not None and bystander.stdout.readline() == "ready\n"
        status = Path(f"/proc/{pid}/status").read_text()
        assert "\nUid:\t65533" in status  # the pid now names uid 65533's process

        service.stop(signal.SIGKILL)
        service.start()  # withdraws the listener from the keeper: stuck calls restarted
        # restored, or refused (the pid is no longer under a filter): either way after the
        # restart of stuck calls
        assert wait_until(lambda: '"event":"target_restored"' in service.log_text()
                          or '"event":"restore_refused"' in service.log_text(), 15)
        time.sleep(0.5)
        signals = noted.read_text().split()
        record(PRIVILEGE, "a deposited target's process exits (its child keeps the filter "
               "alive) and its pid passes to uid 65533's process; fhmon restarts",
               "the uid-65533 process is never stopped or continued",
               f"it got {len(signals)} SIGCONT; {'alive' if bystander.poll() is None else 'GONE'}",
               ok=not signals and bystander.poll() is None)
        return None
    finally:
        if bystander is not None:
            bystander.kill()
            bystander.wait()
        if grandchild:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, signal.SIGKILL)
        service.stop()
        keeper.stop()


# A target that makes one name_to_handle_at when told (a byte on fd argv[1]) and writes the
# errno it got to fd argv[2].
CALLER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
go, out, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
os.read(go, 1)
handle = ctypes.create_string_buffer(8 + 128)
ctypes.memmove(handle, (128).to_bytes(4, "little"), 4)
mount_id = ctypes.c_int()
rc = libc.syscall(303, -100, path, handle, ctypes.byref(mount_id), 0)
os.write(out, str(0 if rc == 0 else ctypes.get_errno()).encode())
"""


def test_the_keeper_restarts_a_call_a_dead_fhmon_received(world: World) -> None:
    """The pidfd path does its job: a call RECV'd by an fhmon that then died (played by
    this test, which receives it and drops its copy) is made again once the keeper
    stops and continues the target for the next fhmon, and answered."""
    import select

    from monitor.listener import Listener

    keeper = KeeperProc(world.base, "stuck-keeper")
    keeper.start()
    service = Service(world.base, [str(world.shares / "*")], name="stuck",
                      extra=["--keeper", keeper.socket])
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    for fd in (go_r, out_w):
        os.set_inheritable(fd, True)
    pid = 0
    try:
        pid, listener, channel = seccomp_filter.fork_under_filter(
            (65534, 65534), [SYSTEM_PYTHON, "-c", CALLER, str(go_r), str(out_w),
                             str(world.main / "file")])
        os.close(go_r)
        os.close(out_w)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(service.socket)
            sock.sendmsg([oci_state(pid, str(world.main))], fdpass.rights([listener]))
        assert wait_until(lambda: keeper.holds() == 1, 15)
        seccomp_filter.go(channel)
        channel.close()
        service.stop(signal.SIGKILL)  # now only the keeper and this test hold the listener
        os.write(go_w, b"x")
        poll = select.poll()
        poll.register(listener, select.POLLIN)
        assert poll.poll(10_000), "the call never arrived"
        stuck = Listener(listener).receive_ready()  # received, never answered: as if fhmon died
        assert stuck is not None
        os.close(listener)
        assert not readable(out_r, 0.5), "answered without anyone"
        service.start()  # the keeper restarts the call through its pidfd; fhmon answers it
        ready = readable(out_r, 15)
        assert ready, "the stuck call was never made again"
        assert os.read(out_r, 16) == b"0"
    finally:
        for fd in (go_w, out_r):
            os.close(fd)
        if pid:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        service.stop()
        keeper.stop()
