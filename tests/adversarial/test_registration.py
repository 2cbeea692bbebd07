"""Registration abuse: hostile clients of the intake socket.

Documented answers (docs/protocol.md): REFUSE with the errno of the refusal table, then fhmon
closes; OCI states get no answer (the runtime reads none) and are refused in the audit log;
a silent client is cut at registration_timeout. Peer-credential policy: the socket is root's
0600 by default; with `socket_mode = "0660"` and `socket_group`, a member of that group may
register only a process of its own uid, a share it can reach and read with its own
credentials, whose real host directory matches --allow (compared by inode).
"""

from __future__ import annotations

import array
import contextlib
import errno
import json
import os
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from protocol import intake_wire
from tests.adversarial.common import REGISTRATION, errname, run_as_nobody, wait_for
from tests.adversarial.guard import Baseline
from tests.adversarial.recording import Recorder
from tests.support import NOBODY, Runner, Service, World
from tests.support.listeners import FilteredChild, filtered_child, hello, send_raw
from tests.support.world import wait_until


@pytest.fixture
def child() -> Iterator[FilteredChild]:
    c = filtered_child()
    yield c
    c.close()


def answer(raw: bytes) -> intake_wire.Message | None:
    decoder = intake_wire.FrameDecoder()
    try:
        decoder.feed(raw)
        return decoder.next_message()
    except intake_wire.ProtocolError:
        return None


def shown(message: intake_wire.Message | None) -> str:
    if isinstance(message, intake_wire.Refuse):
        return f"REFUSE {errname(message.errno)}: {message.reason[:90]}"
    if message is None:
        return "closed without an answer"
    return type(message).__name__.upper()


def check_refusal(record: Recorder, what: str, raw: bytes, err: int, words: str) -> None:
    message = answer(raw)
    ok = (isinstance(message, intake_wire.Refuse) and message.errno == err
          and words in message.reason)
    record(REGISTRATION, what, f"REFUSE {errname(err)} ('{words}')", shown(message), ok=ok)


# --- shares --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def share_traps(world: World) -> Iterator[dict[str, str]]:
    base = world.base
    (base / "adv_sharelink").symlink_to(world.main)
    (base / "adv_sharesdir").symlink_to(world.shares)
    try:
        yield {"link": str(base / "adv_sharelink"),
               "via_link": str(base / "adv_sharesdir" / "main")}
    finally:
        (base / "adv_sharelink").unlink()
        (base / "adv_sharesdir").unlink()


def test_share_paths(child: FilteredChild, fhmon: Service, world: World,
                     share_traps: dict[str, str], record: Recorder) -> None:
    main = str(world.main)
    cases = [
        ("a share outside --allow", str(world.outside), errno.EACCES, "not in the allow-list"),
        ("the root directory as share", "/", errno.EACCES, "not in the allow-list"),
        ("the allowed dirs' parent as share", str(world.shares), errno.EACCES,
         "not in the allow-list"),
        ("'..' out of an allowed share", main + "/..", errno.EACCES, "not in the allow-list"),
        ("a subdirectory of an allowed share", main + "/dir", errno.EACCES,
         "not in the allow-list"),
        ("a symlink pointing into an allowed dir", share_traps["link"], errno.ELOOP, "symlink"),
        ("a path through a symlinked parent", share_traps["via_link"], errno.ELOOP, "symlink"),
        ("a path through /proc/self/root", "/proc/self/root" + main, errno.ELOOP, "symlink"),
        ("a relative share", "shares/main", errno.EINVAL, "absolute"),
        ("an empty share", "", errno.EINVAL, "absolute"),
        ("a share with a NUL byte", main + "\0/x", errno.EINVAL, "not a valid path"),
        ("a 5000-byte share path", "/" + "a" * 4999, errno.EINVAL, "not a valid path"),
        ("a share that does not exist", main + "_nope", errno.ENOENT, "No such file"),
        ("a regular file as share", main + "/file", errno.ENOTDIR, "Not a directory"),
    ]
    for what, share, err, words in cases:
        check_refusal(record, what, send_raw(fhmon.socket, hello(share, child.pid),
                                             [child.listener]), err, words)
    assert child.pid not in [t["pid"] for t in fhmon.status()["targets"]]


# --- frames ---------------------------------------------------------------------------------------

