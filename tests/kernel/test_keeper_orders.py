"""fhmon and the keeper restarting in every order.

A runc-registered listener has no copy but fhmon's and the keeper's. Found: when the keeper
restarted (it then holds nothing) or was down when the target registered (the deposit
failed and was never retried), the next fhmon restart lost the listener: the target got
ENOSYS for good. The rule now: whatever order they restart in, no listener is lost while at
least one of the two runs. Each order is played here with SIGKILLs (no goodbyes), with a
real runc-style target calling before, between and after.
"""

from __future__ import annotations

import errno
import os
import signal
import time

import pytest

from tests.support import Agent, Service, World, wait_until
from tests.support.keeper import KeeperProc


def served(agent: Agent) -> int:
    return int(agent.call("n2h", path="file", answer_within=30)["errno"])


ORDERS = {
    "fhmon restarts": ["fhmon"],
    "keeper restarts, then fhmon": ["keeper", "fhmon"],
    "keeper restarts twice, then fhmon": ["keeper", "keeper", "fhmon"],
    "fhmon, then keeper, then fhmon": ["fhmon", "keeper", "fhmon"],
    "keeper down at registration, then up, then fhmon": ["keeper-up-late", "fhmon"],
    "keeper restarts, then fhmon twice": ["keeper", "fhmon", "fhmon"],
}


@pytest.mark.parametrize("order", list(ORDERS))
def test_no_listener_is_lost_while_one_of_them_runs(world: World, order: str) -> None:
    steps = ORDERS[order]
    name = f"order{list(ORDERS).index(order)}"
    keeper = KeeperProc(world.base, f"{name}-keeper")
    late = steps[0] == "keeper-up-late"
    if late:
        steps = steps[1:]
    else:
        keeper.start()
    service = Service(world.base, [str(world.shares / "*")], name=name,
                      extra=["--keeper", keeper.socket])
    agent = Agent(world, "runc", world.main, service.socket)
    try:
        assert served(agent) == 0
        if late:  # the deposit could not be made: the keeper was not there
            time.sleep(0.5)
            keeper.start()
        assert wait_until(lambda: keeper.holds() == 1, 15), "the keeper never got it"
        for step in steps:
            if step == "keeper":
                keeper.kill()
                assert served(agent) == 0  # fhmon alone holds it meanwhile
                keeper.start()
                assert wait_until(lambda: keeper.holds() == 1, 15), \
                    "fhmon did not deposit again with the restarted keeper"
            else:
                service.stop(signal.SIGKILL)
                service.start()
                assert served(agent) == 0, "the listener was lost"
        assert served(agent) == 0
    finally:
        agent.close()
        service.stop()
        keeper.stop()
        if os.path.exists(keeper.socket):
            os.unlink(keeper.socket)


def test_both_down_together_loses_the_listener_as_documented(world: World) -> None:
    """The limit of the rule: with neither running, the last copy is gone (ENOSYS)."""
    keeper = KeeperProc(world.base, "both-down-keeper")
    keeper.start()
    service = Service(world.base, [str(world.shares / "*")], name="both-down",
                      extra=["--keeper", keeper.socket])
    agent = Agent(world, "runc", world.main, service.socket)
    try:
        assert served(agent) == 0
        assert wait_until(lambda: keeper.holds() == 1, 15)
        keeper.kill()
        service.stop(signal.SIGKILL)
        assert agent.call("n2h", path="file", answer_within=30)["errno"] == errno.ENOSYS
    finally:
        agent.close()
        keeper.stop()


@pytest.mark.parametrize("gone", ["killed", "stopped"])
def test_a_registration_while_the_keeper_is_down_survives_a_restart_right_after_its_return(
        world: World, gone: str) -> None:
    """The keeper goes away (SIGKILL leaves its socket file, SIGTERM removes it), a
    runc-style target registers, the keeper comes back and fhmon is restarted at once (a
    rolling upgrade's SIGTERM). fhmon's reconnection backoff (up to 2 s then) had not found
    the keeper yet, so the listener died with fhmon: ENOSYS for good. Now the deposit
    follows the keeper's return within the (shorter) backoff, and a graceful stop deposits
    every such listener and waits for the keeper to have read them."""
    keeper = KeeperProc(world.base, f"down-{gone}-keeper")
    keeper.start()
    service = Service(world.base, [str(world.shares / "*")], name=f"down-{gone}",
                      extra=["--keeper", keeper.socket])
    agent: Agent | None = None
    try:
        assert wait_until(lambda: any(e.get("event") == "keeper_synced"
                                      for e in service.events()), 15)
        if gone == "killed":
            keeper.kill()
        else:
            keeper.stop()
        assert wait_until(lambda: any(e.get("event") == "keeper_lost"
                                      for e in service.events()), 15)
        time.sleep(3)  # a long enough outage for the backoff to reach its longest delay
        agent = Agent(world, "runc", world.main, service.socket)
        assert served(agent) == 0
        assert keeper.holds() == 0
        keeper.start()
        service.stop(signal.SIGTERM)  # at once: no time for the next reconnection
        assert keeper.holds() == 1, "fhmon stopped without handing the listener over"
        service.start()
        assert served(agent) == 0, "the listener was lost"
        assert any(e.get("event") == "target_restored" for e in service.events())
    finally:
        if agent is not None:
            agent.close()
        service.stop()
        keeper.stop()
        if os.path.exists(keeper.socket):
            os.unlink(keeper.socket)
