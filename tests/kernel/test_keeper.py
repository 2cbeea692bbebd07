"""Listeners registered through the OCI convention (runc keeps no copy) across restarts."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import FHMON, Agent, Service, World, wait_until
from tests.support.handles import N2HResult


@pytest.fixture
def keeper(world: World) -> Iterator[str]:
    path = str(world.base / "keeper.sock")
    proc = subprocess.Popen([FHMON, "keeper", "--socket", path], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    yield path
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)


def test_without_keeper_a_runc_listener_dies_with_fhmon(world: World) -> None:
    """The kernel's rule (documented limit): the last listener copy closed -> ENOSYS."""
    service = Service(world.base, [str(world.shares / "*")], name="no-keeper")
    agent = Agent(world, "runc", world.main, service.socket)
    try:
        assert agent.call("n2h", path="file")["errno"] == 0
        service.stop(signal.SIGKILL)
        assert agent.call("n2h", path="file")["errno"] == errno.ENOSYS
    finally:
        agent.close()


def test_keeper_carries_runc_listeners_across_a_sigkill(world: World, keeper: str) -> None:
    service = Service(world.base, [str(world.shares / "*")], name="with-keeper",
                      extra=["--keeper", keeper])
    agent = Agent(world, "runc", world.main, service.socket)
    try:
        h = N2HResult.of(agent.call("n2h", path="dir/inner"))
        assert h.errno == 0
        assert any(e.get("event") == "deposited" for e in service.events()) or wait_until(
            lambda: any(e.get("event") == "deposited" for e in service.events()))
        service.stop(signal.SIGKILL)
        answers: dict[str, Any] = {}
        waiting = threading.Thread(target=lambda: answers.update(
            agent.call("obh", handle_type=h.handle_type, f_handle=h.f_handle.hex())))
        waiting.start()
        time.sleep(0.5)
        assert waiting.is_alive(), "the call should wait while no fhmon runs"
        service.start()
        waiting.join(timeout=30)
        assert answers.get("errno") == 0, answers
        assert any(e.get("event") == "target_restored" for e in service.events())
        assert agent.call("n2h", path="file")["errno"] == 0
    finally:
        agent.close()
        service.stop()