def frame(kind: int, payload: bytes, version: int = 1, length: int | None = None) -> bytes:
    return (intake_wire.MAGIC + struct.pack(">HHI", version, kind,
                                            len(payload) if length is None else length) + payload)


def hello_payload(pid: int, share: bytes, client: bytes = b"x") -> bytes:
    return (struct.pack(">II", pid, 0) + struct.pack(">H", len(share)) + share
            + struct.pack(">H", len(client)) + client)


def test_malformed_native_messages(fhmon: Service, world: World, record: Recorder) -> None:
    share = str(world.main).encode()
    cases = [
        ("bad magic", b"FHMX" + b"\0" * 40, errno.EPROTO, "bad magic"),
        ("unsupported version 2", frame(1, b"", version=2), errno.EPROTO, "version"),
        ("header announcing 4 GiB", frame(1, b"", length=2**32 - 1), errno.EPROTO, "exceeds"),
        ("header announcing 16385 bytes", frame(1, b"", length=16385), errno.EPROTO,
         "exceeds"),
        ("unknown kind 99", frame(99, b""), errno.EPROTO, "unknown message kind"),
        ("HELLO with trailing bytes", frame(1, hello_payload(1, share) + b"junk"),
         errno.EPROTO, "trailing"),
        ("HELLO whose text length runs past the payload",
         frame(1, struct.pack(">IIH", 1, 0, 500) + b"/x"), errno.EPROTO, "malformed"),
        ("HELLO with a share that is not UTF-8", frame(1, hello_payload(1, b"/\xff\xfe")),
         errno.EPROTO, "malformed"),
        ("PING with a payload", frame(4, b"x"), errno.EPROTO, "no payload"),
        ("an ACCEPT sent by a client", intake_wire.encode(intake_wire.Accept(1, b"\0" * 32, "x")),
         errno.EPROTO, "unexpected message"),
    ]
    for what, data, err, words in cases:
        check_refusal(record, what, send_raw(fhmon.socket, data), err, words)
    for what, data in (("a frame cut inside its header, then EOF", frame(1, b"")[:7]),
                       ("a frame cut inside its payload, then EOF",
                        frame(1, hello_payload(1, share))[:20])):
        got = send_raw(fhmon.socket, data, close_write=True)
        record(REGISTRATION, what, "closed without an answer", shown(answer(got)) if got
               else "closed without an answer")


# --- fds ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def not_listeners(world: World) -> Iterator[dict[str, int]]:
    fds: dict[str, int] = {}
    r, w = os.pipe()
    a, b = socket.socketpair()
    fake = world.base / "anon_inode:seccomp notify"
    fake.write_text("")
    try:
        fds["a pipe"] = r
        fds["a unix socket"] = a.fileno()
        fds["/dev/null"] = os.open("/dev/null", os.O_RDONLY)
        fds["an O_PATH fd of the share"] = os.open(world.main, os.O_PATH)
        fds["an eventfd"] = os.eventfd(0)
        fds["a pidfd"] = os.pidfd_open(os.getpid())
        fds["a memfd named 'seccomp notify'"] = os.memfd_create("seccomp notify")
        fds["a file named 'anon_inode:seccomp notify'"] = os.open(fake, os.O_RDONLY)
        yield fds
    finally:
        for name, fd in fds.items():
            if name != "a unix socket":
                os.close(fd)
        os.close(w)
        a.close()
        b.close()
        fake.unlink()


def test_wrong_fds(child: FilteredChild, fhmon: Service, world: World,
                   record: Recorder) -> None:
    share = str(world.main)
    me = os.getpid()
    for count in (0, 2, 10):
        fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(count)]
        try:
            check_refusal(record, f"HELLO with {count} fds",
                          send_raw(fhmon.socket, hello(share, me), fds), errno.EINVAL,
                          "exactly one fd")
        finally:
            for fd in fds:
                os.close(fd)
    fds = [os.dup(child.listener) for _ in range(20)]
    try:
        check_refusal(record, "HELLO with 20 copies of a real listener (over the 16 fds "
                      "fhmon receives per message)",
                      send_raw(fhmon.socket, hello(share, child.pid), fds), errno.EINVAL,
                      "more than 16 fds")
    finally:
        for fd in fds:
            os.close(fd)
    with not_listeners(world) as others:
        for name, fd in others.items():
            check_refusal(record, f"HELLO with {name} instead of a listener",
                          send_raw(fhmon.socket, hello(share, me), [fd]), errno.EINVAL,
                          "not a seccomp listener")
    check_refusal(record, "a real listener with target pid 0",
                  send_raw(fhmon.socket, hello(share, 0), [child.listener]), errno.EINVAL,
                  "invalid target pid")
    check_refusal(record, "a real listener with a pid that does not exist",
                  send_raw(fhmon.socket, hello(share, 2**22 + 7), [child.listener]),
                  errno.ESRCH, "not found")


