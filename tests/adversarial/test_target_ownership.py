"""A registration belongs to its client.

A client once linked to its target only by uid equality and "runs under some filter": uid
65534 could name any filtered process of uid 65534 (another tenant's virtiofsd) and fhmon
pinned that tenant's mount for it, and refused that tenant's own registration later
(EBUSY); uid 0 skipped even that, so a root pod without hostPID, whose pid fhmon read as a
host pid, named any process at all; and the refusals told a scanner which pids were
same-uid filtered processes. Now the target must be the client itself or its child, named
by a pidfd (or, from fhmon's own pid namespace, by a pid fhmon pins), uid 0 is trusted only
in fhmon's own pid and user namespaces, and a refusal names no process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from protocol import intake_wire
from tests.adversarial.common import REGISTRATION, errname, run_as_nobody
from tests.adversarial.recording import Recorder
from tests.adversarial.test_registration import hostile, told
from tests.support import NOBODY, Runner, Service, World
from tests.support.listeners import filtered_child, hello, send_raw
from tests.support.pids import SCENARIOS, reuse_number
from tests.support.world import REPO

NOT_OWNED = "does not belong to this client"
OWNERSHIP_TITLE = "A client registers its listener naming another tenant's process"
OWNERSHIP_FIX = (
    "prove the target is the client's: its child (PPid is the SO_PEERCRED pid) or itself, "
    "named by a pidfd sent with the HELLO, rechecked after /proc is read; uid 0 trusted only "
    "in fhmon's pid and user namespaces; refusals that name no process "
    "(monitor/registration.py check_registration)")


@pytest.fixture(scope="module")
def tenant_fhmon(world: World) -> Iterator[Service]:
    """An instance whose socket uid 65534 may use (group 65534)."""
    config = world.base / "adv-owner.toml"
    config.write_text(f'socket_mode = "0660"\nsocket_group = {NOBODY}\n')
    with Service(world.base, [str(world.shares / "*")], name="adv-owner",
                 extra=["--config", str(config)]) as service:
        os.chmod(service.dir, 0o755)
        yield service


def no_number(result: dict[str, Any]) -> bool:
    return not re.search(r"\d", str(result.get("reason", "")))


@pytest.mark.finding(OWNERSHIP_TITLE, OWNERSHIP_FIX)
def test_a_client_cannot_name_another_process_of_its_uid(
        tenant_fhmon: Service, world: World, unprivileged: Runner, record: Recorder) -> None:
    """uid 65534 sends its own child's listener naming processes that are not its own: a
    filtered one of its uid (another tenant's virtiofsd, not yet registered), an
    unfiltered one of its uid, root's. Each by pid and by pidfd: one refusal, word for
    word, with no number in it; and the other tenant can still register its own."""
    sock, main = tenant_fhmon.socket, str(world.main)
    victim = filtered_child(uid=NOBODY)
    rooted = filtered_child(uid=0)
    sleeper = subprocess.Popen(["sleep", "120"], user=NOBODY, group=NOBODY, extra_groups=[])
    reasons: set[str] = set()
    try:
        for name, pid in (("a filtered process of its uid", victim.pid),
                          ("an unfiltered process of its uid", sleeper.pid),
                          ("a filtered process of root's", rooted.pid)):
            for how in ("", "pidfd:"):
                result = hostile(unprivileged, sock, main, f"{how}{pid}")
                reasons.add(str(result.get("reason")))
                record(REGISTRATION, f"uid 65534 registers its own listener naming {name}, "
                       f"{'by pidfd' if how else 'by pid'}",
                       f"REFUSE EPERM ('{NOT_OWNED}'), no number in the text", told(result),
                       ok=(result["kind"] == "refuse" and result["errno"] == 1
                           and NOT_OWNED in result["reason"] and no_number(result)))
        record(REGISTRATION, "the refusals for processes not the client's, whatever they are",
               "one text", f"{len(reasons)} text(s)", ok=len(reasons) == 1)
        own = intake_wire.decode_one(send_raw(sock, hello(main, victim.pid), [victim.listener]))
        record(REGISTRATION, "the other tenant then registers its own process (root's "
               "runtime, by pid)", "ACCEPT",
               type(own).__name__.upper() if not isinstance(own, intake_wire.Refuse)
               else f"REFUSE {errname(own.errno)}: {own.reason[:80]}")
        for how in ("", "pidfd:"):
            result = hostile(unprivileged, sock, main, f"{how}child")
            record(REGISTRATION, f"uid 65534 registers its own child "
                   f"{'by pidfd' if how else 'by pid, as a launcher before pidfds'} "
                   f"(control)", "ACCEPT", told(result))
    finally:
        sleeper.kill()
        sleeper.wait()
        victim.close()
        rooted.close()


def in_own_pid_namespace(*args: str) -> dict[str, Any]:
    """The hostile client as root in a new pid (and mount, for its /proc) namespace: a
    root pod without hostPID."""
    proc = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                           sys.executable, "-m", "tests.adversarial.hostile_client", *args],
                          capture_output=True, text=True, timeout=60, cwd=str(REPO))
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.finding(OWNERSHIP_TITLE, OWNERSHIP_FIX)
def test_a_root_client_in_its_own_pid_namespace_is_not_the_hosts_root(
        fhmon: Service, world: World, record: Recorder) -> None:
    """uid 0 in another pid namespace names a host process (its pid means something else
    to fhmon, or nothing): refused, as its own child named by a pid is (fhmon cannot read
    it); its own child named by a pidfd is accepted."""
    victim = filtered_child(uid=NOBODY)
    try:
        main = str(world.main)
        result = in_own_pid_namespace(fhmon.socket, main, str(victim.pid))
        record(REGISTRATION, "root in its own pid namespace (a pod without hostPID) sends its "
               "child's listener naming a host process of uid 65534 by its host pid",
               "REFUSE EINVAL ('another pid namespace'), no number in the text", told(result),
               ok=(result["kind"] == "refuse" and result["errno"] == 22
                   and "another pid namespace" in result["reason"] and no_number(result)))
        result = in_own_pid_namespace(fhmon.socket, main, "child")
        record(REGISTRATION, "root in its own pid namespace names its own child by its pid "
               "there", "REFUSE EINVAL ('send the target's pidfd')", told(result),
               ok=(result["kind"] == "refuse" and result["errno"] == 22
                   and "send the target's pidfd" in result["reason"] and no_number(result)))
        result = in_own_pid_namespace(fhmon.socket, main, "pidfd:child")
        record(REGISTRATION, "root in its own pid namespace names its own child by a pidfd "
               "(control)", "ACCEPT", told(result))
        own = intake_wire.decode_one(send_raw(fhmon.socket, hello(main, victim.pid),
                                              [victim.listener]))
        record(REGISTRATION, "the host process is then registered by the host's root",
               "ACCEPT", type(own).__name__.upper())
    finally:
        victim.close()


VICTIM_PARENT = ("import sys\n"
                 "from monitor import seccomp_filter\n"
                 f"pid, fd, channel = seccomp_filter.fork_under_filter(({NOBODY}, {NOBODY}))\n"
                 "channel.detach()\n"
                 "print(pid, flush=True)\n"
                 "sys.stdin.read()\n")


def start_at_pid(pid: int, argv: list[str]) -> subprocess.Popen[str] | str:
    """argv started as process `pid`, or why it could not be."""
    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, cwd=str(REPO))

    def discard(proc: subprocess.Popen[str]) -> None:
        proc.kill()
        proc.wait()

    return reuse_number(pid, start, lambda proc: proc.pid, discard)


def orphaned_client(socket_path: str, share: str, unprivileged: Runner) -> subprocess.Popen[str]:
    return subprocess.Popen([*unprivileged.python, "-m", "tests.adversarial.orphaned_client",
                             socket_path, share], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd="/", env=unprivileged.env,
                            **run_as_nobody())


@pytest.mark.finding(OWNERSHIP_TITLE, OWNERSHIP_FIX)
def test_a_client_whose_pid_went_to_another_process_proves_nothing(
        tenant_fhmon: Service, world: World, unprivileged: Runner, record: Recorder) -> None:
    """uid 65534 connects and exits, leaving the connection to its child; its pid goes to
    another tenant's launcher (root), whose filtered child of uid 65534 is then named: the
    PPid matches the connection's SO_PEERCRED pid, but that pid is not the client's any
    more (SO_PEERPIDFD says so).

    Any process on the machine may take the freed pid before the test hands it on; then
    the scenario starts again with a new client (a new pid)."""
    victim: subprocess.Popen[str] | None = None
    target = 0
    missed: list[str] = []
    client = orphaned_client(tenant_fhmon.socket, str(world.main), unprivileged)
    try:
        while True:
            assert client.stdout is not None and client.stdin is not None
            peer = json.loads(client.stdout.readline())["peer"]
            client.wait(timeout=30)  # the connection's owner is gone; its child holds it
            started = start_at_pid(peer, [sys.executable, "-c", VICTIM_PARENT])
            if isinstance(started, subprocess.Popen):
                victim = started
                break
            missed.append(started)
            if len(missed) == SCENARIOS:
                pytest.fail("the client's pid never came to the victim: " + "; ".join(missed))
            client.stdin.close()  # the orphaned child holding the connection reads it: ends
            client = orphaned_client(tenant_fhmon.socket, str(world.main), unprivileged)
        assert victim.stdout is not None and client.stdin is not None
        assert client.stdout is not None
        target = int(victim.stdout.readline())
        client.stdin.write(f"{target}\n")
        client.stdin.flush()
        result = json.loads(client.stdout.readline())
        record(REGISTRATION, "uid 65534 connects, leaves the connection to its child and "
               "exits; its pid goes to another tenant's launcher, whose filtered child the "
               "connection then names", "REFUSE ESRCH ('the client exited')", told(result),
               ok=(result["kind"] == "refuse" and result["errno"] == 3
                   and "the client exited" in result["reason"]))
    finally:
        client.kill()
        if client.stdin is not None:
            client.stdin.close()  # the orphaned child reads it: now it ends
        if target:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGKILL)
        if victim is not None:
            victim.kill()
            victim.wait()
