"""Attacks on fhmon's HTTP endpoint that the adversarial suite and bench/http_load share:
connections held open (slowloris or flood) from a thread, on a free loopback port."""

from __future__ import annotations

import select
import socket
import threading
from dataclasses import dataclass, field


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
    opened: int = 0
    timeouts: int = 0  # connections fhmon answered with 408
    dropped: int = 0  # connections fhmon closed without an answer
    stop: threading.Event = field(default_factory=threading.Event)
    holding: int = 0

    def run(self) -> None:
        head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "
        socks: dict[socket.socket, int] = {}
        try:
            while not self.stop.is_set():
                while len(socks) < self.count and not self.stop.is_set():
                    s = socket.socket()
                    s.settimeout(0.5)
                    try:
                        s.connect(("127.0.0.1", self.port))
                    except OSError:
                        s.close()
                        break
                    s.setblocking(False)
                    socks[s] = 0
                    self.opened += 1
                self.holding = len(socks)
                readable, _, _ = select.select(list(socks), [], [], self.interval)
                for s in readable:
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