def test_listener_registered_twice(child: FilteredChild, fhmon: Service, world: World,
                                   record: Recorder) -> None:
    share = str(world.main)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(fhmon.socket)
        sock.sendmsg([hello(share, child.pid)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                  array.array("i", [child.listener]))])
        assert isinstance(answer(sock.recv(65536)), intake_wire.Accept)
        dup = os.dup(child.listener)
        try:
            check_refusal(record, "a listener already registered (a dup, new connection)",
                          send_raw(fhmon.socket, hello(share, child.pid), [dup]), errno.EEXIST,
                          "already registered")
            other = filtered_child()
            try:
                sock.sendmsg([hello(share, other.pid)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                          array.array("i", [other.listener]))])
                reply = answer(sock.recv(65536))
                sock.sendall(intake_wire.encode(intake_wire.Ping()))
                pong = answer(sock.recv(65536))
                registered = other.pid in [t["pid"] for t in fhmon.status()["targets"]]
                record(REGISTRATION, "a second HELLO (another listener) on an accepted "
                       "connection", "REFUSE EALREADY, its fd closed; the next PING answered",
                       "REGISTERED" if registered else
                       f"{shown(reply)}; then {shown(pong)}",
                       ok=not registered and isinstance(reply, intake_wire.Refuse)
                       and reply.errno == errno.EALREADY and isinstance(pong, intake_wire.Pong))
            finally:
                other.close()
        finally:
            os.close(dup)
    child.close()  # the filter has no task left: POLLHUP frees the listener
    assert wait_for(lambda: child.pid not in [t["pid"] for t in fhmon.status()["targets"]])


# --- OCI listenerPath: a hostile container runtime --------------------------------------------

def oci_state(pid: int, metadata: str, fds: list[str] | None = None,
              **extra: Any) -> dict[str, Any]:
    return {"ociVersion": "1.0.2", "fds": fds or ["seccompFd"], "pid": pid,
            "metadata": metadata, "state": {"ociVersion": "1.0.2", "id": "adv", "pid": pid,
                                            "status": "creating", "bundle": "/x"}, **extra}


def test_hostile_runtime(child: FilteredChild, fhmon: Service, world: World,
                         share_traps: dict[str, str], record: Recorder) -> None:
    pid = child.pid
    cases: list[tuple[str, bytes, str]] = [
        ("share outside --allow", json.dumps(oci_state(pid, f"share={world.outside}")).encode(),
         "allow-list"),
        ("metadata without share=", json.dumps(oci_state(pid, "tenant=x")).encode(),
         "no share"),
        ("a relative share", json.dumps(oci_state(pid, "share=shares/main")).encode(),
         "absolute"),
        ("a symlinked share", json.dumps(oci_state(pid, f"share={share_traps['link']}"))
         .encode(), "symlink"),
        ("share= given twice", json.dumps(oci_state(
            pid, f"share={world.main};share={world.outside}")).encode(), "twice"),
        ("fds naming two fds, one attached", json.dumps(oci_state(
            pid, f"share={world.main}", ["seccompFd", "pidFd"])).encode(), "arrived"),
        ("seccompFd named twice", json.dumps(oci_state(
            pid, f"share={world.main}", ["seccompFd", "seccompFd"])).encode(), "exactly once"),
        ("state.pid disagreeing with pid", json.dumps(
            {**oci_state(pid, f"share={world.main}"), "state": {"pid": 1}}).encode(),
         "disagrees"),
        ("a state over 64 KiB", json.dumps(oci_state(pid, f"share={world.main}",
                                                     pad="x" * 70000)).encode(), "exceeds"),
        ("not JSON after the brace", b"{garbage", "not valid JSON"),
        ("an HTTP request", b"GET / HTTP/1.1\r\n\r\n", "not a JSON object"),
    ]
    for what, payload, words in cases:
        before = len(fhmon.events())
        reply = send_raw(fhmon.socket, payload, [child.listener], close_write=True)
        reasons = [str(e.get("reason", "")) for e in fhmon.events()[before:]
                   if e.get("event") == "registration_refused"]
        registered = child.pid in [t["pid"] for t in fhmon.status()["targets"]]
        ok = not reply and not registered and any(words in r for r in reasons)
        record(REGISTRATION, f"OCI runtime: {what}",
               f"no registration; audit: '{words}'",
               "REGISTERED" if registered else
               f"no registration; audit: '{reasons[0][:80] if reasons else 'nothing'}'", ok=ok)


