"""The socket's directory and the server behind the socket.

Found: a socket directory writable by its group (0775) was accepted; a member of that group
replaced fhmon's socket with its own, `fhmon launch` handed its listener to that impostor,
and the impostor answered another uid's target. Now fhmon refuses to serve from a directory
anyone but root can write (docs/operations.md, "The socket directory"), and `fhmon launch`
sends its listener only to a server the kernel says is root (SO_PEERCRED).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import intake_wire
from tests.adversarial.common import REGISTRATION, wait_for
from tests.adversarial.recording import Recorder
from tests.support import FHMON, NOBODY, SYSTEM_PYTHON, Agent, Service, World
from tests.support.world import nobodys_directory

# An impostor fhmon: binds the path, and for every connection reports what came in (bytes
# and fds) on stdout, then answers a well-formed ACCEPT to lure the client on.
IMPOSTOR = r"""
import array, json, os, socket, sys
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path); os.chmod(path, 0o666); srv.listen(8)
print(json.dumps({"listening": os.getpid()}), flush=True)
while True:
    conn, _ = srv.accept()
    print(json.dumps({"connection": 1, "bytes": 0, "fds": 0}), flush=True)
    conn.settimeout(3)
    try:
        while True:
            data, anc, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(16 * 4))
            fds = []
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds += array.array("i", raw[: len(raw) - len(raw) % 4]).tolist()
            if not data:
                break
            print(json.dumps({"bytes": len(data), "fds": len(fds)}), flush=True)
            if fds:
                conn.sendall(bytes.fromhex(sys.argv[2]))
            for fd in fds:
                os.close(fd)
    except OSError:
        pass
    conn.close()
