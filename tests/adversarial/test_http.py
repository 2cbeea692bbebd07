"""The metrics/health HTTP endpoint under attack: garbage, resets, pipelining, slowloris,
connection floods at a low fd limit.

The endpoint is unauthenticated and, on a cluster, reachable from any pod that can reach the
node: nothing a client does there may stop fhmon, use up its fds, or leave a target's call
unanswered. Each scenario runs a private `fhmon serve --metrics-address` beside a registered
target whose calls must keep being answered.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import os
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from monitor import prom, seccomp_filter
from tests.adversarial.common import EXHAUSTION, FUZZING, errname, wait_for
from tests.adversarial.recording import Recorder
from tests.support import FHMON, NOBODY, Agent, Service, World
from tests.support.handles import N2HResult
from tests.support.http_attack import Attacker, free_port, raise_nofile
from tests.support.listeners import hello, send_raw

SLOW_CONNECTIONS = 150
FLOOD_CONNECTIONS = 300
LOW_FD_LIMIT = 128  # the HTTP cap becomes 128 // 4 = 32 connections
# Attacks on the global caps come from ten loopback addresses (the per-address cap would
# otherwise stop one address long before them).
ATTACK_ADDRESSES = tuple(f"127.0.1.{i}" for i in range(1, 11))


class LimitedService(Service):
    """`fhmon serve` started under `prlimit --nofile=N` (as systemd's LimitNOFILE= would)."""

    def __init__(self, *args: object, nofile: int | None = None, **kwargs: object) -> None:
        self.nofile = nofile
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def start(self) -> None:
        if self.nofile is not None and self.argv[0] != "prlimit":
            self.argv = ["prlimit", f"--nofile={self.nofile}:{self.nofile}", "--", *self.argv]
        super().start()


@dataclass
class Endpoint:
    service: Service
    port: int
    agent: Agent
    handle: tuple[int, bytes] = (0, b"")

    def scrape(self, path: str = "/metrics") -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return int(r.status)

    def calls_answered(self) -> str:
        """One lookup and one open by handle, each answered within 10 s (else "HUNG")."""
        try:
            n2h = N2HResult.of(self.agent.call("n2h", path="file", answer_within=10))
            obh = self.agent.call("obh", handle_type=self.handle[0],
                                  f_handle=self.handle[1].hex(), answer_within=10)
        except TimeoutError:
            return "HUNG"
        return "answered" if n2h.errno == 0 and obh["errno"] == 0 else f"{n2h.errno}/{obh}"


def endpoint(world: World, name: str, nofile: int | None = None) -> Iterator[Endpoint]:
    port = free_port()
    service = LimitedService(world.base, [str(world.shares / "*")], name=name, nofile=nofile,
                             extra=["--metrics-address", f"127.0.0.1:{port}"])
    agent = Agent(world, "fhmon", world.main, service.socket)
    try:
        h = N2HResult.of(agent.call("n2h", path="file"))
        assert h.errno == 0
        ready = Endpoint(service, port, agent, (int(h.handle_type or 0), h.f_handle))
        assert ready.calls_answered() == "answered"  # and fhmon's caches warm (fd baseline)
        yield ready
    finally:
        agent.close()
        code = service.stop()
        assert code == 0, service.log_text()[-4000:]


@pytest.fixture
def metrics_endpoint(world: World) -> Iterator[Endpoint]:
    yield from endpoint(world, "adv-http")


@pytest.fixture
def small_endpoint(world: World) -> Iterator[Endpoint]:
    yield from endpoint(world, "adv-http-small", nofile=LOW_FD_LIMIT)


def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data`, half-close, and read until fhmon closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(OSError):
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        out = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                out += chunk
        return out


def status_of(answer: bytes) -> str:
    """"HTTP 400" for an answer, "closed" for none."""
    parts = answer.split(b" ", 2)
    return f"HTTP {parts[1].decode()}" if len(parts) > 1 else "closed"


def reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
TLS_CLIENT_HELLO = bytes.fromhex("16030100a5010000a10303") + b"\x00" * 32 + b"\x00\x00\x02\x13\x01"


def test_garbage_and_protocol_abuse_get_http_errors(metrics_endpoint: Endpoint,
                                                    record: Recorder) -> None:
    port = metrics_endpoint.port
    garbage = [
        bytes(range(256)) * 4 + b"\r\n\r\n",
        b"\x00" * 4096 + b"\r\n\r\n",
        TLS_CLIENT_HELLO,
        b"GET /metrics\r\n\r\n",  # HTTP/0.9 style
        b"GET /metrics FTP/1.0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n\r\n",  # no Host
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nHost: y\r\nContent-Length: 1\r\n"
        b"Content-Length: 2\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked, gzip\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHo st: x\r\n\r\n",
        b"GET /met rics HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: te",  # EOF mid-head
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost : x\r\n\r\n",
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: +0\r\n\r\n",
        # request smuggling: both framings (h11 alone would take the chunked one)
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    record.every(FUZZING, "metrics endpoint: malformed HTTP requests (binary, TLS on the plain "
                 "port, HTTP/0.9, bad framing, bad headers, NUL, both Content-Length and "
                 "Transfer-Encoding, EOF mid-head)", "HTTP 400",
                 [status_of(exchange(port, g)) for g in garbage])
    huge = [b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: " + b"a" * n + b"\r\n\r\n"
            for n in (9000, 20000, 70000)]
    huge.append(b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    huge.append(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 3000 + b"\r\n")
    record.every(FUZZING, "metrics endpoint: request heads over 8 KiB (one header, the "
                 "target, many headers)", "HTTP 431",
                 [status_of(exchange(port, h)) for h in huge])
    bodies = [b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n",
              b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
              b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"ffffffff\r\n" + b"a" * 1000]
    record.every(FUZZING, "metrics endpoint: request bodies (the endpoint takes none)",
                 "HTTP 413", [status_of(exchange(port, b)) for b in bodies])
    record(FUZZING, "metrics endpoint: an unknown path", "HTTP 404",
           status_of(exchange(port, b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n")))
    record.every(FUZZING, "metrics endpoint: another method on /metrics and /healthz",
                 "HTTP 405", [status_of(exchange(port, m + b" " + p + b" HTTP/1.1\r\nHost: x"
                                                 b"\r\nContent-Length: 0\r\n\r\n"))
                              for m in (b"POST", b"PUT", b"DELETE", b"TRACE", b"CONNECT")
                              for p in (b"/metrics", b"/healthz")])
    pipelined = exchange(port, (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + GET) * 50)
    answers = pipelined.count(b"HTTP/1.1 200 OK\r\n")
    order = [pipelined.find(b"ok\n"), pipelined.find(b"# HELP")]
    record(FUZZING, "metrics endpoint: 100 pipelined requests on one connection",
           "100 answers, in order", f"{answers} answers, "
           f"{'in order' if 0 <= order[0] < order[1] else 'OUT OF ORDER'}")
    record(FUZZING, "metrics endpoint after all of the above", "fhmon alive, scrape 200, "
           "target's calls answered",
           f"fhmon {'alive' if metrics_endpoint.service.proc.poll() is None else 'EXITED'}, "  # type: ignore[union-attr]
           f"scrape {metrics_endpoint.scrape()}, target's calls "
           f"{metrics_endpoint.calls_answered()}",
           ok=metrics_endpoint.service.proc.poll() is None  # type: ignore[union-attr]
           and metrics_endpoint.calls_answered() == "answered")


def test_resets_and_half_closes_at_every_point(metrics_endpoint: Endpoint,
                                               record: Recorder) -> None:
    port = metrics_endpoint.port
    outcomes = []
    for n in range(40):
        s = socket.create_connection(("127.0.0.1", port))
        if n % 4 == 1:
            s.sendall(GET[: n % len(GET)])
        elif n % 4 == 2:
            s.sendall(GET * 20)  # pipelined, reset while fhmon answers
        elif n % 4 == 3:
            s.sendall(GET)
            s.recv(1)
            s.shutdown(socket.SHUT_RD)  # half-closed the other way, then reset
        reset(s)
        outcomes.append("fhmon alive" if metrics_endpoint.service.proc.poll() is None  # type: ignore[union-attr]
                        else "EXITED")
    for _ in range(10):  # the client half-closes after its request: answered, then closed
        outcomes.append("fhmon alive" if status_of(exchange(port, GET)) == "HTTP 200"
                        else "no answer to a half-closed request")
    record.every(FUZZING, "metrics endpoint: RSTs before, during and after requests, "
                 "pipelined requests reset mid-answer, half-closed sockets", "fhmon alive",
                 outcomes)
    record(FUZZING, "metrics endpoint after resets", "scrape 200, target's calls answered",
           f"scrape {metrics_endpoint.scrape()}, target's calls "
           f"{metrics_endpoint.calls_answered()}")


@contextlib.contextmanager
def attacking(attacker: Attacker) -> Iterator[Attacker]:
    thread = threading.Thread(target=attacker.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: attacker.holding >= min(attacker.count, 100), 20), attacker
        yield attacker
        attacker.check()  # it attacked all along, to the end of the test
        assert thread.is_alive(), attacker
    finally:
        attacker.stop.set()
        thread.join(10)


def test_slowloris_neither_holds_fds_nor_delays_calls(metrics_endpoint: Endpoint,
                                                      record: Recorder) -> None:
    service = metrics_endpoint.service
    baseline = service.fd_count()
    most = 0
    answers = []
    # From ten addresses, all admitted (the cap is 512): each must send its request within
    # 5 s.
    with attacking(Attacker(metrics_endpoint.port, SLOW_CONNECTIONS, trickle=True,
                            sources=ATTACK_ADDRESSES)) as attack:
        deadline = time.monotonic() + 8  # past the 5 s request timeout
        while time.monotonic() < deadline:
            answers.append(metrics_endpoint.calls_answered())
            most = max(most, service.fd_count())
            time.sleep(0.2)
    record.every(EXHAUSTION, f"metrics endpoint: {SLOW_CONNECTIONS} slowloris connections "
                 "(one byte of a request head every 0.2 s, reopened when closed) while a "
                 "target calls", "answered", answers)
    record(EXHAUSTION, "metrics endpoint: fds fhmon holds during the slowloris",
           f"at most baseline + {SLOW_CONNECTIONS} (all of them, within the cap of "
           f"{prom.LIMITS.max_connections}) + 8; slow requests get 408",
           f"baseline {baseline}, at most {most}; {attack.timeouts} connections got 408 "
           f"after the 5 s request timeout ({attack.opened} opened)",
           ok=most <= baseline + SLOW_CONNECTIONS + 8 and attack.timeouts > 0)
    settled = wait_for(lambda: service.fd_count() <= baseline, 10)
    fds = service.fd_count()
    record(EXHAUSTION, "metrics endpoint once the slowloris stops",
           "fds back to baseline, scrape 200",
           f"fds {fds} (baseline {baseline}), scrape {metrics_endpoint.scrape()}",
           ok=settled and metrics_endpoint.scrape() == 200)


def test_connection_flood_at_a_low_fd_limit(small_endpoint: Endpoint,
                                            record: Recorder) -> None:
    service = small_endpoint.service
    baseline = service.fd_count()
    most = 0
    answers = []
    with attacking(Attacker(small_endpoint.port, FLOOD_CONNECTIONS, trickle=False,
                            interval=0.05, sources=ATTACK_ADDRESSES)) as attack:
        for _ in range(20):
            answers.append(small_endpoint.calls_answered())
            most = max(most, service.fd_count())
            time.sleep(0.1)
    record.every(EXHAUSTION, f"metrics endpoint: {FLOOD_CONNECTIONS} idle connections, "
                 f"reopened as fast as fhmon closes them, with fhmon's fd limit at "
                 f"{LOW_FD_LIMIT}, while a target calls", "answered", answers)
    record(EXHAUSTION, f"metrics endpoint: fds fhmon holds during the flood (limit "
           f"{LOW_FD_LIMIT})", "at most baseline + 32 (a quarter of the limit) + 8",
           f"baseline {baseline}, at most {most}; {attack.opened} connections opened "
           f"(at the cap, the one that waited longest is closed for each newcomer)",
           ok=most <= baseline + LOW_FD_LIMIT // 4 + 8 and attack.opened >= FLOOD_CONNECTIONS)
    wait_for(lambda: service.fd_count() <= baseline, 10)
    record(EXHAUSTION, "metrics endpoint once the flood stops", "scrape 200, fhmon alive",
           f"scrape {small_endpoint.scrape()}, fhmon "
           f"{'alive' if service.proc.poll() is None else 'EXITED'}")  # type: ignore[union-attr]



PROBE_ATTACK_CONNECTIONS = 600
PROBE_TIMEOUT = 3.0  # a generous kubelet probe timeoutSeconds


def probe_within(port: int, path: str, timeout: float) -> str:
    """A kubelet-style HTTP probe from 127.0.0.1: "200" when answered in time."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            status = int(r.status)
    except OSError as exc:
        return f"unanswered ({type(exc).__name__} after {time.monotonic() - started:.1f} s)"
    took = time.monotonic() - started
    return str(status) if took <= timeout else f"{status} after {took:.1f} s"


def probe_through_slowloris(endpoint: Endpoint, source: str, paths: tuple[str, ...],
                            timeout: float) -> tuple[Attacker, list[str], str]:
    """Probe `paths` every 0.2 s for 8 s (past the 5 s request timeout) while
    PROBE_ATTACK_CONNECTIONS slowloris connections from `source` come and go; the attack,
    each probe's outcome and whether the target's calls were answered meanwhile."""
    probes: list[str] = []
    with attacking(Attacker(endpoint.port, PROBE_ATTACK_CONNECTIONS, trickle=True,
                            source=source)) as attack:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            probes.extend(probe_within(endpoint.port, path, timeout) for path in paths)
            time.sleep(0.2)
        calls = endpoint.calls_answered()
    return attack, probes, calls


def test_probes_answer_while_another_address_holds_slow_connections(
        metrics_endpoint: Endpoint, record: Recorder) -> None:
    """R7 (docs/threat-model.md): 600 slowloris connections to the metrics port once left
    /healthz unanswered for 5 s, long enough for a kubelet HTTP liveness probe to restart
    fhmon. The attacker's pod has another address than the kubelet: it holds its share of
    the slots."""
    attack, probes, calls = probe_through_slowloris(
        metrics_endpoint, "127.0.0.2", ("/healthz", "/readyz"), PROBE_TIMEOUT)
    record.every(EXHAUSTION, f"metrics endpoint: {PROBE_ATTACK_CONNECTIONS} slowloris "
                 f"connections from another address ({attack.opened} opened, "
                 f"{attack.dropped} closed unanswered to make room at the per-address "
                 f"cap): /healthz and /readyz within {PROBE_TIMEOUT:.0f} s", "200", probes)
    record(EXHAUSTION, "metrics endpoint: a target's calls during that attack", "answered",
           calls)

KUBELET_PROBE_TIMEOUT = 1.0  # the kubelet's default timeoutSeconds


def test_healthz_answers_within_a_second_while_its_own_address_holds_slow_connections(
        metrics_endpoint: Endpoint, record: Recorder) -> None:
    """Issue 37.1: 600 slowloris connections from the probe's own address (the node's
    address, which hostNetwork pods, the node's own processes and traffic SNATed to the node
    share with the kubelet), reopened as they close, left every /healthz closed without an
    answer (the address was at its cap): a kubelet HTTP liveness probe then restarts fhmon
    again and again. Every probe must be answered within the kubelet's default 1 s."""
    raise_nofile(PROBE_ATTACK_CONNECTIONS + 1024)
    attack, probes, calls = probe_through_slowloris(
        metrics_endpoint, "127.0.0.1", ("/healthz",), KUBELET_PROBE_TIMEOUT)
    record.every(EXHAUSTION, f"metrics endpoint: {PROBE_ATTACK_CONNECTIONS} slowloris "
                 f"connections from the probe's own address 127.0.0.1 ({attack.opened} "
                 f"opened, {attack.dropped} closed unanswered): /healthz within "
                 f"{KUBELET_PROBE_TIMEOUT:.0f} s", "200", probes)
    record(EXHAUSTION, "metrics endpoint: a target's calls during that attack", "answered",
           calls)


def test_the_daemonsets_probe_answers_while_many_addresses_hold_the_metrics_port(
        metrics_endpoint: Endpoint, record: Recorder) -> None:
    """R7 from attackers at many addresses: the per-address cap no longer helps, every metrics
    slot is taken. The DaemonSet's startup, readiness and liveness probes are
    `fhmon probe --socket` (deploy/base/daemonset.yaml) on fhmon's unix socket, a listener of
    its own: they must answer within the probes' timeoutSeconds while the port is full."""
    service = metrics_endpoint.service
    probes: list[str] = []
    with attacking(Attacker(metrics_endpoint.port, PROBE_ATTACK_CONNECTIONS, trickle=True,
                            sources=ATTACK_ADDRESSES)) as attack:
        deadline = time.monotonic() + 8  # past the 5 s request timeout
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                ran = subprocess.run([FHMON, "probe", "--socket", service.socket],
                                     capture_output=True, text=True, timeout=5)
                took = time.monotonic() - started
                probes.append("ok" if ran.returncode == 0 and took <= 5 else
                              f"exit {ran.returncode} after {took:.1f} s: {ran.stderr.strip()}")
            except subprocess.TimeoutExpired:
                probes.append("no answer within 5 s")
            time.sleep(0.2)
        scrape = probe_within(metrics_endpoint.port, "/healthz", 1.0)
    record.every(EXHAUSTION, f"`fhmon probe` (the DaemonSet's probes) while "
                 f"{PROBE_ATTACK_CONNECTIONS} slowloris connections from "
                 f"{len(ATTACK_ADDRESSES)} addresses hold the metrics port "
                 f"({attack.opened} opened; /healthz on the port meanwhile: {scrape})",
                 "ok", probes)


# --- metric cardinality: a filter of the client's own that traps any syscall number -------

SECCOMP_RET_ALLOW, SECCOMP_RET_USER_NOTIF = 0x7FFF0000, 0x7FC00000
AUDIT_ARCH_X86_64 = 0xC000003E
FIRST_FOREIGN_NR = 1000  # no syscall has this number or above (x32 ones have bit 30 set)


def foreign_filter() -> bytes:
    """A BPF program (not fhmon's) that sends every syscall number >= 1000 of the native
    arch to the listener, and allows the rest."""
    def op(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)
    return b"".join([
        op(0x20, 0, 0, 4),                             # A = seccomp_data.arch
        op(0x15, 0, 2, AUDIT_ARCH_X86_64),             # not native: allow
        op(0x20, 0, 0, 0),                             # A = seccomp_data.nr
        op(0x35, 1, 0, FIRST_FOREIGN_NR),              # nr >= 1000: notify
        op(0x06, 0, 0, SECCOMP_RET_ALLOW),
        op(0x06, 0, 0, SECCOMP_RET_USER_NOTIF),
    ])


def trap_many_syscalls(count: int, register: Callable[[int, int], bytes]) -> list[int]:
    """A child (uid 65534) installs foreign_filter(); `register(pid, listener)` hands its
    listener to fhmon; then the child calls `count` different syscall numbers and returns
    the errnos it got."""
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            parent.close()
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fd = seccomp_filter.install(foreign_filter())
            child.sendmsg([b"L"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    array.array("i", [fd]))])
            os.close(fd)
            child.recv(1)  # registered
            libc = ctypes.CDLL(None, use_errno=True)
            errnos = array.array("i")
            for nr in range(FIRST_FOREIGN_NR, FIRST_FOREIGN_NR + count):
                libc.syscall(ctypes.c_long(nr))
                errnos.append(ctypes.get_errno())
            child.sendall(errnos.tobytes())
        finally:
            os._exit(0)
    child.close()
    try:
        _, ancdata, _, _ = parent.recvmsg(16, socket.CMSG_SPACE(4))
        listener = array.array("i", ancdata[0][2][:4])[0]
        try:
            answer = register(pid, listener)
            assert b"accepted" in answer or answer, answer
        finally:
            os.close(listener)
        parent.sendall(b"G")
        parent.settimeout(60)
        data = b""
        while len(data) < 4 * count:
            chunk = parent.recv(1 << 16)
            if not chunk:
                break
            data += chunk
        return list(array.array("i", data))
    finally:
        parent.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def test_a_foreign_filter_cannot_create_metric_series(metrics_endpoint: Endpoint,
                                                      world: World, record: Recorder) -> None:
    """A client registers a listener of its own filter and traps 3,000 different syscall
    numbers: each is answered ENOSYS, and /metrics keeps its fixed set of series (they
    counted as 100,000 series, 9 MiB, before)."""
    port = metrics_endpoint.port

    def scrape_text() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return str(r.read().decode())

    def series() -> set[str]:
        return {line.rpartition(" ")[0] for line in scrape_text().splitlines()
                if line.startswith("fhmon_") and "_bucket{" not in line}

    before = series()
    count = 3000
    errnos = trap_many_syscalls(count, lambda pid, fd: send_raw(
        metrics_endpoint.service.socket, hello(str(world.main), pid), [fd]))
    record.every(EXHAUSTION, f"{count} different syscall numbers trapped by a filter of the "
                 "client's own, its listener registered with fhmon", "ENOSYS",
                 [errname(e) for e in errnos] or ["no answer"])
    text = scrape_text()
    after = series()
    new = sorted(after - before)
    fixed = ('syscall="other"', 'reason="syscall_not_emulated"')
    record(EXHAUSTION, f"/metrics after {count} different trapped syscall numbers",
           "at most 4 new series (syscall=\"other\", reason=\"syscall_not_emulated\")",
           f"{len(new)} new series, {len(text)} bytes: {', '.join(new)[:300]}",
           ok=len(new) <= 4 and all(any(f in line for f in fixed) for line in new)
           and len(text) < 64 * 1024)
    record(EXHAUSTION, "their count under the fixed labels", f"{count}",
           f"{metric_value(text, 'fhmon_confinement_refusals_total', 'syscall_not_emulated'):.0f}")


def metric_value(text: str, name: str, reason: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{reason="{reason}"}}'):
            return float(line.rpartition(" ")[2])
    return 0.0