# --- unprivileged peers ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def open_fhmon(world: World) -> Iterator[Service]:
    """An instance whose socket uid 65534 may use (group 65534), with a 0.5 s intake timeout."""
    config = world.base / "adv-open.toml"
    config.write_text('registration_timeout = 0.5\nsocket_mode = "0660"\n'
                      f'socket_group = {NOBODY}\n')
    private = world.shares / "adv_private"
    private.mkdir(mode=0o700, exist_ok=True)
    try:
        with Service(world.base, [str(world.shares / "*")], name="adv-open",
                     extra=["--config", str(config)]) as service:
            os.chmod(service.dir, 0o755)
            yield service
    finally:
        private.rmdir()


def hostile(runner: Runner, *args: str, pass_fds: tuple[int, ...] = ()) -> dict[str, Any]:
    argv = [*runner.python, "-m", "tests.adversarial.hostile_client", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/",
                          env=runner.env, pass_fds=pass_fds, **run_as_nobody())
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def record_told(record: Recorder, what: str, result: dict[str, Any], err: int,
                words: str) -> None:
    ok = result["kind"] == "refuse" and result["errno"] == err and words in result["reason"]
    record(REGISTRATION, what, f"REFUSE {errname(err)} ('{words}')", told(result), ok=ok)


def told(result: dict[str, Any]) -> str:
    if result["kind"] == "refuse":
        return f"REFUSE {errname(result['errno'])}: {result['reason'][:90]}"
    if result["kind"] == "connect_error":
        return f"connect: {errname(result['errno'])}"
    return str(result["kind"]).upper()


def test_unprivileged_peer_on_the_default_socket(fhmon: Service, world: World,
                                                 unprivileged: Runner,
                                                 record: Recorder) -> None:
    result = hostile(unprivileged, fhmon.socket, str(world.main), "child")
    record(REGISTRATION, "uid 65534 connects to the default socket (root's, 0600)",
           "connect: EACCES", told(result))


def test_unprivileged_peers(open_fhmon: Service, world: World, unprivileged: Runner,
                            record: Recorder) -> None:
    baseline = Baseline(open_fhmon)
    sock, main = open_fhmon.socket, str(world.main)
    record(REGISTRATION, "uid 65534 registers its own process for an allowed share it can "
           "read (control)", "ACCEPT", told(hostile(unprivileged, sock, main, "child")))
    result = hostile(unprivileged, sock, str(world.shares / "adv_private"), "child")
    record_told(record, "uid 65534: an allowed share it cannot read (root's 0700)", result,
                errno.EACCES, "Permission denied")
    root_child = filtered_child(uid=0)
    try:
        fd = os.dup(root_child.listener)
        try:
            result = hostile(unprivileged, sock, main, str(root_child.pid), str(fd),
                             pass_fds=(fd,))
            record_told(record, "uid 65534 passes a root process's listener, naming that "
                        "process", result, errno.EPERM, "does not belong")
        finally:
            os.close(fd)
    finally:
        root_child.close()
    assert not baseline.settle()


def test_unprivileged_peer_in_its_own_namespaces_cannot_widen_the_allow_list(
        open_fhmon: Service, world: World, unprivileged: Runner, record: Recorder) -> None:
    """Root of its own user+mount namespace, it bind-mounts a host dir over the share's path:
    the allow-list compares the real directory (by inode), not the path it is shown at."""
    script = (f"mount --bind {world.outside} {world.main} && exec "
              + " ".join([*unprivileged.python, "-m", "tests.adversarial.hostile_client",
                          open_fhmon.socket, str(world.main), "child"]))
    result = _run_in_namespaces(unprivileged, script)
    record_told(record, "uid 65534 in its own user+mount namespace, the share's path "
                "bind-mounted over with a host dir", result, errno.EACCES, "allow-list")


