"""The adversarial suite's per-scenario checks: a well-behaved bystander target beside the
attacker, and fhmon's fd count and RSS before and after (cleanup is asynchronous: polled)."""

from __future__ import annotations

import time

from tests.adversarial.common import errname, wait_for
from tests.adversarial.recording import FD_SETTLE_SECONDS, RSS_TOLERANCE_KIB, STATE
from tests.support import Agent, Service
from tests.support.handles import N2HResult


class Bystander:
    """A well-behaved target beside the attacker; check() lists what is wrong, if anything."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        first = N2HResult.of(agent.call("n2h", path="dir/inner"))
        assert first.errno == 0, first
        self.handle_type = int(first.handle_type or 0)
        self.f_handle = first.f_handle
        self.fds = int(agent.call("fdcount")["fds"])

    def check(self) -> list[str]:
        problems: list[str] = []
        if self.agent.proc.poll() is not None:
            return [f"bystander exited with {self.agent.proc.returncode}"]
        again = N2HResult.of(self.agent.call("n2h", path="dir/inner"))
        if again.errno != 0 or again.f_handle != self.f_handle:
            problems.append(f"n2h dir/inner: errno {again.errno}, handle changed "
                            f"{again.f_handle != self.f_handle}")
        opened = self.agent.call("obh", handle_type=self.handle_type,
                                 f_handle=self.f_handle.hex())
        if opened["errno"] != 0 or bytes.fromhex(opened.get("head", "")) != b"inner file\n":
            problems.append(f"obh dir/inner: {opened}")
        escape = self.agent.call("n2h", path="../../outside/secret")["errno"]
        if escape != 13:
            problems.append(f"n2h ../../outside/secret gave {errname(escape)}, not EACCES")
        fds = int(self.agent.call("fdcount")["fds"])
        if fds != self.fds:
            problems.append(f"bystander holds {fds} fds, had {self.fds}")
        return problems


class Baseline:
    """fd count and RSS of an fhmon instance before a scenario, and the check after it."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.fds = service.fd_count()
        self.rss = service.rss_kib()

    def settle(self, timeout: float = FD_SETTLE_SECONDS) -> list[str]:
        start = time.monotonic()
        if self.service.proc is None or self.service.proc.poll() is not None:
            return [f"fhmon {self.service.dir.name} is not running"]
        if not wait_for(lambda: self.service.fd_count() <= self.fds, timeout):
            return [f"fhmon {self.service.dir.name} holds {self.service.fd_count()} fds, "
                    f"baseline {self.fds}"]
        STATE.max_fd_settle = max(STATE.max_fd_settle, time.monotonic() - start)
        growth = self.service.rss_kib() - self.rss
        STATE.max_rss_growth = max(STATE.max_rss_growth, growth)
        if growth > RSS_TOLERANCE_KIB:
            return [f"fhmon {self.service.dir.name} RSS grew by {growth} KiB"]
        return []
