"""A process that already runs under a seccomp notify listener.

The kernel allows one notify listener per filter chain: a second NEW_LISTENER fails with
EBUSY. `fhmon launch` under another `fhmon launch` (or under a runtime's own seccomp agent)
used to fail with a bare "[Errno 16] ... Device or resource busy" prefixed by the command's
name; and fhmon took a second listener named for a process it already served (over the OCI
convention: silently, the calls keep going to the first listener). Both now say so in one
line.
"""

from __future__ import annotations

import array
import errno
import json
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from protocol import intake_wire
from tests.adversarial.common import REGISTRATION, errname, wait_for
from tests.adversarial.recording import Recorder
from tests.support import FHMON, Agent, Service, World
from tests.support.listeners import FilteredChild, filtered_child, hello, send_raw

BUSY_WORDS = "already runs under another seccomp notify listener"


@pytest.fixture
def child() -> Iterator[FilteredChild]:
    c = filtered_child()
    yield c
    c.close()


@pytest.mark.parametrize("inner_user", [None, "65534"], ids=["as_root", "as_nobody"])
def test_launch_under_launch_says_why_in_one_line(fhmon: Service, world: World,
                                                  record: Recorder,
                                                  inner_user: str | None) -> None:
    inner = [FHMON, "launch", "--socket", fhmon.socket, "--share", str(world.main),
             *(["--user", inner_user] if inner_user else []), "--", "/bin/true"]
    res = subprocess.run([FHMON, "launch", "--socket", fhmon.socket, "--share",
                          str(world.main), "--", *inner], capture_output=True, text=True,
                         timeout=60)
    lines = res.stderr.strip().splitlines()
    record(REGISTRATION, f"`fhmon launch` run as the target of another `fhmon launch` "
           f"(inner target {'uid ' + inner_user if inner_user else 'root'})",
           "exit 125, one line: already under another notify listener (EBUSY)",
           f"exit {res.returncode}; {len(lines)} line(s): {lines[-1][:130] if lines else ''}",
           ok=(res.returncode == 125 and len(lines) == 1 and BUSY_WORDS in lines[0]
               and "EBUSY" in lines[0] and "Traceback" not in res.stderr))


def oci_state(pid: int, share: str) -> bytes:
    return json.dumps({"ociVersion": "1.0.2", "fds": ["seccompFd"], "pid": pid,
                       "metadata": f"share={share}",
                       "state": {"ociVersion": "1.0.2", "id": "busy", "status": "creating",
                                 "pid": pid, "bundle": "/tmp/b"}}).encode()


def refusals(service: Service) -> list[str]:
    return [str(e.get("reason")) for e in service.events()
            if e.get("event") == "registration_refused"]


def test_a_second_listener_for_a_served_process_is_refused(
        fhmon: Service, world: World, spawn: Any, child: FilteredChild,
        record: Recorder) -> None:
    """A runtime wired to fhmon twice: the process already runs under fhmon launch's
    listener, and another listener (of some other filter) arrives named for it."""
    served: Agent = spawn()
    assert served.call("n2h", path="file")["errno"] == 0
    before = len(refusals(fhmon))
    # over the OCI convention (no answer: the refusal is in fhmon's audit log)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(fhmon.socket)
        sock.sendmsg([oci_state(served.pid, str(world.main))],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                       array.array("i", [child.listener]))])
    assert wait_for(lambda: len(refusals(fhmon)) > before, 10)
    reason = refusals(fhmon)[before]
    record(REGISTRATION, "OCI state: a fresh listener named for a process that already runs "
           "under fhmon launch's listener", f"refused, one audit line: {BUSY_WORDS} (EBUSY)",
           f"audit: {reason[:140]}", ok=BUSY_WORDS in reason and "EBUSY" in reason)
    # over the native protocol (REFUSE with its errno)
    decoder = intake_wire.FrameDecoder()
    decoder.feed(send_raw(fhmon.socket, hello(str(world.main), served.pid), [child.listener]))
    answer = decoder.next_message()
    record(REGISTRATION, "HELLO: a fresh listener named for a process that already runs "
           "under fhmon launch's listener", "REFUSE EBUSY naming the other listener",
           f"REFUSE {errname(answer.errno)}: {answer.reason[:100]}"
           if isinstance(answer, intake_wire.Refuse) else type(answer).__name__,
           ok=isinstance(answer, intake_wire.Refuse) and answer.errno == errno.EBUSY
           and BUSY_WORDS in answer.reason)
    assert served.call("n2h", path="file")["errno"] == 0  # the first listener still serves


def test_the_same_listener_for_its_own_process_is_still_accepted(
        world: World, child: FilteredChild) -> None:
    """The counterpart: the check refuses only a pid fhmon already serves."""
    with Service(world.base, [str(world.shares / "*")], name="busy-control") as service:
        decoder = intake_wire.FrameDecoder()
        decoder.feed(send_raw(service.socket, hello(str(world.main), child.pid), [child.listener]))
        answer = decoder.next_message()
        assert isinstance(answer, intake_wire.Accept), answer