def _run_in_namespaces(runner: Runner, script: str) -> dict[str, Any]:
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True,
                          text=True, timeout=60, cwd="/", env=runner.env, **run_as_nobody())
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


FOREIGN_LISTENER_BUG = (
    "BUG: the ownership check (docs/protocol.md: the target pid must belong to the client's "
    "uid) is made on the pid the client names, and nothing ties the listener to that pid: "
    "uid 65534 holding a root process's listener registers it by naming its own pid. Low "
    "impact (the calls are still served with the caller's own credentials, inside a share the "
    "client can read, and holding the listener already lets the client answer those calls), "
    "but it breaks the stated policy")
FOREIGN_LISTENER_TITLE = "A client registers another process's listener under its own pid"
FOREIGN_LISTENER_FIX = (
    "the kernel cannot map a listener to its task, so check every call instead: unless the "
    "registering peer is root, answer ENOSYS (and audit) when the calling thread's real uid "
    "is not the peer's uid (monitor/server.py _answer, with the peer kept in Target).")


@pytest.mark.finding(FOREIGN_LISTENER_TITLE, FOREIGN_LISTENER_FIX)
def test_unprivileged_peer_with_a_foreign_listener_naming_itself(
        open_fhmon: Service, world: World, unprivileged: Runner, record: Recorder) -> None:
    root_child = filtered_child(uid=0)
    try:
        fd = os.dup(root_child.listener)
        try:
            result = hostile(unprivileged, open_fhmon.socket, str(world.main), "self", str(fd),
                             pass_fds=(fd,))
        finally:
            os.close(fd)
        record_told(record, "uid 65534 passes a root process's listener, naming its own pid",
                    result, errno.EPERM, "does not belong")
    finally:
        root_child.close()


USERNS_CLIENT_BUG = (
    "BUG: pin_share runs with the registering client's credentials read from "
    "/proc/PID/status, whose CapEff is relative to the client's user namespace: a uid-65534 "
    "client that ran `unshare -Ur` is treated as holding CAP_DAC_READ_SEARCH on the host and "
    "registers an allowed share it cannot read itself")
USERNS_CLIENT_TITLE = "A client in its own user namespace registers a share it cannot read"
USERNS_CLIENT_FIX = (
    "ignore the peer's capabilities unless its user namespace is fhmon's own (compare "
    "/proc/PID/ns/user), in monitor/registration.py check_registration / "
    "monitor/proc_status.py read_status.")


@pytest.mark.finding(USERNS_CLIENT_TITLE, USERNS_CLIENT_FIX)
def test_unprivileged_peer_in_a_user_namespace_cannot_reach_more(
        open_fhmon: Service, world: World, unprivileged: Runner, record: Recorder) -> None:
    script = " ".join(["exec", *unprivileged.python, "-m", "tests.adversarial.hostile_client",
                       open_fhmon.socket, str(world.shares / "adv_private"), "child"])
    result = _run_in_namespaces(unprivileged, script)
    record_told(record, "uid 65534 in its own user namespace: an allowed share it cannot "
                "read (root's 0700)", result, errno.EACCES, "Permission denied")


def refusal_text(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.startswith("fhmon serve:")]
    return lines[-1].removeprefix("fhmon serve: ") if lines else str(exc)[-90:]


def test_socket_permissions_that_would_open_fhmon_to_everyone(world: World,
                                                              record: Recorder) -> None:
    config = world.base / "adv-world.toml"
    config.write_text('socket_mode = "0666"\n')
    with pytest.raises(RuntimeError) as refused:
        Service(world.base, [str(world.shares / "*")], name="adv-world",
                extra=["--config", str(config)])
    record(REGISTRATION, "configuration with a world-accessible socket (0666)",
           "fhmon refuses to start", f"fhmon refuses to start: {refusal_text(refused.value)}",
           ok="lets any local user connect" in str(refused.value))
    loose = world.base / "adv-loose"
    (loose / "sockdir").mkdir(parents=True)
    (loose / "sockdir").chmod(0o777)  # the socket's own directory, writable by anyone
    try:
        with pytest.raises(RuntimeError) as refused:
            Service(loose, [str(world.shares / "*")], name="sockdir")
        socket_made = (loose / "sockdir" / "fhmon.sock").exists()
    finally:
        shutil.rmtree(loose, ignore_errors=True)
    record(REGISTRATION, "socket directory writable by others", "fhmon refuses to start",
           f"fhmon refuses to start: {refusal_text(refused.value)}", ok=not socket_made)