"""


class Impostor:
    """A server at `path` run as uid 65534."""

    def __init__(self, path: Path) -> None:
        self.path = path
        accept = intake_wire.encode(intake_wire.Accept(1, bytes(32), "registered: impostor")).hex()
        self.proc = subprocess.Popen([SYSTEM_PYTHON, "-c", IMPOSTOR, str(path), accept],
                                     user=NOBODY,
                                     group=NOBODY, extra_groups=[], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read() if self.proc.stderr else ""
        self.pid = int(json.loads(line)["listening"])

    def stop(self) -> list[dict[str, Any]]:
        """What came in: a line per connection, then one per message."""
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        with_contents = [json.loads(line) for line in out.splitlines() if line.strip()]
        if self.path.exists():
            self.path.unlink()
        return with_contents


def launch(socket_path: Path | str, share: Path, *command: str,
           timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FHMON, "launch", "--socket", str(socket_path), "--share",
                           str(share), "--user", str(NOBODY), "--", *command],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def nobodys_dir(world: World) -> Iterator[Path]:
    """A directory uid 65534 owns (where it can bind a socket)."""
    with nobodys_directory(world.base / "impostor") as directory:
        yield directory


def test_launch_refuses_a_server_that_is_not_root(world: World, nobodys_dir: Path,
                                                  record: Recorder) -> None:
    impostor = Impostor(nobodys_dir / "fhmon.sock")
    try:
        res = launch(impostor.path, world.main, "/bin/true")
    finally:
        seen = impostor.stop()
    lines = res.stderr.strip().splitlines()
    fds = sum(c["fds"] for c in seen)
    connections = sum(c.get("connection", 0) for c in seen)
    record(REGISTRATION, "`fhmon launch` at a socket served by uid 65534 (an impostor that "
           "answers ACCEPT)", "exit 125, one line naming the uid; the impostor gets no "
           "listener and not a byte",
           f"exit {res.returncode}; {len(lines)} line(s): {lines[-1] if lines else ''}; "
           f"impostor got {fds} fd(s), {sum(c['bytes'] for c in seen)} bytes",
           ok=(res.returncode == 125 and len(lines) == 1 and "uid 65534" in lines[0]
               and "not root" in lines[0] and fds == 0 and connections == 1
               and all(c["bytes"] == 0 for c in seen)))


def test_relaunch_after_a_restart_refuses_an_impostor(world: World, record: Recorder) -> None:
    """fhmon stops; while it is down, another uid gets to bind the path (the directory is
    opened up meanwhile: the operator error this guards against). The launcher, registering
    again, must refuse it, say so once, and register with the real fhmon when it is back."""
    service = Service(world.base, [str(world.shares / "*")], name="impostor-restart")
    agent = Agent(world, "fhmon", world.main, service.socket)
    impostor: Impostor | None = None
    try:
        assert agent.call("n2h", path="file")["errno"] == 0
        service.stop()
        os.chown(service.dir, NOBODY, NOBODY)  # now uid 65534 may bind there
        impostor = Impostor(Path(service.socket))
        time.sleep(3)  # the launcher retries with backoff (up to 1 s): several attempts
        seen = impostor.stop()
        impostor = None
        os.chown(service.dir, 0, 0)
        service.start()
        back = wait_for(lambda: agent.call("n2h", path="file", answer_within=20)["errno"] == 0,
                        20)
        agent.close()
        assert agent.proc.stderr is not None
        said = [line for line in agent.proc.stderr.read().splitlines()
                if "not root" in line]
        fds = sum(c["fds"] for c in seen)
        connections = sum(c.get("connection", 0) for c in seen)
        record(REGISTRATION, "fhmon restarts; meanwhile uid 65534 serves at its socket path "
               "and the launcher registers again", "no listener to the impostor; one line "
               "saying why; registered again with the real fhmon",
               f"impostor got {fds} fd(s) over {connections} connection(s); {len(said)} "
               f"line(s) {said[:1]}; {'registered again' if back else 'NOT registered again'}",
               ok=fds == 0 and connections >= 2 and len(said) == 1 and back)
    finally:
        if impostor is not None:
            impostor.stop()
        os.chown(service.dir, 0, 0)
        agent.close()
        if service.proc is not None and service.proc.poll() is None:
            service.stop()


def _serve_in(directory: Path, world: World) -> subprocess.CompletedProcess[str]:
    """Start `fhmon serve` with its socket in `directory`; it must refuse (or be stopped)."""
    keys = world.base / "sockdir-keys"
    if not keys.exists():
        subprocess.run([FHMON, "keygen", "--key-dir", str(keys)], check=True,
                       capture_output=True)
    proc = subprocess.Popen([FHMON, "serve", "--socket", str(directory / "fhmon.sock"),
                             "--key-dir", str(keys), "--allow", str(world.shares / "*")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    served = wait_for(lambda: proc.poll() is not None or (directory / "fhmon.sock").exists(),
                      15)
    if proc.poll() is None:
        proc.terminate()
    out, _ = proc.communicate(timeout=15)
    assert served
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


UNSAFE = [  # (what, mode of the socket's directory, its owner, mode of its parent)
    ("socket directory 0775 (group-writable)", 0o775, 0, 0o755),
    ("socket directory 0770 (group-writable, no access for others)", 0o770, 0, 0o755),
    ("socket directory 0730 (group may write, not list)", 0o730, 0, 0o755),
    ("socket directory 1775 (group-writable and sticky)", 0o1775, 0, 0o755),
    ("socket directory 1777 (like /tmp)", 0o1777, 0, 0o755),
    ("socket directory 0755 owned by uid 65534", 0o755, NOBODY, 0o755),
    ("parent of the socket directory 0775 (group could rename it away)", 0o755, 0, 0o775),
    ("parent of the socket directory 0777", 0o755, 0, 0o777),
]


@pytest.mark.parametrize("what,mode,owner,parent_mode", UNSAFE, ids=[u[0] for u in UNSAFE])
def test_fhmon_refuses_a_socket_directory_others_can_write(
        world: World, record: Recorder, what: str, mode: int, owner: int,
        parent_mode: int) -> None:
    parent = world.base / "sockdir-parent"
    directory = parent / "run"
    directory.mkdir(parents=True)
    try:
        directory.chmod(mode)
        os.chown(directory, owner, 0)
        parent.chmod(parent_mode)
        res = _serve_in(directory, world)
        made = (directory / "fhmon.sock").exists()
        check = subprocess.run([FHMON, "check", "--socket", str(directory / "fhmon.sock")],
                               capture_output=True, text=True)
        verdict = [line for line in check.stdout.splitlines() if "socket directory" in line]
        told = [line for line in res.stdout.splitlines() if "refusing to serve" in line]
        record(REGISTRATION, f"fhmon serve with its {what}", "refuses to start, saying "
               "why; `fhmon check` flags it",
               f"exit {res.returncode}, socket {'MADE' if made else 'not made'}: "
               f"{told[-1][-110:] if told else res.stdout[-110:]}; check: "
               f"{verdict[0][:60] if verdict else 'nothing'}",
               ok=res.returncode != 0 and not made and bool(told) and bool(verdict)
               and "FAIL" in verdict[0].upper())
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_fhmon_serves_from_a_directory_only_root_writes(world: World) -> None:
    """The counterpart: root's 0755 (or 0750, 0700) directory under sticky /tmp is fine."""
    for mode in (0o755, 0o750, 0o700, 0o1755):
        parent = world.base / "sockdir-ok"
        directory = parent / "run"
        directory.mkdir(parents=True)
        try:
            directory.chmod(mode)
            res = _serve_in(directory, world)
            assert "serving" in res.stdout, (oct(mode), res.stdout[-2000:])
        finally:
            shutil.rmtree(parent, ignore_errors=True)
