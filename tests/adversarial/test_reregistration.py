"""Re-registration after an fhmon restart must land on the share of the first registration.

After a restart, `fhmon launch` registers its listener again and fhmon resolves the share
path again. A target that made itself root of its own user and mount namespace
(`unshare -Urm`, as uid 65534 on the host) can mount another allowed share (another
tenant's, root's 0700) or anything else over its own share path first. The launcher now
presents the share id of its first ACCEPT, fhmon takes only a share with that id (from the
target's namespace, else from the launcher's, which the target cannot change), and refuses
(ESTALE) a HELLO whose expected share is not the one at that path.
"""

from __future__ import annotations

import errno
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import intake_wire
from tests.adversarial.common import REGISTRATION, errname, n2h_errno, obh_errno, signed
from tests.adversarial.recording import Recorder
from tests.support import FHMON, Agent, Service, World, wait_until
from tests.support.agent import NamespaceAgent
from tests.support.listeners import filtered_child, send_raw


@pytest.fixture
def shares(world: World) -> Iterator[tuple[Path, Path]]:
    mine = world.shares / "adv-rereg-mine"
    victim = world.shares / "adv-rereg-victim"
    mine.mkdir(mode=0o755)
    (mine / "mine").write_text("my own file\n")
    (mine / "mine").chmod(0o644)
    victim.mkdir(mode=0o700)
    (victim / "theirs").write_text("another tenant's file\n")
    (victim / "theirs").chmod(0o644)
    try:
        yield mine, victim
    finally:
        shutil.rmtree(mine)
        shutil.rmtree(victim)


@pytest.fixture
def service(world: World) -> Iterator[Service]:
    svc = Service(world.base, [str(world.shares / "*")], name="rereg")
    try:
        yield svc
    finally:
        svc.stop()
        shutil.rmtree(svc.dir, ignore_errors=True)


def registrations(service: Service, pid: int) -> list[dict[str, Any]]:
    return [e for e in service.events()
            if e.get("event") == "target_registered" and e.get("pid") == pid]


def restart(service: Service, pid: int) -> dict[str, Any] | None:
    """Restart fhmon; the launcher's new registration, or None if none came in 15 s."""
    before = len(registrations(service, pid))
    service.stop()
    service.start()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        got = registrations(service, pid)
        if len(got) > before:
            return got[-1]
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("overmount", ["another tenant's share", "a tmpfs"])
def test_target_mounts_over_its_share_path_then_fhmon_restarts(
        shares: tuple[Path, Path], world: World, service: Service, spawn: Any,
        record: Recorder, overmount: str) -> None:
    mine, victim = shares
    helper: Agent = spawn(share=mine, socket=service.socket)  # same share id: same handles
    htype, handle = signed(helper, "mine")
    helper.close()
    agent = NamespaceAgent(world, service.socket, mine)
    try:
        # registered before it unshared: its own mount namespace has copies of the mounts,
        # so its lookups are on "another mount" (EOPNOTSUPP); handles open on the share
        assert obh_errno(agent, htype, handle) == 0
        mount = ({"source": str(victim), "target": str(mine)} if overmount.endswith("share")
                 else {"tmpfs": True, "target": str(mine)})
        assert agent.call("mount", **mount)["errno"] == 0
        again = restart(service, agent.pid)
        record(REGISTRATION, f"target in its own user+mount namespace mounts {overmount} over "
               f"its share path, fhmon restarts: the share of the re-registration",
               str(mine), again.get("share") if again else "no re-registration")
        record(REGISTRATION, f"... ({overmount}) then: its handle of its own file opens", 0,
               obh_errno(agent, htype, handle, answer_within=10))
        if overmount.endswith("share"):
            record(REGISTRATION, "... then: a handle for the other tenant's file through "
                   "the share path it mounted over", errno.EACCES,
                   n2h_errno(agent, f"{mine}/theirs"))
    finally:
        agent.close()


