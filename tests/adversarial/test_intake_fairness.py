"""Intake fairness: one client uid cannot take the intake from everyone.

Found: with `socket_group` set, a member of the group holding `max_connections` idle
connections made fhmon refuse `fhmon probe` and root's registrations for as long as it
liked. Now pending (not yet registered) connections are capped per client uid
(`max_connections_per_uid`), all non-root uids together by `max_connections`, and root has
a pool of its own. Registered connections (a launcher's) are bounded by `max_targets`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.adversarial.common import REGISTRATION, run_as_nobody, wait_for
from tests.adversarial.recording import Recorder
from tests.support import FHMON, NOBODY, SYSTEM_PYTHON, Agent, Runner, Service, World

# Opens N connections to the socket and holds them; after a moment reports how many fhmon
# kept open (no EOF) and how many it closed at once; then holds them until stdin closes.
HOLDER = r"""
import json, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
conns = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        continue
    conns.append(s)
time.sleep(1.0)
held = 0
for s in conns:
    try:
        held += s.recv(1, socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        held += 1
    except OSError:
        pass
print(json.dumps({"held": held, "tried": n}), flush=True)
sys.stdin.read()
"""


class Holder:
    def __init__(self, socket_path: str, n: int, uid: int, gid: int = NOBODY) -> None:
        self.proc = subprocess.Popen([SYSTEM_PYTHON, "-c", HOLDER, socket_path, str(n)],
                                     user=uid, group=gid, extra_groups=[],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read() if self.proc.stderr else ""
        self.held = int(json.loads(line)["held"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def grouped_fhmon(world: World, name: str, settings: str) -> Service:
    config = world.base / f"{name}.toml"
    config.write_text('registration_timeout = 60\nsocket_mode = "0660"\n'
                      f'socket_group = {NOBODY}\n{settings}')
    return Service(world.base, [str(world.shares / "*")], name=name,
                   extra=["--config", str(config)])


def probe_ok(service: Service) -> bool:
    try:
        return subprocess.run([FHMON, "probe", "--socket", service.socket, "--timeout", "5"],
                              capture_output=True, timeout=15).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for holder in made:
        holder.close()


def test_a_group_member_holding_every_slot_starves_neither_root_nor_the_probe(
        world: World, record: Recorder, holders: list[Holder]) -> None:
    with grouped_fhmon(world, "fair-root", "max_connections = 8\n") as service:
        try:
            holders.append(Holder(service.socket, 20, NOBODY))
            probed = probe_ok(service)
            try:
                agent = Agent(world, "fhmon", world.main, service.socket, user=None)  # root's
            except RuntimeError:  # the launch was refused
                answered = False
            else:
                try:
                    answered = agent.call("n2h", path="file", answer_within=10)["errno"] == 0
                finally:
                    agent.close()
            record(REGISTRATION, "uid 65534 (in socket_group) holds 20 idle connections against "
                   "max_connections = 8; then root probes and registers",
                   "the member holds at most 8; root's probe and registration succeed",
                   f"member holds {holders[0].held}; probe {'ok' if probed else 'REFUSED'}; root "
                   f"registration {'served' if answered else 'NOT served'}",
                   ok=holders[0].held <= 8 and probed and answered)
        finally:
            for holder in holders:
                holder.close()
            holders.clear()


def test_one_uid_cannot_take_every_non_root_slot(world: World, record: Recorder,
                                                 holders: list[Holder]) -> None:
    with grouped_fhmon(world, "fair-uid",
                       "max_connections = 8\nmax_connections_per_uid = 3\n") as service:
        first = Holder(service.socket, 20, NOBODY)
        holders.append(first)
        second = Holder(service.socket, 20, NOBODY - 1)  # another member of the group
        holders.append(second)
        third = Holder(service.socket, 20, NOBODY - 2)
        holders.append(third)
        fourth = Holder(service.socket, 20, NOBODY - 3)  # 3 + 3 + 3 > 8: the total cap
        holders.append(fourth)
        probed = probe_ok(service)
        record(REGISTRATION, "four uids of socket_group each open 20 connections "
               "(max_connections_per_uid = 3, max_connections = 8)",
               "each uid holds at most 3, all together at most 8; root's probe succeeds",
               f"held {first.held}, {second.held}, {third.held}, {fourth.held}; probe "
               f"{'ok' if probed else 'REFUSED'}",
               ok=(first.held == 3 and second.held == 3
                   and first.held + second.held + third.held + fourth.held == 8 and probed))
        for holder in holders:
            holder.close()
        holders.clear()
        assert wait_for(lambda: Holder(service.socket, 3, NOBODY).held == 3, 10), \
            "the slots did not come back"


def test_registered_launchers_do_not_count_against_the_per_uid_cap(
        world: World, unprivileged: Runner, record: Recorder) -> None:
    """A uid that launches more targets than max_connections_per_uid (virt-handler runs
    one virtiofsd per VM) keeps every registration: lingering connections are targets."""
    with grouped_fhmon(world, "fair-linger", "max_connections_per_uid = 2\n") as service:
        launchers: list[subprocess.Popen[str]] = []
        try:
            answered = 0
            for _ in range(4):  # `fhmon launch` run by uid 65534 itself (peer uid 65534)
                proc = subprocess.Popen(
                    [*unprivileged.fhmon("launch", "--socket", service.socket, "--share",
                                         str(world.main)), "--", SYSTEM_PYTHON, str(world.agent),
                     str(world.main)], env=unprivileged.env, cwd="/", stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    **run_as_nobody())
                launchers.append(proc)
                assert proc.stdout is not None and proc.stdin is not None
                assert proc.stdout.readline(), proc.stderr.read() if proc.stderr else ""
            for proc in launchers:
                assert proc.stdout is not None and proc.stdin is not None
                proc.stdin.write(json.dumps({"op": "n2h", "path": "file"}) + "\n")
                proc.stdin.flush()
                answered += json.loads(proc.stdout.readline())["errno"] == 0
            probed = probe_ok(service)
            record(REGISTRATION, "uid 65534 runs 4 `fhmon launch` (each stays connected) with "
                   "max_connections_per_uid = 2", "all 4 registered and served",
                   f"{answered} served; probe {'ok' if probed else 'REFUSED'}",
                   ok=answered == 4 and probed)
        finally:
            for proc in launchers:
                if proc.stdin is not None:
                    proc.stdin.close()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


# Pipelines PING frames as fast as fhmon takes them for `seconds`; reports how many PONGs
# came back (fhmon paces a client uid's intake work: it answers, at its own pace).
PIPELINER = r"""
import json, socket, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
ping = bytes.fromhex(sys.argv[3])
burst = ping * 1365
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
s.settimeout(0.05)
got, end = 0, time.monotonic() + seconds
while time.monotonic() < end:
    try:
        s.sendall(burst)
    except TimeoutError:
        pass
    try:
        got += len(s.recv(1 << 20))
    except TimeoutError:
        pass
print(json.dumps({"pong_bytes": got}), flush=True)
"""


def test_a_pipelining_client_is_answered_and_so_is_everyone_else(
        world: World, record: Recorder) -> None:
    """Speed is measured in bench/intake.py (neighbour p99 ratios); here: answered."""
    from protocol import intake_wire

    with grouped_fhmon(world, "fair-pipe", "") as service:
        victim = Agent(world, "fhmon", world.main, service.socket)
        floods = [subprocess.Popen([SYSTEM_PYTHON, "-c", PIPELINER, service.socket, "4",
                                    intake_wire.encode(intake_wire.Ping()).hex()],
                                   stdout=subprocess.PIPE, text=True, **run_as_nobody())
                  for _ in range(4)]
        try:
            answered = sum(victim.call("n2h", path="file", answer_within=10)["errno"] == 0
                           for _ in range(200))
            probed = probe_ok(service)
            pongs = [json.loads(f.communicate(timeout=30)[0])["pong_bytes"] for f in floods]
            alive = service.proc is not None and service.proc.poll() is None
            record(REGISTRATION, "4 connections of uid 65534 pipeline PINGs for 4 s while a "
                   "target makes 200 calls", "every call answered; the probe answered; the "
                   "flood answered too (paced); fhmon up",
                   f"{answered}/200 answered; probe {'ok' if probed else 'REFUSED'}; flood got "
                   f"{min(pongs)}-{max(pongs)} bytes of PONGs; fhmon {'up' if alive else 'DOWN'}",
                   ok=answered == 200 and probed and min(pongs) > 0 and alive)
        finally:
            for flood in floods:
                if flood.poll() is None:
                    flood.kill()
                    flood.wait()
            victim.close()


# Opens N connections, sends each 60 KB of an OCI state message that never ends (inside a
# string), then reports how many fhmon kept open after a moment (like HOLDER).
PARTIAL_HOLDER = r"""
import json, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
head = b'{"ociVersion":"1.0.2","fds":["seccompFd"],"pid":1,"metadata":"'
conns = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        s.sendall(head + b"a" * (60000 - len(head)))
    except OSError:
        continue
    conns.append(s)
    time.sleep(0.05)
time.sleep(1.0)
held = 0
for s in conns:
    try:
        held += s.recv(1, socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        held += 1
    except OSError:
        pass
print(json.dumps({"held": held, "tried": n}), flush=True)
sys.stdin.read()
"""


def test_one_uid_cannot_make_fhmon_hold_more_than_its_share_of_unfinished_state_messages(
        world: World, record: Recorder) -> None:
    """Issue 37.2: 100 connections each sending 60 KB of an unfinished OCI state, then a
    byte a ms, raised a neighbour's p99 5x; fhmon held 6 MB of that uid's bytes and parsed
    each connection's whole buffer again on every byte. Now a uid's unfinished messages
    share 256 KiB (4 of 60 KB): the connection that would hold more is refused at once."""
    from monitor.intake import Admission

    with grouped_fhmon(world, "fair-partial", "") as service:
        victim = Agent(world, "fhmon", world.main, service.socket)
        holder = subprocess.Popen([SYSTEM_PYTHON, "-c", PARTIAL_HOLDER, service.socket, "10"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  **run_as_nobody())
        try:
            assert holder.stdout is not None
            held = int(json.loads(holder.stdout.readline())["held"])
            answered = sum(victim.call("n2h", path="file", answer_within=10)["errno"] == 0
                           for _ in range(50))
            probed = probe_ok(service)
            share = Admission.PARTIAL_BYTES // 60000
            record(REGISTRATION, "uid 65534 opens 10 connections, each sending 60 KB of an "
                   "OCI state message that never ends (registration_timeout 60 s)",
                   f"fhmon holds {share} of them (256 KiB), refuses the others at once; a "
                   "neighbour's calls and the probe are answered",
                   f"held {held} of 10; {answered}/50 answered; probe "
                   f"{'ok' if probed else 'REFUSED'}",
                   ok=held == share and answered == 50 and probed)
        finally:
            if holder.stdin is not None:
                holder.stdin.close()
            holder.wait(timeout=10)
            victim.close()
