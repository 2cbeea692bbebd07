"""Availability: one target's call must never stall another target, the intake or a probe.

Real attacks by a target of uid 65534 under `fhmon launch`, each made on the native plane
(the default: per target its own native threads, none holding the GIL) and on the python
reference plane (one dispatch thread answers every target):

- a write lease (F_SETLEASE F_WRLCK) on its own file, then open_by_handle_at of that file:
  fhmon's open must wait for the lease break (/proc/sys/fs/lease-break-time, raised to
  LEASE_BREAK s here and restored afterwards);
- a TCP socket whose close lingers (SO_LINGER, unsent data) passed as mount_fd, then its own
  copy closed: if fhmon kept a duplicate (the python plane's mount_fd memo did), fhmon's
  close of it is the last one and lingers;
- a lookup that crawls for seconds: in its own user and mount namespace (`unshare -Urm`)
  the target stacks MOUNTS tmpfs on one directory of its share and looks up a chain of 40
  symlinks, each 4 KiB of "m/.." climbing that stack (~20 s on a 2-vCPU VM); the
  neighbour must be answered while that lookup still crawls (an order, not a time).

While the attacker's call waits or crawls, a neighbour target's lookup and open, a new
registration (`fhmon launch`, then a lookup) and `fhmon probe` must each be answered within
LIVENESS seconds (a liveness bound for a single call, not a speed target: the neighbour's
p99 beside these attackers is measured by `python -m bench.fairness`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.common import AT_SYMLINK_FOLLOW, EXHAUSTION, errname, signed
from tests.adversarial.recording import Recorder
from tests.support import FHMON, NOBODY, Agent, Service, World, readable
from tests.support.agent import NamespaceAgent
from tests.support.world import lease_break_time, nobodys_directory

LIVENESS = 10.0  # seconds for one call to be answered
LEASE_BREAK = 25  # /proc/sys/fs/lease-break-time during the lease attack
LINGER = 25  # SO_LINGER seconds of the attacker's socket
MOUNTS = 10_000  # tmpfs stacked on one directory
SYMLINKS = 40  # the kernel follows at most 40 per lookup

@pytest.fixture(scope="module")
def services(world: World) -> Iterator[dict[str, Service]]:
    """One fhmon per data plane, started on first use."""
    started: dict[str, Service] = {}

    class Lazy(dict[str, Service]):
        def __missing__(self, plane: str) -> Service:
            config = world.base / f"avail-{plane}.toml"
            config.write_text(f'data_plane = "{plane}"\n')
            service = Service(world.base, [str(world.shares / "*")], name=f"avail-{plane}",
                              extra=["--config", str(config)])
            started[plane] = self[plane] = service
            return service

    try:
        yield Lazy()
    finally:
        for service in started.values():
            if service.proc is not None and service.proc.poll() is None:
                service.stop(signal.SIGKILL)


@pytest.fixture
def arena(world: World) -> Iterator[Path]:
    """A directory of the share the attacker owns."""
    with nobodys_directory(world.main / "adv-avail") as path:
        yield path


def within(seconds: float, call: Callable[[], Any]) -> tuple[Any, float] | None:
    """call()'s value and how long it took, or None if it did not return in `seconds`
    (it is left running on a daemon thread; its agent is killed at cleanup)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:
            box["error"] = exc

    start = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        return None
    if "error" in box:
        raise box["error"]
    return box["value"], time.monotonic() - start


