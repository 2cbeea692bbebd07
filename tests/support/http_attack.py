"""Attacks on fhmon's HTTP endpoints that the adversarial suite and bench/http_load share:
connections held open (slowloris, flood, silent TLS clients) and floods of large
AdmissionReviews, from threads, on loopback. An attack can come from another loopback
address (127.0.0.2, ...) than the client it must not starve, as an attacker's pod has
another address than the kubelet or the API server."""

from __future__ import annotations

import contextlib
import resource
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

from tests.support.world import ready


def raise_nofile(need: int) -> None:
    """Let this (test) process hold `need` fds: an attacker holding 1,000 connections needs
    1,000 fds of its own, beyond the soft limit's usual 1,024. Only the soft limit is
    raised, never past the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        wanted = need if hard == resource.RLIM_INFINITY else min(hard, need)
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert soft == resource.RLIM_INFINITY or soft >= need, (soft, hard, need)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Attacker:
    """Holds `count` connections open to a port in a thread; `trickle`: each sends one more
    byte of a never-ending request head every `interval` (slowloris). Connections fhmon
    closes are opened again."""

    port: int
    count: int
    trickle: bool
    interval: float = 0.2
    source: str = "127.0.0.1"
    # Several addresses, taken in turn (a distributed attack: each address holds its own
    # share of the server's per-address cap).
    sources: tuple[str, ...] = ()
    opened: int = 0
    timeouts: int = 0  # connections fhmon answered with 408
    dropped: int = 0  # connections fhmon closed without an answer
    stop: threading.Event = field(default_factory=threading.Event)
    holding: int = 0
    # what ended run() other than stop: a test asserts it is None, so that an attack that
    # died early (select() refused an fd above 1,023 once) cannot pass as one withstood
    error: BaseException | None = None

    def run(self) -> None:
        try:
            self._hold()
        except BaseException as exc:
            self.error = exc
            raise

    def check(self) -> None:
        """Raise if the attack ended before it was stopped."""
        if self.error is not None:
            raise AssertionError(f"the attack ended early: {self.error!r}") from self.error

    def _hold(self) -> None:
        head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "
        socks: dict[socket.socket, int] = {}
        try:
            while not self.stop.is_set():
                while len(socks) < self.count and not self.stop.is_set():
                    s = socket.socket()
                    s.settimeout(0.5)
                    try:
                        s.bind((self.sources[self.opened % len(self.sources)]
                                if self.sources else self.source, 0))
                        s.connect(("127.0.0.1", self.port))
                    except OSError:
                        s.close()
                        break
                    s.setblocking(False)
                    socks[s] = 0
                    self.opened += 1
                self.holding = len(socks)
                for s in ready(list(socks), self.interval):
                    try:
                        data = s.recv(4096)
                    except OSError:
                        data = b""
                    if b" 408 " in data[:20]:
                        self.timeouts += 1
                    elif not data:
                        self.dropped += 1
                    del socks[s]
                    s.close()
                if self.trickle:
                    for s, sent in list(socks.items()):
                        byte = head[sent:sent + 1] or b"a"
                        try:
                            s.send(byte)
                            socks[s] = sent + 1
                        except OSError:
                            del socks[s]
                            s.close()
        finally:
            for s in socks:
                s.close()


def tls_client_context() -> ssl.SSLContext:
    """An attacker does not check the server's certificate."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def post_request(path: str, body: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % (path.encode(), len(body))
            + body)


@dataclass
class ReviewFlood:
    """`connections` threads that each POST `body` over TLS from `source`, again and again;
    with `read_answers` False they never read the answer (they close after `hold` seconds
    or when the server closes)."""

    port: int
    body: bytes
    connections: int
    source: str = "127.0.0.2"
    read_answers: bool = True
    hold: float = 3.0
    path: str = "/mutate"
    sent: int = 0
    failed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        request = post_request(self.path, self.body)
        for _ in range(self.connections):
            thread = threading.Thread(target=self._loop, args=(request,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(15)

    def _loop(self, request: bytes) -> None:
        context = tls_client_context()
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=10,
                                              source_address=(self.source, 0)) as raw, \
                        context.wrap_socket(raw) as tls:
                    tls.sendall(request)
                    self.sent += 1
                    if self.read_answers:
                        answer = bytearray()
                        while chunk := tls.recv(65536):
                            answer += chunk
                        status = bytes(answer[9:12]).decode(errors="replace") or "closed"
                        self.statuses[status] = self.statuses.get(status, 0) + 1
                    else:
                        deadline = time.monotonic() + self.hold
                        raw.settimeout(0.2)
                        while time.monotonic() < deadline and not self.stop.is_set():
                            with contextlib.suppress(TimeoutError):
                                if ready([raw], 0.2) and not raw.recv(1, socket.MSG_PEEK):
                                    break
            except (OSError, ssl.SSLError):
                self.failed += 1
                time.sleep(0.05)
