"""Isolation and resources: many targets, threads, killed and stopped targets, 10,000 calls."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from typing import Any

from tests.support import Agent, Service, wait_until
from tests.support.handles import N2HResult


def test_concurrent_multithreaded_targets(spawn: Any) -> None:
    agents: list[Agent] = [spawn() for _ in range(4)]
    results: dict[int, Any] = {}

    def run(i: int, agent: Agent) -> None:
        results[i] = agent.call("hammer", path="dir/inner", calls=250, threads=4)

    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 4
    for out in results.values():
        assert out["results"] == {"0": 1000}, out


def test_killed_target_frees_everything_and_others_keep_working(spawn: Any,
                                                                fhmon: Service) -> None:
    bystander: Agent = spawn()
    assert bystander.call("n2h", path="file")["errno"] == 0
    # Earlier tests' exited targets are dropped (and their fds closed) before the baseline.
    # A live process another test left registered is not this test's business: it keeps its
    # fds, so the baseline still holds (waiting for it to go would only time out here).
    assert wait_until(lambda: all(_alive(t["pid"]) for t in fhmon.status()["targets"]),
                      timeout=30), fhmon.status()["targets"]
    baseline = fhmon.fd_count()
    victim: Agent = spawn()
    assert victim.call("n2h", path="file")["errno"] == 0
    assert victim.proc.stdin is not None
    # a load that lasts until the kill below, whatever the machine's speed
    victim.proc.stdin.write('{"op": "hammer", "path": "dir/inner", "until": "/nonexistent", '
                            '"threads": 4}\n')
    victim.proc.stdin.flush()
    time.sleep(0.5)  # calls in flight, some of them inside fhmon right now
    target_pid = victim.pid
    os.kill(target_pid, signal.SIGKILL)
    victim.proc.wait(timeout=10)
    # generous: on a loaded 2-CPU machine the Python plane's threads notice the hang-up late
    assert wait_until(lambda: target_pid not in [t["pid"] for t in fhmon.status()["targets"]],
                      timeout=30)
    assert wait_until(lambda: fhmon.fd_count() == baseline, timeout=30), (
        fhmon.fd_count(), baseline)
    for _ in range(100):
        assert bystander.call("n2h", path="file")["errno"] == 0


def _alive(pid: int) -> bool:
    """pid is a process that has not exited (a zombie has: its filter has no task)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def test_stopped_target_does_not_block_others(spawn: Any) -> None:
    stopped: Agent = spawn()
    other: Agent = spawn()
    assert stopped.proc.stdin is not None
    stopped.proc.stdin.write('{"op": "hammer", "path": "file", "until": "/nonexistent", '
                             '"threads": 2}\n')  # calls in flight until the SIGKILL below
    stopped.proc.stdin.flush()
    time.sleep(0.3)
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        for _ in range(200):
            assert other.call("n2h", path="dir")["errno"] == 0
        assert time.monotonic() - start < 20
    finally:
        os.kill(stopped.pid, signal.SIGKILL)


def test_ten_thousand_calls_keep_fds_and_memory_flat(spawn: Any, fhmon: Service) -> None:
    agent: Agent = spawn()
    h = N2HResult.of(agent.call("n2h", path="file"))
    obh = {"handle_type": h.handle_type, "f_handle": h.f_handle.hex()}
    tampered = h.f_handle[:-1] + bytes([h.f_handle[-1] ^ 1])  # always another MAC
    bad = {"handle_type": h.handle_type, "f_handle": tampered.hex()}
    # warm up (imports, caches, the remembered mount_fd), then measure
    agent.call("hammer", path="file", calls=500, threads=2)
    assert agent.call("obh", **obh)["errno"] == 0
    time.sleep(1.5)  # fhmon forgets exited threads' cached pidfds once a second
    fds_before, rss_before = fhmon.fd_count(), fhmon.rss_kib()
    for spec in ({"path": "dir/inner"}, {"op2": "obh", "obh": obh, "path": ""},
                 {"op2": "obh", "obh": bad, "path": ""}, {"path": "missing"}):
        out = agent.call("hammer", calls=625, threads=4, **spec)
        assert sum(out["results"].values()) == 2500
    assert agent.call("fdcount")["fds"] < 20  # every injected fd was closed by the agent
    assert wait_until(lambda: fhmon.fd_count() == fds_before), (fhmon.fd_count(), fds_before)
    growth = fhmon.rss_kib() - rss_before
    assert growth < 4096, f"fhmon RSS grew by {growth} KiB over 10,000 calls"


def test_thread_ids_are_mapped_to_their_process(spawn: Any) -> None:
    agent: Agent = spawn()
    out = agent.call("hammer", path="dir/deep/leaf", calls=50, threads=8)
    assert out["results"] == {"0": 400}
    assert agent.call("n2h", path="missing")["errno"] == errno.ENOENT