class Everyone:
    """The others an attacker must not stall: a neighbour target (registered and warmed
    before the attack), a new registration, and `fhmon probe`."""

    def __init__(self, world: World, service: Service) -> None:
        self.world = world
        self.service = service
        self.agents: list[Agent] = []
        self.neighbour = self.launch()
        self.htype, self.handle = signed(self.neighbour, "dir/inner")

    def launch(self) -> Agent:
        agent = Agent(self.world, "fhmon", self.world.main, self.service.socket)
        self.agents.append(agent)
        return agent

    def check(self, attack_going_on: Callable[[], bool] | None = None) -> tuple[bool, str]:
        """Each answered within LIVENESS? And a line saying what happened. With
        attack_going_on: the neighbour must also be answered while the attack still goes
        on (asked right after its answer), an order that no machine's speed changes."""
        def neighbour() -> bool:
            looked = self.neighbour.call("n2h", path="dir/inner")["errno"]
            opened = self.neighbour.call("obh", handle_type=self.htype,
                                         f_handle=self.handle.hex())
            return looked == 0 and opened["errno"] == 0 and bytes.fromhex(
                opened.get("head", "")) == b"inner file\n"

        newcomer: list[Agent] = []

        def register() -> bool:  # the target starts once fhmon accepted its listener
            newcomer.append(self.launch())
            return True

        def newcomers_lookup() -> bool:
            return bool(newcomer) and newcomer[0].call("n2h", path="file")["errno"] == 0

        def probe() -> bool:
            return subprocess.run([FHMON, "probe", "--socket", self.service.socket],
                                  capture_output=True, timeout=60).returncode == 0

        ok = True
        parts = []
        for name, call in (("neighbour's lookup and open", neighbour),
                           ("new registration", register),
                           ("the new target's lookup", newcomers_lookup),
                           ("fhmon probe", probe)):
            got = within(LIVENESS, call)
            if got is None:
                ok = False
                parts.append(f"{name} NOT answered in {LIVENESS:.0f} s")
            else:
                ok = ok and bool(got[0])
                parts.append(f"{name} {'answered' if got[0] else 'WRONG'} in {got[1]:.2f} s")
            if attack_going_on is not None and call is neighbour and got is not None:
                during = attack_going_on()
                ok = ok and during
                parts[-1] += (" while the attacker's call went on" if during
                              else ", NOT while the attacker's call went on")
        return ok, "; ".join(parts)

    def close(self) -> None:
        for agent in self.agents:
            with contextlib.suppress(ProcessLookupError):
                os.kill(agent.pid, signal.SIGKILL)
            agent.proc.kill()
            agent.proc.wait(10)


@pytest.fixture
def everyone_of(world: World, services: dict[str, Service]) -> Iterator[Callable[[str], Everyone]]:
    made: list[Everyone] = []

    def make(plane: str) -> Everyone:
        made.append(Everyone(world, services[plane]))
        return made[-1]

    yield make
    for e in made:
        e.close()


def send(agent: Agent, op: str, **cmd: Any) -> None:
    """Start a command without waiting for its answer."""
    assert agent.proc.stdin is not None
    agent.proc.stdin.write(json.dumps({"op": op, **cmd}) + "\n")
    agent.proc.stdin.flush()


def pending(agent: Agent) -> bool:
    """Its last command not answered yet."""
    assert agent.proc.stdout is not None
    return not readable(agent.proc.stdout, 0)


def answer(agent: Agent, timeout: float) -> dict[str, Any] | None:
    assert agent.proc.stdout is not None
    if not readable(agent.proc.stdout, timeout):
        return None
    line = agent.proc.stdout.readline()
    return json.loads(line) if line else None


def kill(agent: Agent) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(agent.pid, signal.SIGKILL)
    agent.proc.kill()
    agent.proc.wait(10)


@pytest.fixture
def short_lease_break() -> Iterator[None]:
    with lease_break_time(LEASE_BREAK):
        yield


@pytest.mark.usefixtures("short_lease_break")
@pytest.mark.parametrize("plane", ["native", "python"])
def test_a_target_holding_a_lease_on_its_own_file(
        plane: str, world: World, services: dict[str, Service], arena: Path,
        everyone_of: Callable[[str], Everyone], record: Recorder) -> None:
    others = everyone_of(plane)
    leased = arena / "leased"
    leased.write_text("the attacker's own file\n")
    os.chown(leased, NOBODY, NOBODY)
    attacker = others.launch()
    htype, handle = signed(attacker, str(leased.relative_to(world.main)))
    assert attacker.call("lease", path=str(leased), name="lease")["errno"] == 0
    send(attacker, "obh", handle_type=htype, f_handle=handle.hex(), flags=os.O_RDONLY)
    time.sleep(0.5)
    waiting = pending(attacker)
    ok, seen = others.check()
    still = pending(attacker)
    started = time.monotonic()
    got = answer(attacker, LEASE_BREAK + 2 * LIVENESS)
    took = time.monotonic() - started
    kill(attacker)
    if plane == "native":  # it waits, as the kernel would make the target's own open wait
        fate = (f"the attacker's open {'waiting' if waiting and still else 'NOT waiting'} "
                "throughout, then " + ("never answered" if got is None else
                f"answered {errname(int(got['errno']))} {took:.0f} s after the checks"))
        expected = "; the attacker's open waits for the lease break, then succeeds"
        attacker_ok = waiting and still and got is not None and got["errno"] == 0
    else:  # one thread answers everyone: it cannot wait, it answers EWOULDBLOCK at once
        fate = ("the attacker's open " + ("still waiting" if got is None or waiting else
                f"answered {errname(int(got['errno']))} at once"))
        expected = "; the attacker's open answered EAGAIN at once (the lease break started)"
        attacker_ok = not waiting and got is not None and got["errno"] == errno.EAGAIN
    record(EXHAUSTION, f"[{plane} plane] a target holds a write lease on its own file and "
           f"opens it by handle (lease-break-time {LEASE_BREAK} s): meanwhile a neighbour, a "
           f"new registration and fhmon probe",
           f"each answered within {LIVENESS:.0f} s{expected}", f"{seen}; {fate}",
           ok=ok and attacker_ok)


