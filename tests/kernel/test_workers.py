"""`workers = N`: worker processes answer the calls; fhmon serve registers and reports.

The whole kernel suite also passes with FHMON_TEST_CONFIG pointing at `workers = 2`; these
tests pin down what is particular to workers: that they answer, report their counts, let
go of a target's fds when it ends, keep only fhmon's capabilities, live exactly as long
as fhmon serve, and never sleep in RECV when two of them saw the same call.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

import pytest

from protocol import kernel
from tests.support import Agent, Service, World, thread_syscalls, wait_until
from tests.support.handles import N2HResult

KEPT_CAPS = sum(1 << c for c in (2, 5, 6, 7, 19))  # as test_observability checks for serve


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def start_workers(world: World, tmp_path: Path, plane: str) -> Service:
    config = tmp_path / "workers.toml"
    config.write_text(f'workers = 2\ndata_plane = "{plane}"\n')
    config.chmod(0o644)
    return Service(world.base, [str(world.shares / "*")], name=f"workers-{tmp_path.name}",
                   extra=["--config", str(config)])


@pytest.fixture(params=["native", "python"])
def workers_service(world: World, tmp_path: Path, request: pytest.FixtureRequest) -> Service:
    """Workers answer on the configured data plane, either of the two."""
    return start_workers(world, tmp_path, request.param)


@pytest.fixture()
def python_workers_service(world: World, tmp_path: Path) -> Service:
    return start_workers(world, tmp_path, "python")


@pytest.mark.parametrize("plane", ["native", "python"])
def test_workers_answer_and_report(world: World, tmp_path: Path, plane: str) -> None:
    service = start_workers(world, tmp_path, plane)
    agent = Agent(world, "fhmon", world.main, service.socket)
    try:
        status = service.status()
        workers = status["workers"]
        assert len(workers) == 2 and service.pid not in workers
        for pid in workers:
            fields = dict(line.split(":", 1) for line in
                          Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
            assert int(fields["PPid"]) == service.pid
            assert int(fields["CapEff"], 16) == KEPT_CAPS
        h = N2HResult.of(agent.call("n2h", path="file"))
        assert h.errno == 0
        for _ in range(20):
            assert agent.call("obh", handle_type=h.handle_type,
                              f_handle=h.f_handle.hex())["errno"] == 0
        forged = bytes(len(h.f_handle))
        assert agent.call("obh", handle_type=h.handle_type,
                          f_handle=forged.hex())["errno"] == errno.ESTALE

        def reported() -> bool:
            counters = service.status()["counters"]
            return (counters.get("open_by_handle_at", {}).get("ok") == 20
                    and counters.get("open_by_handle_at", {}).get("ESTALE") == 1
                    and counters.get("name_to_handle_at", {}).get("ok") == 1)

        # serve answers nothing itself in this mode: these counts can only come from reports
        assert wait_until(reported, timeout=5), service.status()
        target = service.status()["targets"][0]
        if plane == "python":
            assert target["calls"] == 22
        else:  # the workers' own native threads wait in RECV, fhmon serve's none
            assert wait_until(lambda: all(threads_in_recv(pid) for pid in workers))
            assert threads_in_recv(service.pid) == []
        # the native plane counts by syscall and result, not by target (nor in fhmon serve)
    finally:
        agent.close()
        assert service.stop() == 0, service.log_text()[-3000:]


def test_workers_let_go_of_a_finished_target(world: World, workers_service: Service) -> None:
    service = workers_service
    workers = service.status()["workers"]
    assert wait_until(lambda: {e.get("pid") for e in service.events()
                               if e.get("event") == "worker_serving"} >= set(workers))
    before = {pid: fd_count(pid) for pid in workers}
    agent = Agent(world, "fhmon", world.main, service.socket)
    try:
        assert N2HResult.of(agent.call("n2h", path="dir/inner")).errno == 0
        # each worker holds the listener and the share's two fds (and a pidfd per thread)
        assert wait_until(lambda: all(fd_count(p) >= before[p] + 3 for p in workers))
    finally:
        agent.close()
    assert wait_until(lambda: all(fd_count(p) == before[p] for p in workers)), (
        before, {p: fd_count(p) for p in workers})
    assert service.stop() == 0


def test_a_dead_worker_stops_the_service(workers_service: Service) -> None:
    service = workers_service
    victim = service.status()["workers"][0]
    os.kill(victim, signal.SIGKILL)
    assert service.proc is not None
    code = service.proc.wait(timeout=15)
    assert code != 0
    died = [e for e in service.events() if e.get("event") == "worker_died"]
    assert died and died[0]["pid"] == victim
    service.stop()


def test_workers_end_with_serve_even_when_it_is_killed(workers_service: Service) -> None:
    service = workers_service
    workers = service.status()["workers"]
    service.stop(signal.SIGKILL)
    # the kernel closes the dead serve's end of each control socket: EOF ends the worker
    deadline = time.monotonic() + 10
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in workers)


def threads_in_recv(pid: int) -> list[int]:
    """The threads of pid sleeping in SECCOMP_IOCTL_NOTIF_RECV (ioctl, syscall 16)."""
    return [tid for tid, fields in thread_syscalls(pid).items()
            if fields[0] == "16" and int(fields[2], 16) == kernel.SECCOMP_IOCTL_NOTIF_RECV]


def test_no_worker_sleeps_in_recv_once_the_calls_stop(world: World,
                                                      python_workers_service: Service) -> None:
    """Python plane: two workers wait on the same listener; both may see one call. The one
    that does not get it must not sleep in RECV (until the target's next call, away from
    every other listener) but go back to waiting on all of them. (The native plane's
    threads sleep in RECV by design: each on its own target's listener only.)"""
    service = python_workers_service
    agent = Agent(world, "fhmon", world.main, service.socket)
    try:
        workers = service.status()["workers"]
        for burst in range(200):  # the race is at a burst's last call
            out = agent.call("hammer", path="file", threads=4, calls=3, answer_within=60)
            assert set(out["results"]) == {"0"}, out
            time.sleep(0.02)  # the workers answered the last calls
            stuck = {pid: threads_in_recv(pid) for pid in workers}
            assert not any(stuck.values()), (burst, stuck)
    finally:
        agent.close()
        assert service.stop() == 0


def test_serve_serves_only_once_every_worker_is_ready(world: World,
                                                     workers_service: Service) -> None:
    """A worker loads the keys itself: had fhmon serve taken registrations before, a key
    directory broken in that window (a rotation) killed a worker of a serving service."""
    service = workers_service
    try:
        events = service.events()
        serving = next(i for i, e in enumerate(events) if e.get("event") == "serving")
        ready = [i for i, e in enumerate(events) if e.get("event") == "worker_serving"]
        assert len(ready) == 2 and max(ready) < serving, events
    finally:
        assert service.stop() == 0
