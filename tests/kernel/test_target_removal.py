"""Targets that end together: their removal never holds fhmon's intake.

When a target's last task exits, its listener hangs up and fhmon removes it, joining the
target's data-plane threads. A thread whose listener refuses RECV for good waits to be
stopped; that wait used to be a 50 ms sleep that outlasted the wake signal (std's sleep
resumes after EINTR), so each removal held fhmon's trio thread, the one the intake runs
on, for up to 50 ms per target: about 1 launch in 8 waited 60-400 ms between HELLO and
ACCEPT whenever another target had just ended (bench.launch_latency measures the launch).

Here TARGETS targets end at once (their process groups killed together) while a client
pings fhmon's intake without pause (PING, PONG, on one connection): no ping may wait
LIVENESS or more, and then a new target registers and is served. Measured here before the
fix: one ping waited 4.9 s (the 100 removals ran in one batch of the trio loop, each
waiting out its threads' sleep); after it, the slowest of ~450 pings took 37 ms. A
liveness bound, not a speed target: the launch's p50/p99 is bench.launch_latency's.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from monitor.launcher import NATIVE_LAUNCHER
from protocol import intake_wire
from tests.support import NOBODY, Agent, Service, World
from tests.support.world import wait_until

TARGETS = 100
LIVENESS = 1.0  # seconds for one ping to be answered while the targets go


@pytest.fixture
def service(world: World) -> Iterator[Service]:
    with Service(world.base, [str(world.shares / "*")], name="removal") as s:
        yield s


def start_targets(service: Service, world: World, count: int) -> list[subprocess.Popen[bytes]]:
    """`count` targets, each the native launcher running `sleep` as uid 65534, each in a
    process group of its own (the launcher and its CMD)."""
    argv = [str(NATIVE_LAUNCHER), "launch", "--socket", service.socket, "--share",
            str(world.main), "--user", f"{NOBODY}:{NOBODY}", "--", "sleep", "600"]
    return [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True) for _ in range(count)]


def ping_round_trips(service: Service, stop: threading.Event, out: list[float]) -> None:
    """PING after PING on one intake connection until `stop`; each round trip's seconds."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(60)  # measured, not cut short: the assertion says how long
        conn.connect(service.socket)
        decoder = intake_wire.FrameDecoder()
        while not stop.is_set():
            start = time.monotonic()
            conn.sendall(intake_wire.encode(intake_wire.Ping()))
            while (message := decoder.next_message()) is None:
                data = conn.recv(65536)
                assert data, "fhmon closed the intake connection"
                decoder.feed(data)
            assert isinstance(message, intake_wire.Pong), message
            out.append(time.monotonic() - start)


def test_targets_ending_together_leave_the_intake_answering(service: Service,
                                                            world: World) -> None:
    targets = start_targets(service, world, TARGETS)
    try:
        assert wait_until(lambda: len(service.status()["targets"]) == TARGETS, timeout=60), \
            f"{len(service.status()['targets'])} of {TARGETS} registered"
        stop = threading.Event()
        quiet: list[float] = []
        pinger = threading.Thread(target=ping_round_trips, args=(service, stop, quiet))
        pinger.start()
        time.sleep(0.3)
        stop.set()
        pinger.join()
        stop.clear()
        during: list[float] = []
        pinger = threading.Thread(target=ping_round_trips, args=(service, stop, during))
        pinger.start()
        for proc in targets:
            os.killpg(proc.pid, signal.SIGKILL)
        gone = wait_until(lambda: not service.status()["targets"], timeout=60)
        stop.set()
        pinger.join()
        assert gone, f"{len(service.status()['targets'])} targets still registered"
        assert len(during) >= 10
        slowest = max(during)
        assert slowest < LIVENESS, (
            f"a ping took {slowest:.3f} s while {TARGETS} targets were removed (median "
            f"{statistics.median(during) * 1000:.2f} ms of {len(during)}; "
            f"{statistics.median(quiet) * 1000:.2f} ms before)")
    finally:
        for proc in targets:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    agent = Agent(world, "fhmon", world.main, service.socket)
    try:
        assert agent.call("n2h", path="file")["errno"] == 0
    finally:
        agent.close()
