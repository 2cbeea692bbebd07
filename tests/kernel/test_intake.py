"""Registration: the native protocol, the OCI listenerPath convention, and their refusals."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from protocol import intake_wire
from tests.support import FHMON, SYSTEM_PYTHON, Agent, Runner, Service, World
from tests.support.handles import N2HResult
from tests.support.listeners import FilteredChild, filtered_child, hello, send_raw


@pytest.fixture
def child() -> Iterator[FilteredChild]:
    c = filtered_child()
    yield c
    c.close()


def answer(raw: bytes) -> intake_wire.Message:
    decoder = intake_wire.FrameDecoder()
    decoder.feed(raw)
    message = decoder.next_message()
    assert message is not None, raw
    return message


def refused(raw: bytes, err: int, words: str) -> None:
    message = answer(raw)
    assert isinstance(message, intake_wire.Refuse), message
    assert message.errno == err, message
    assert words in message.reason, message


@pytest.mark.parametrize("style", ["runc", "crun"])
def test_oci_runtime_registration(style: str, spawn: Any, fhmon: Service) -> None:
    agent: Agent = spawn(style)
    assert agent.hello["uid"] == 65534
    r = N2HResult.of(agent.call("n2h", path="dir/inner"))
    assert r.errno == 0
    opened = agent.call("obh", handle_type=r.handle_type, f_handle=r.f_handle.hex())
    assert opened["errno"] == 0 and bytes.fromhex(opened["head"]) == b"inner file\n"
    targets = {t["pid"]: t for t in fhmon.status()["targets"]}
    assert targets[agent.pid]["convention"] == "oci"


def test_native_accept_and_status(child: FilteredChild, fhmon: Service, world: World) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(fhmon.socket)
        import array
        sock.sendmsg([hello(str(world.main), child.pid)],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [child.listener]))])
        message = answer(sock.recv(65536))
        assert isinstance(message, intake_wire.Accept)
        assert f"share {world.main}" in message.message
        assert child.pid in [t["pid"] for t in fhmon.status()["targets"]]
        # The same listener again (a dup): refused, whoever sends it.
        dup = os.dup(child.listener)
        try:
            refused(send_raw(fhmon.socket, hello(str(world.main), child.pid), [dup]),
                    errno.EEXIST, "already registered")
        finally:
            os.close(dup)


class TestRefusals:
    def test_share_outside_allow_list(self, child: FilteredChild, fhmon: Service,
                                      world: World) -> None:
        refused(send_raw(fhmon.socket, hello(str(world.outside), child.pid), [child.listener]),
                errno.EACCES, "not in the allow-list")

    def test_share_path_through_a_symlink(self, child: FilteredChild, fhmon: Service,
                                          world: World) -> None:
        link = world.shares / "sneaky"
        link.symlink_to(world.main)
        try:
            refused(send_raw(fhmon.socket, hello(str(link), child.pid), [child.listener]),
                    errno.ELOOP, "symlink")
        finally:
            link.unlink()

    def test_relative_and_missing_shares(self, child: FilteredChild, fhmon: Service,
                                         world: World) -> None:
        refused(send_raw(fhmon.socket, hello("shares/main", child.pid), [child.listener]),
                errno.EINVAL, "absolute")
        refused(send_raw(fhmon.socket, hello(str(world.shares / "nope"), child.pid),
                         [child.listener]), errno.ENOENT, "No such file")

    @pytest.mark.parametrize("count", [0, 2, 10])
    def test_wrong_number_of_fds(self, count: int, fhmon: Service, world: World) -> None:
        fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(count)]
        try:
            refused(send_raw(fhmon.socket, hello(str(world.main), os.getpid()), fds),
                    errno.EINVAL, "exactly one fd")
        finally:
            for fd in fds:
                os.close(fd)

    def test_fd_that_is_not_a_listener(self, fhmon: Service, world: World) -> None:
        r, w = os.pipe()
        try:
            refused(send_raw(fhmon.socket, hello(str(world.main), os.getpid()), [r]),
                    errno.EINVAL, "not a seccomp listener")
        finally:
            os.close(r)
            os.close(w)

    def test_unknown_version_garbage_and_oversize(self, fhmon: Service, world: World) -> None:
        refused(send_raw(fhmon.socket, hello(str(world.main), 1, version=9)), errno.EPROTO,
                "unsupported protocol version")
        refused(send_raw(fhmon.socket, b"FHMX" + b"\0" * 40), errno.EPROTO, "bad magic")
        big = intake_wire.Header.build({"version": 1, "kind": 1, "length": 1 << 20})
        refused(send_raw(fhmon.socket, big), errno.EPROTO, "exceeds")
        assert send_raw(fhmon.socket, hello(str(world.main), 1)[:10], close_write=True) == b""

    @pytest.mark.parametrize("payload", [
        b"{not json", b'{"ociVersion": "1.0.2", "fds": [], "pid": 1}',
        b'{"ociVersion": "1.0.2", "fds": ["seccompFd"], "pid": 1, "metadata": "x=y"}',
        b"[1, 2, 3]", b"{" + b" " * 70000 + b"}", b"\xff\xfe",
    ])
    def test_malformed_oci_states_close_and_keep_nothing(self, payload: bytes,
                                                         fhmon: Service) -> None:
        before = fhmon.fd_count()
        r, w = os.pipe()
        try:
            assert send_raw(fhmon.socket, payload, [r], close_write=True) == b""
        finally:
            os.close(r)
            os.close(w)
        deadline = time.monotonic() + 5  # other tests' targets may still be winding down
        while fhmon.fd_count() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fhmon.fd_count() <= before

    def test_oci_listener_of_someone_elses_process(self, child: FilteredChild,
                                                   fhmon: Service, world: World) -> None:
        state = {"ociVersion": "1.0.2", "fds": ["seccompFd"], "pid": child.pid,
                 "metadata": f"share={world.outside}"}
        send_raw(fhmon.socket, json.dumps(state).encode(), [child.listener], close_write=True)
        assert child.pid not in [t["pid"] for t in fhmon.status()["targets"]]
        assert any(e.get("event") == "registration_refused" and "allow-list" in e.get(
            "reason", "") for e in fhmon.events())

    def test_fhmon_keeps_serving_and_fd_count_is_stable(self, fhmon: Service,
                                                        spawn: Any) -> None:
        before = fhmon.fd_count()
        for _ in range(20):
            send_raw(fhmon.socket, b"garbage" * 10, close_write=True)
        agent: Agent = spawn()
        assert agent.call("n2h", path="file")["errno"] == 0
        agent.close()
        deadline = time.monotonic() + 5  # the target's listener is freed asynchronously
        while fhmon.fd_count() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fhmon.fd_count() <= before


@pytest.fixture(scope="module")
def strict_fhmon(world: World) -> Iterator[Service]:
    """A second instance: short intake timeout, a group-accessible socket for uid 65534."""
    config = world.base / "strict.toml"
    config.write_text('registration_timeout = 0.5\nsocket_mode = "0660"\nsocket_group = 65534\n')
    private = world.shares / "private"
    private.mkdir(mode=0o700, exist_ok=True)
    with Service(world.base, [str(world.shares / "*")], name="strict",
                 extra=["--config", str(config)]) as service:
        os.chmod(service.dir, 0o755)
        yield service


class TestUnprivilegedClients:
    def test_slow_loris_is_timed_out(self, strict_fhmon: Service) -> None:
        start = time.monotonic()
        assert send_raw(strict_fhmon.socket, b"", timeout=5) == b""
        assert time.monotonic() - start < 3

    def test_unprivileged_launch_registers(self, strict_fhmon: Service, world: World,
                                           unprivileged: Runner) -> None:
        proc = subprocess.run(unprivileged.fhmon(
            "launch", "--socket", strict_fhmon.socket, "--share", str(world.main), "--",
            "/bin/sh", "-c", "id -u"), capture_output=True, text=True, timeout=30, user=65534,
            group=65534, extra_groups=[], env=unprivileged.env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "65534"
        events = [e for e in strict_fhmon.events() if e.get("event") == "target_registered"]
        assert events and events[-1]["peer_uid"] == 65534

    def test_unprivileged_client_cannot_register_a_share_it_cannot_reach(
            self, strict_fhmon: Service, world: World, unprivileged: Runner) -> None:
        proc = subprocess.run(unprivileged.fhmon(
            "launch", "--socket", strict_fhmon.socket, "--share", str(world.shares / "private"),
            "--", "/bin/true"), capture_output=True, text=True, timeout=30, user=65534,
            group=65534, extra_groups=[], env=unprivileged.env)
        assert proc.returncode != 0
        assert "refused" in proc.stderr and "Permission denied" in proc.stderr

    def test_unprivileged_client_cannot_claim_another_users_process(
            self, strict_fhmon: Service, world: World, unprivileged: Runner) -> None:
        child = filtered_child(uid=65534)
        try:
            script = (
                "import socket, array, sys\n"
                "from tests.support.listeners import send_raw, hello\n"
                f"print(send_raw({strict_fhmon.socket!r}, hello({str(world.main)!r}, 1), "
                "[int(sys.argv[1])]).hex())\n")
            fd = os.dup(child.listener)
            os.set_inheritable(fd, True)
            proc = subprocess.run([*unprivileged.python, "-c", script, str(fd)],
                                  capture_output=True, text=True, timeout=30, user=65534,
                                  group=65534, extra_groups=[], pass_fds=[fd], cwd="/",
                                  env=unprivileged.env)
            os.close(fd)
            assert proc.returncode == 0, proc.stderr
            refused(bytes.fromhex(proc.stdout.strip()), errno.EPERM, "does not belong")
        finally:
            child.close()


class TestLauncher:
    def test_refused_registration_never_runs_the_command(self, fhmon: Service, world: World,
                                                         tmp_path: Path) -> None:
        marker = tmp_path / "ran"
        proc = subprocess.run([FHMON, "launch", "--socket", fhmon.socket, "--share",
                               str(world.outside), "--", "touch", str(marker)],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode != 0
        assert "not in the allow-list" in proc.stderr
        assert not marker.exists()

    def test_missing_service(self, world: World) -> None:
        proc = subprocess.run([FHMON, "launch", "--socket", str(world.base / "absent.sock"),
                               "--share", str(world.main), "--", "/bin/true"],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode != 0 and "cannot reach fhmon" in proc.stderr

    def test_exit_status_and_signal_forwarding(self, fhmon: Service, world: World) -> None:
        proc = subprocess.run([FHMON, "launch", "--socket", fhmon.socket, "--share",
                               str(world.main), "--user", "65534", "--", "sh", "-c", "exit 7"],
                              capture_output=True, timeout=30)
        assert proc.returncode == 7
        with launched([FHMON, "launch", "--socket", fhmon.socket, "--share", str(world.main),
                       "--user", "65534", "--", "sh", "-c",
                       "trap 'exit 42' TERM; echo ready; while :; do sleep 0.05; done"],
                      stdout=subprocess.PIPE, text=True) as p:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=30) == 42

    def test_a_signal_at_the_first_moment_the_command_runs_is_forwarded(
            self, fhmon: Service, world: World) -> None:
        """The command signals the launcher as its first act, before the launcher can have
        noticed that it runs: the signal must reach the command, not kill the launcher.
        (As root: uid 65534 may not signal the root launcher.)"""
        for _ in range(5):
            with launched([FHMON, "launch", "--socket", fhmon.socket, "--share",
                           str(world.main), "--", "sh", "-c",
                           "trap 'exit 42' TERM; kill -TERM $PPID; "
                           "while :; do sleep 0.05; done"]) as p:
                assert p.wait(timeout=30) == 42

    def test_a_signal_before_the_command_runs_stops_the_launch(
            self, world: World, tmp_path: Path) -> None:
        """SIGTERM while fhmon has not answered: the launcher ends (128+15) at once, the
        command never runs, its filtered child is not left waiting."""
        marker = tmp_path / "ran"
        with silent_server(tmp_path / "silent.sock") as server, launched(
                [FHMON, "launch", "--socket", server.getsockname(), "--share", str(world.main),
                 "--", "touch", str(marker)]) as p:
            server.settimeout(30)
            connection, _ = server.accept()  # the launcher waits for an answer now
            with connection:
                child = _children_of(p.pid)
                assert len(child) == 1  # its filtered child, waiting
                p.send_signal(signal.SIGTERM)
                assert p.wait(timeout=30) == 128 + signal.SIGTERM
            assert not marker.exists()
            assert not Path(f"/proc/{child[0]}").exists()

    def test_target_does_not_inherit_the_listener(self, spawn: Any) -> None:
        agent: Agent = spawn()
        links = [os.readlink(f"/proc/{agent.pid}/fd/{n}")
                 for n in os.listdir(f"/proc/{agent.pid}/fd")]
        assert "anon_inode:seccomp notify" not in links


@contextlib.contextmanager
def launched(argv: list[str], **kw: Any) -> Iterator[subprocess.Popen[Any]]:
    """Popen in a session of its own; whatever happens, nothing of it outlives the test
    (the launcher, its filtered child, the command and the command's children)."""
    p = subprocess.Popen(argv, start_new_session=True, **kw)
    try:
        yield p
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        if p.stdout is not None:
            p.stdout.close()


@contextlib.contextmanager
def silent_server(path: Path) -> Iterator[socket.socket]:
    """A root-owned listening socket that never answers (clients connect to its backlog)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(16)
        yield server


def _children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(c) for c in text.split()]


# A stand-in for virtiofsd: says exactly how it was run (argv, pid, fds, children, filters).
ARGV_PRINTER = f"""#!{SYSTEM_PYTHON} -IS
import json, os, sys
pid = os.getpid()
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({{"argv": sys.argv, "pid": pid, "fds": sorted(os.listdir("/proc/self/fd")),
                  "children": open(f"/proc/self/task/{{pid}}/children").read().split(),
                  "filters": status["Seccomp_filters"].strip()}}))