def test_a_hello_expecting_another_share(shares: tuple[Path, Path], service: Service,
                                         world: World, record: Recorder) -> None:
    """A client that names, for its share path, the id of another share (or garbage)."""
    mine = shares[0]
    child = filtered_child()
    try:
        hello = intake_wire.Hello(child.pid, str(world.main), "test")
        first = send_raw(service.socket, intake_wire.encode(hello), [child.listener])
        accepted = intake_wire.decode_one(first)
        assert isinstance(accepted, intake_wire.Accept), accepted
    finally:
        child.close()
    for what, expected in (("the id of another share", accepted.share_id),
                           ("32 zero bytes", bytes(32))):
        child = filtered_child()
        try:
            raw = send_raw(service.socket, intake_wire.encode(intake_wire.Hello(
                child.pid, str(mine), "test", share_id=expected)), [child.listener])
        finally:
            child.close()
        message = intake_wire.decode_one(raw)
        ok = isinstance(message, intake_wire.Refuse) and message.errno == errno.ESTALE
        record(REGISTRATION, f"HELLO for share {mine.name} expecting {what}",
               "REFUSE ESTALE", f"REFUSE {errname(message.errno)}" if isinstance(
                   message, intake_wire.Refuse) else type(message).__name__.upper(), ok=ok)
    child = filtered_child()
    try:
        raw = send_raw(service.socket, intake_wire.encode(intake_wire.Hello(
            child.pid, str(mine), "test", flags=0x80)), [child.listener])
    finally:
        child.close()
    message = intake_wire.decode_one(raw)
    record(REGISTRATION, "HELLO with an unknown flag bit", "REFUSE EINVAL",
           f"REFUSE {errname(message.errno)}" if isinstance(message, intake_wire.Refuse)
           else type(message).__name__.upper())


# --- the keeper: listeners registered by a runtime (runc keeps no copy) ---------------------

class RuncNamespaceAgent(Agent):
    """The agent as a runc container process (uid 65534, OCI listenerPath convention) that
    makes itself root of its own user and mount namespace (`unshare -Urm`)."""

    def __init__(self, world: World, socket: str, share: Path) -> None:
        super().__init__(world, "runc", share, socket, through=["unshare", "-Urm"])


@pytest.fixture
def keeper(world: World) -> Iterator[str]:
    path = str(world.base / "adv-rereg-keeper.sock")
    proc = subprocess.Popen([FHMON, "keeper", "--socket", path], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    yield path
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)


def test_a_kept_listener_whose_target_mounted_over_its_share_path(
        shares: tuple[Path, Path], world: World, keeper: str, spawn: Any,
        record: Recorder) -> None:
    mine, victim = shares
    svc = Service(world.base, [str(world.shares / "*")], name="rereg-keeper",
                  extra=["--keeper", keeper])
    agent: Agent | None = None
    try:
        helper: Agent = spawn(share=mine, socket=svc.socket)
        htype, handle = signed(helper, "mine")
        helper.close()
        agent = RuncNamespaceAgent(world, svc.socket, mine)
        pid = agent.pid
        assert obh_errno(agent, htype, handle) == 0
        assert wait_until(lambda: any(e.get("event") == "deposited" for e in svc.events()))
        assert agent.call("mount", source=str(victim), target=str(mine))["errno"] == 0
        svc.stop(signal.SIGKILL)
        svc.start()

        def outcome() -> dict[str, Any] | None:
            for e in svc.events():
                if e.get("event") in ("restore_refused", "target_restored") and \
                        e.get("pid") == pid:
                    return e
            return None

        assert wait_until(lambda: outcome() is not None, timeout=15)
        got = outcome()
        assert got is not None
        shown = (f"restored onto {registrations(svc, pid)[-1].get('share')}"
                 if got["event"] == "target_restored"
                 else f"refused: {str(got.get('reason', ''))[:60]}")
        record(REGISTRATION, "runc target (keeper) in its own user+mount namespace mounts "
               "another tenant's share over its share path; fhmon is killed and restores "
               "the kept listener", "refused (the share has another id)", shown,
               ok=got["event"] == "restore_refused"
               and "first registered with" in str(got.get("reason")))
    finally:
        if agent is not None:
            agent.close()
        svc.stop()
        shutil.rmtree(svc.dir, ignore_errors=True)