# --- slow and many clients ---------------------------------------------------------------------

def test_slow_loris(open_fhmon: Service, world: World, record: Recorder) -> None:
    baseline = Baseline(open_fhmon)
    start = time.monotonic()
    silent = [socket.socket(socket.AF_UNIX) for _ in range(50)]
    for s in silent:
        s.connect(open_fhmon.socket)
        s.settimeout(5)
    closed = 0
    for s in silent:
        with contextlib.suppress(OSError):
            if s.recv(1) == b"":
                closed += 1
        s.close()
    took = time.monotonic() - start
    record(REGISTRATION, "50 clients that connect and send nothing (registration_timeout "
           "0.5 s)", "all closed by fhmon within 3 s",
           f"{closed} closed by fhmon in {took:.1f} s", ok=closed == 50 and took < 3)
    data = hello(str(world.main), os.getpid())
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(open_fhmon.socket)
        start = time.monotonic()
        sent = 0
        with contextlib.suppress(OSError):
            for byte in data:
                s.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.1)
        s.settimeout(5)
        with contextlib.suppress(OSError):
            s.recv(1)
        took = time.monotonic() - start
    record(REGISTRATION, "a client dribbling a HELLO one byte every 100 ms",
           "cut off at the registration timeout", f"cut off after {sent} bytes, {took:.1f} s",
           ok=sent < len(data) and took < 3)
    assert not baseline.settle()


def raise_fd_limit(need: int) -> None:
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))


def open_connections(path: str, count: int) -> list[socket.socket]:
    conns = []
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)  # blocking: waits while fhmon's accept backlog (128) is full
        conns.append(s)
    return conns


def test_a_thousand_concurrent_connections(fhmon: Service, spawn: Any, record: Recorder) -> None:
    raise_fd_limit(4096)
    conns = open_connections(fhmon.socket, 1000)
    try:
        time.sleep(1)
        held = fhmon.fd_count()
        start = time.monotonic()
        agent = spawn()
        n2h = agent.call("n2h", path="dir/inner")["errno"]
        took = time.monotonic() - start
        record(REGISTRATION, "1,000 idle connections held open: a new target registers and "
               "is served", "registered and served",
               f"{'registered and served' if n2h == 0 else errname(n2h)} in {took:.1f} s "
               f"(fhmon holding {held} fds)", ok=n2h == 0)
    finally:
        for s in conns:
            s.close()


def dropped_lines(fhmon: Service) -> tuple[int, int]:
    """(connection_dropped lines, connections they account for: 1 a line, `count` a
    summary line of those held back)."""
    lines = [e for e in fhmon.events() if e.get("event") == "connection_dropped"]
    return len(lines), sum(int(e["count"]) if e.get("summary") else 1 for e in lines)


def test_more_connections_than_the_cap(fhmon: Service, record: Recorder,
                                       bystander: Any) -> None:
    """The excess is closed at once and counted; each refused client writes 20 lines, then
    a summary a second (a client that reconnects as soon as it is refused must not cost
    fhmon a log line each time)."""
    raise_fd_limit(4096)
    lines_before, before = dropped_lines(fhmon)
    counted_before = fhmon.status()["registrations"].get("dropped", 0)
    conns = open_connections(fhmon.socket, 1100)
    try:
        time.sleep(0.5)
        problems = bystander.check()
    finally:
        for s in conns:
            s.close()
    # asked once the connections are gone (fhmon status is one of root's connections too)
    time.sleep(0.2)
    counted = fhmon.status()["registrations"].get("dropped", 0) - counted_before
    wait_until(lambda: dropped_lines(fhmon)[1] - before >= counted, timeout=5)
    lines, accounted = (n - m for n, m in zip(dropped_lines(fhmon), (lines_before, before),
                                              strict=True))
    record(REGISTRATION, "1,100 connections, over max_connections (1,024)",
           "the excess closed at once and counted; registered targets served meanwhile; "
           "the log bounded",
           f"{counted} closed at once, {accounted} in {lines} log lines; registered "
           f"target: {problems or 'served'}",
           ok=counted >= 1100 - 1024 and accounted == counted and lines <= 25
           and not problems)