"""
# KubeVirt's virtiofsd arguments, and some that must survive untouched.
ORIGINAL_ARGS = ["--socket-path=/var/run/kubevirt/virtiofs-containers/disk.sock",
                 "--shared-dir=/disk", "--cache=auto", "--sandbox=none",
                 "--inode-file-handles=never", "--migration-mode=find-paths",
                 "--migration-on-error=guest-error", "--xattr", "with space", "", "-o", "a=b"]
# A runtime's seccomp profile that answers EPERM for open_by_handle_at (as containerd's
# default does without CAP_DAC_READ_SEARCH): ERRNO outranks the launcher's USER_NOTIF.
EPERM_PROFILE = ("import errno, os, sys, pyseccomp\n"
                 "f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)\n"
                 "f.add_rule(pyseccomp.ERRNO(errno.EPERM), 'open_by_handle_at')\n"
                 "f.load()\n"
                 "os.execv(sys.argv[1], sys.argv[1:])\n")


@dataclass
class Ran:
    status: int
    printed: dict[str, Any]
    stderr: str
    seconds: float
    launcher_pid: int


class TestFailOpen:
    """--fail-open: whatever keeps fhmon from serving, CMD runs exactly as given, in the
    launcher's own process, with nothing of the attempt left behind."""

    @pytest.fixture
    def printer(self, tmp_path: Path) -> str:
        path = tmp_path / "virtiofsd"
        path.write_text(ARGV_PRINTER)
        path.chmod(0o755)
        return str(path)

    def run(self, socket_path: str, share: Path, printer: str, *options: str,
            wrapper: tuple[str, ...] = ()) -> Ran:
        argv = [*wrapper, FHMON, "launch", "--socket", socket_path, "--share", str(share),
                "--fail-open", *options, "--", printer, *ORIGINAL_ARGS]
        start = time.monotonic()
        with launched(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
            out, err = p.communicate(timeout=60)
            seconds = time.monotonic() - start
        assert p.returncode == 0, err
        return Ran(p.returncode, json.loads(out), err, seconds, p.pid)

    def baseline(self, printer: str, wrapper: tuple[str, ...] = ()) -> dict[str, Any]:
        """The printer run directly, as KubeVirt would run virtiofsd without fhmon."""
        out = subprocess.run([*wrapper, printer, *ORIGINAL_ARGS], capture_output=True,
                             text=True, timeout=60, check=True).stdout
        return dict(json.loads(out))

    def assert_unserved(self, ran: Ran, printer: str, why: str,
                        wrapper: tuple[str, ...] = (), same_process: bool = True) -> None:
        assert ran.printed["argv"] == [printer, *ORIGINAL_ARGS]  # byte for byte
        lines = [line for line in ran.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "without fhmon" in lines[0] and why in lines[0], lines
        expected = self.baseline(printer, wrapper)
        assert ran.printed["fds"] == expected["fds"]  # no listener, channel or socket left
        assert ran.printed["filters"] == expected["filters"]  # not under the handle filter
        assert ran.printed["children"] == []  # the filtered child was killed and reaped
        if same_process:
            assert ran.printed["pid"] == ran.launcher_pid

    def test_no_socket_runs_the_original_at_once(self, world: World, printer: str,
                                                 tmp_path: Path) -> None:
        ran = self.run(str(tmp_path / "absent.sock"), world.main, printer)
        self.assert_unserved(ran, printer, "cannot reach fhmon")
        print(f"launcher pointed at no fhmon: the original ran after {ran.seconds:.3f}s")
        assert ran.seconds < 20  # a generous bound (the target is a second)

    def test_connection_refused(self, world: World, printer: str, tmp_path: Path) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
            dead.bind(str(tmp_path / "dead.sock"))  # bound, not listening: ECONNREFUSED
            ran = self.run(str(tmp_path / "dead.sock"), world.main, printer)
        self.assert_unserved(ran, printer, "Connection refused")

    def test_refused_registration(self, fhmon: Service, world: World, printer: str) -> None:
        ran = self.run(fhmon.socket, world.outside, printer, "--virtiofsd-handles=prefer")
        self.assert_unserved(ran, printer, "not in the allow-list")

    def test_server_that_never_answers(self, world: World, printer: str,
                                       tmp_path: Path) -> None:
        with silent_server(tmp_path / "silent.sock") as server:
            ran = self.run(server.getsockname(), world.main, printer,
                           "--registration-timeout=1")
        self.assert_unserved(ran, printer, "did not answer within 1s")

    def test_accepted_by_something_that_never_serves_the_listener(
            self, world: World, printer: str, tmp_path: Path) -> None:
        """ACCEPT, then nobody reads the listener: the probe's call would wait forever."""
        kept: list[int] = []
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(str(tmp_path / "liar.sock"))
            server.listen(1)

            def accept_and_ignore() -> None:
                connection, _ = server.accept()
                _, fds, _, _ = socket.recv_fds(connection, 65536, 4)
                kept.extend(fds)
                connection.sendall(
                    intake_wire.encode(intake_wire.Accept(1, b"\1" * 32, "accepted")))
                kept.append(connection.detach())

            thread = threading.Thread(target=accept_and_ignore, daemon=True)
            thread.start()
            try:
                ran = self.run(str(tmp_path / "liar.sock"), world.main, printer,
                               "--registration-timeout=1")
            finally:
                thread.join(timeout=30)
                for fd in kept:
                    os.close(fd)
        assert len(kept) == 3  # the listener and the target's pidfd reached the liar
        self.assert_unserved(ran, printer, "probe got no answer")

    def test_probe_gets_eperm_from_a_runtime_profile(self, fhmon: Service, world: World,
                                                     printer: str) -> None:
        wrapper = (sys.executable, "-c", EPERM_PROFILE)
        ran = self.run(fhmon.socket, world.main, printer, "--virtiofsd-handles=prefer",
                       wrapper=wrapper)
        self.assert_unserved(ran, printer, "open_by_handle_at of the share's root: EPERM",
                             wrapper=wrapper)

    def test_filter_cannot_be_installed(self, fhmon: Service, world: World,
                                        printer: str) -> None:
        """Inside another `fhmon launch` the kernel refuses a second listener (EBUSY)."""
        outer = (FHMON, "launch", "--socket", fhmon.socket, "--share", str(world.main), "--")
        ran = self.run(fhmon.socket, world.main, printer, "--virtiofsd-handles=prefer",
                       wrapper=outer)
        self.assert_unserved(ran, printer, "could not install the filter", wrapper=outer,
                             same_process=False)

    @pytest.mark.parametrize("migration", [False, True])
    def test_served_gets_the_handle_flags(self, fhmon: Service, world: World, printer: str,
                                          migration: bool) -> None:
        options = ["--virtiofsd-handles=prefer"]
        if migration:
            options.append("--virtiofsd-migration=file-handles")
        ran = self.run(fhmon.socket, world.main, printer, *options)
        self.assert_served(ran, printer, migration)

    def test_served_as_an_unprivileged_user(self, fhmon: Service, world: World,
                                            tmp_path: Path) -> None:
        """As in KubeVirt (uid 107 there): the probe's open_by_handle_at, which the kernel
        refuses without CAP_DAC_READ_SEARCH, succeeds through fhmon."""
        tools = Path(tempfile.mkdtemp(dir=world.base))
        tools.chmod(0o755)
        printer = tools / "virtiofsd"
        printer.write_text(ARGV_PRINTER)
        printer.chmod(0o755)
        ran = self.run(fhmon.socket, world.main, str(printer), "--user", "65534",
                       "--virtiofsd-handles=prefer")
        self.assert_served(ran, str(printer), migration=False)

    def assert_served(self, ran: Ran, printer: str, migration: bool) -> None:
        mode = "--migration-mode=file-handles" if migration else "--migration-mode=find-paths"
        expected = [printer,
                    *[mode if a.startswith("--migration-mode=") else a
                      for a in ORIGINAL_ARGS if a != "--inode-file-handles=never"],
                    "--inode-file-handles=prefer"]
        assert ran.printed["argv"] == expected
        assert ran.printed["pid"] != ran.launcher_pid  # the launcher stays its parent
        assert int(ran.printed["filters"]) == int(self.baseline(printer)["filters"]) + 1
        assert "without fhmon" not in ran.stderr


def test_a_client_refused_again_and_again_writes_a_bounded_audit_trail(
        fhmon: Service) -> None:
    """400 OCI states that are not JSON, one connection each, from one client: each is
    refused and counted, but the audit trail gets 20 lines, then a summary line a second
    with the count of those held back (`summary`, `count`): the lines account for all."""
    def audited() -> list[dict[str, Any]]:
        return [e for e in fhmon.events() if e.get("event") == "registration_refused"
                and e.get("audit") and "not valid JSON" in str(e.get("reason"))]

    refused_before = fhmon.status()["registrations"].get("refused", 0)
    lines_before = len(audited())
    for _ in range(400):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(fhmon.socket)
            conn.sendall(b"{garbage")
            conn.shutdown(socket.SHUT_WR)
            conn.recv(16)  # fhmon closes it once refused
    deadline = time.monotonic() + 5
    while True:
        lines = audited()[lines_before:]
        accounted = sum(int(e["count"]) if e.get("summary") else 1 for e in lines)
        if accounted >= 400 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert accounted == 400, lines[-3:]
    assert len(lines) <= 30, len(lines)
    assert all(e["peer_uid"] == 0 for e in lines)
    assert fhmon.status()["registrations"]["refused"] - refused_before == 400
