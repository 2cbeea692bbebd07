"""Restart survival: fhmon stopped or killed, and restarted, under a busy target.

The launcher keeps its copy of the listener, so calls made while no fhmon runs wait;
when the connection drops it makes the calls the old fhmon had received but not answered
trap again (SIGSTOP/SIGCONT), then registers with the new fhmon. Handles issued before a
restart open after it (same keys).

One outcome is the kernel's, not fhmon's: if fhmon dies by SIGKILL while an
ADDFD|SEND ioctl waits for the target to install the fd, the kernel has already marked
the call answered and the target's open_by_handle_at returns 0 with no fd installed
(docs/semantics.md, "Monitor death"). The SIGKILL test counts those separately and
bounds them by the number of kills; every other call must succeed. With worker processes
(`workers = 2`, and `workers = 1` as the DaemonSet runs) no ioctl of an answer runs in the
killed process: a worker, on the configured data plane (native by default), finishes its
calls when fhmon serve dies, so there the SIGKILL test asserts zero failed calls.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.support import Agent, Service, World
from tests.support.load import Load, registrations, start_and_see_it_register

THREADS = 4  # target threads making a virtiofsd-like 1:3 mix of lookups and opens, from
# before the first restart until after the last one (bounded by the restarts, not by a
# call count that a fast machine finishes before restart 5)


@pytest.mark.parametrize(("stop_signal", "workers"),
                         [(signal.SIGKILL, 0), (signal.SIGTERM, 0), (signal.SIGKILL, 2),
                          (signal.SIGKILL, 1)],
                         ids=["sigkill", "sigterm", "sigkill-workers", "sigkill-1worker"])
def test_target_survives_five_restarts_and_an_upgrade(world: World, tmp_path: Path,
                                                      stop_signal: int, workers: int) -> None:
    settings = f"workers = {workers}\n" if workers else ""
    extra = []
    if settings:
        (tmp_path / "workers.toml").write_text(settings)
        extra = ["--config", str(tmp_path / "workers.toml")]
    service = Service(world.base, [str(world.shares / "*")],
                      name=f"restart-{stop_signal}-{workers}", extra=extra)
    agent = Agent(world, "fhmon", world.main, service.socket)
    try:
        load = Load(agent, world.base / f"restart-{stop_signal}-{workers}.done", THREADS)
        upgraded = tmp_path / "upgrade.toml"
        upgraded.write_text(f'log_level = "debug"\nregistration_timeout = 2.0\n{settings}')
        for round_ in range(5):
            time.sleep(0.3)
            assert load.worker.is_alive(), f"the load ended before restart {round_ + 1}"
            service.stop(stop_signal)
            time.sleep(0.2)  # calls pile up while no fhmon runs
            if round_ == 4:  # an upgrade: a changed configuration
                service.argv += ["--config", str(upgraded)]
            start_and_see_it_register(service)
        result = load.finish("restarts")
        total = sum(result["results"].values())
        answered_zero = [f for f in result["failures"] if f.get("bogus_fd") == 0]
        kernel_race = result["results"].get("-1", 0)
        assert kernel_race == len(answered_zero), result  # no other kind of anomaly
        if stop_signal == signal.SIGTERM or workers:
            assert result["results"] == {"0": total}, result
        else:
            assert kernel_race <= 5, result
            assert result["results"].get("0", 0) + kernel_race == total, result
        again = agent.call("obh", **load.obh)
        assert again["errno"] == 0, "a handle issued before the restarts no longer opens"
        assert agent.call("fdcount")["fds"] == load.fds_before, "fds leaked into the target"
        assert registrations(service) == 6
    finally:
        agent.close()
        service.stop()