LINGER_TITLE = "python plane: a lingering socket passed as mount_fd stalls every target"


@pytest.mark.parametrize("plane", ["native", "python"])
def test_a_target_passing_a_lingering_socket_as_mount_fd(
        plane: str, world: World, services: dict[str, Service], arena: Path,
        everyone_of: Callable[[str], Everyone], record: Recorder) -> None:
    others = everyone_of(plane)
    attacker = others.launch()
    htype, handle = signed(attacker, "file")
    made = attacker.call("lingering_socket", name="sock", seconds=LINGER)
    assert made["errno"] == 0 and made["queued"] > 0, made
    first = attacker.call("obh", handle_type=htype, f_handle=handle.hex(), mount_fd="sock")
    attacker.call("close_later", name="sock")  # its own close lingers on its own thread
    time.sleep(0.2)
    # a call with another mount_fd: a memo of the socket would be closed now, by fhmon
    send(attacker, "obh", handle_type=htype, f_handle=handle.hex())
    time.sleep(0.5)
    ok, seen = others.check()
    got = answer(attacker, LINGER + 2 * LIVENESS)
    kill(attacker)
    record(EXHAUSTION, f"[{plane} plane] a target passes a TCP socket with SO_LINGER "
           f"{LINGER} s and unsent data as mount_fd, closes its copy, calls again: "
           "meanwhile a neighbour, a new registration and fhmon probe",
           f"each answered within {LIVENESS:.0f} s; the socket call ESTALE",
           f"{seen}; the socket call {errname(int(first['errno']))}, the next "
           f"{'never answered' if got is None else errname(int(got['errno']))}",
           ok=ok and first["errno"] == errno.ESTALE and got is not None)


@pytest.mark.parametrize("plane", ["native", "python"])
def test_a_lookup_crawling_through_stacked_mounts(
        plane: str, world: World, services: dict[str, Service], arena: Path,
        everyone_of: Callable[[str], Everyone], record: Recorder) -> None:
    others = everyone_of(plane)
    (arena / "m").mkdir(mode=0o755)
    attacker = NamespaceAgent(world, services[plane].socket, world.main)
    try:
        climb = "m/../" * 815
        links = [[f"{climb}s{i + 1}", str(arena / f"s{i}")] for i in range(SYMLINKS - 1)]
        links.append([f"{climb}m", str(arena / f"s{SYMLINKS - 1}")])
        assert attacker.call("symlinks", links=links)["errno"] == 0
        stacked = attacker.call("stack_mounts", target=str(arena / "m"), count=MOUNTS)
        assert stacked["errno"] == 0, stacked
        send(attacker, "n2h", path="adv-avail/s0", flags=AT_SYMLINK_FOLLOW)
        time.sleep(0.5)
        crawling = pending(attacker)
        ok, seen = others.check(attack_going_on=lambda: pending(attacker))
        started = time.monotonic()
        got = answer(attacker, 300)  # the walk cannot be cut short: fhmon is in the kernel
        took = time.monotonic() - started
    finally:
        kill(attacker)
    record(EXHAUSTION, f"[{plane} plane] a target in its own user+mount namespace looks up "
           f"{SYMLINKS} symlinks of 4 KiB each climbing {MOUNTS:,} stacked tmpfs: meanwhile "
           "a neighbour, a new registration and fhmon probe",
           f"each answered within {LIVENESS:.0f} s, the neighbour while the lookup crawls",
           f"{seen}; the attacker's lookup "
           + (f"crawled on, answered {errname(int(got['errno']))} {took:.0f} s after the "
              "checks" if crawling and got is not None else f"NOT crawling: {got}"),
           ok=ok and crawling)
