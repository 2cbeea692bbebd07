"""`fhmon launch` in a pid namespace of its own, as in a pod without hostPID.

The launcher's HELLO once carried its child's pid in the launcher's namespace, which fhmon
read as a host pid (a kernel thread here: refused; at worst a real host process of the same
uid). It now sends the child's pidfd too, and fhmon finds the child's pid in its own
namespace from it. The launcher runs as root or as uid 65534 (the virtiofs container's
case), in a new pid namespace with its own /proc (`unshare --pid --fork --mount-proc`); the
target is uid 65534 under the real filter. Its calls are served, and it registers again
after an fhmon restart.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import FHMON, NOBODY, Agent, Runner, Service, World, wait_until
from tests.support.handles import N2HResult
from tests.support.world import SYSTEM_PYTHON

UNSHARE = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]


class LauncherInPidNamespace(Agent):
    """The agent under `fhmon launch`, the launcher itself pid 1 of a new pid namespace."""

    def __init__(self, argv: list[str], env: dict[str, str] | None) -> None:
        self.mode = "fhmon"
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"agent did not start: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.hello = json.loads(line)


@pytest.fixture(scope="module")
def pod_fhmon(world: World) -> Iterator[Service]:
    """An instance uid 65534 may reach (group 65534), as the device plugin's socket."""
    config = world.base / "podns.toml"
    config.write_text(f'socket_mode = "0660"\nsocket_group = {NOBODY}\n')
    service = Service(world.base, [str(world.shares / "*")], name="podns",
                      extra=["--config", str(config)])
    os.chmod(service.dir, 0o755)
    try:
        yield service
    finally:
        service.stop()


def launch(service: Service, world: World, runner: Runner, launcher: str) -> Agent:
    target = ["--", SYSTEM_PYTHON, str(world.agent), str(world.main)]
    if launcher == "root":
        argv = [*UNSHARE, FHMON, "launch", "--socket", service.socket, "--share",
                str(world.main), "--user", str(NOBODY), *target]
        return LauncherInPidNamespace(argv, None)
    argv = [*UNSHARE, "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            *runner.fhmon("launch", "--socket", service.socket, "--share", str(world.main)),
            *target]
    return LauncherInPidNamespace(argv, runner.env)


def host_pid_of(service: Service, ns_pid: int) -> int:
    """The registered target whose innermost pid is ns_pid and that lives in another pid
    namespace than ours (the agent reports its pid as its namespace shows it)."""
    ours = os.stat("/proc/self/ns/pid").st_ino
    for target in service.status()["targets"]:
        pid = int(target["pid"])
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            theirs = os.stat(f"/proc/{pid}/ns/pid").st_ino
        except OSError:
            continue
        nspid = [int(p) for p in status.split("NSpid:")[1].split("\n")[0].split()]
        if nspid[-1] == ns_pid and len(nspid) == 2 and theirs != ours:
            return pid
    raise AssertionError(f"no registered target is pid {ns_pid} of another pid namespace: "
                         f"{service.status()['targets']}")


def works(agent: Agent) -> None:
    r = N2HResult.of(agent.call("n2h", path="dir/inner", answer_within=20))
    assert r.errno == 0, r
    opened = agent.call("obh", handle_type=r.handle_type, f_handle=r.f_handle.hex(),
                        answer_within=20)
    assert opened["errno"] == 0 and bytes.fromhex(opened["head"]) == b"inner file\n"


@pytest.mark.parametrize("launcher", ["root", "uid 65534"])
def test_launch_in_its_own_pid_namespace_registers_its_child(
        pod_fhmon: Service, world: World, unprivileged: Runner, launcher: str) -> None:
    agent = launch(pod_fhmon, world, unprivileged, launcher)
    try:
        assert agent.hello["uid"] == NOBODY
        host_pid = host_pid_of(pod_fhmon, agent.pid)
        assert host_pid != agent.pid
        works(agent)
        registered = [e for e in pod_fhmon.events() if e.get("event") == "target_registered"
                      and e.get("pid") == host_pid]
        assert registered and registered[-1]["peer_uid"] == (0 if launcher == "root"
                                                             else NOBODY)
    finally:
        assert agent.close() == 0


def test_launch_in_its_own_pid_namespace_registers_again_after_a_restart(
        pod_fhmon: Service, world: World, unprivileged: Runner) -> None:
    agent = launch(pod_fhmon, world, unprivileged, "uid 65534")
    try:
        host_pid = host_pid_of(pod_fhmon, agent.pid)
        works(agent)

        def registrations() -> list[dict[str, Any]]:
            return [e for e in pod_fhmon.events() if e.get("event") == "target_registered"
                    and e.get("pid") == host_pid]
        before = len(registrations())
        pod_fhmon.stop()
        pod_fhmon.start()
        assert wait_until(lambda: len(registrations()) > before, timeout=20), \
            pod_fhmon.log_text()[-2000:]
        works(agent)
        assert host_pid_of(pod_fhmon, agent.pid) == host_pid
    finally:
        assert agent.close() == 0
