"""A busy target across fhmon restarts: a virtiofsd-like mix of lookups and opens on several
target threads, from before the first restart until the test says the restarts are over."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.support.agent import Agent
from tests.support.handles import N2HResult
from tests.support.service import Service


def registrations(service: Service) -> int:
    return sum(1 for e in service.events() if e.get("event") == "target_registered")


def start_and_see_it_register(service: Service) -> None:
    """Start fhmon again; the launcher must register with it within 30 s."""
    expected = registrations(service) + 1
    service.start()
    deadline = time.monotonic() + 30
    while registrations(service) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert registrations(service) >= expected, "the launcher did not register again"


class Load:
    """`hammer` with op2="mix" on dir/inner until `done` exists (readable by the target)."""

    def __init__(self, agent: Agent, done: Path, threads: int) -> None:
        self.agent = agent
        self.done = done
        h = N2HResult.of(agent.call("n2h", path="dir/inner"))
        assert h.errno == 0
        self.fds_before = agent.call("fdcount")["fds"]
        self.obh = {"handle_type": h.handle_type, "f_handle": h.f_handle.hex()}
        self.outcome: dict[str, Any] = {}
        self.threads = threads
        self.worker = threading.Thread(target=self._hammer)
        self.worker.start()

    def _hammer(self) -> None:
        self.outcome["result"] = self.agent.call("hammer", op2="mix", path="dir/inner",
                                                 obh=self.obh, until=str(self.done),
                                                 threads=self.threads)

    def finish(self, across: str) -> dict[str, Any]:
        """Let the last fhmon answer calls too, end the load, return the agent's results.

        across: what the load ran across, for the messages ("restarts", "upgrades").
        """
        time.sleep(0.3)  # calls answered by the last fhmon too
        self.done.touch()
        self.worker.join(timeout=180)
        assert not self.worker.is_alive(), f"a target thread hung across the {across}"
        result: dict[str, Any] = self.outcome["result"]
        assert result["ended_by_until"], f"the load stopped before the {across} were over"
        return result
