"""Prometheus metrics, served by a tiny trio HTTP endpoint (no threads).

prometheus-client gives the exposition format and the metric types; its own HTTP server
runs in a thread, so fhmon serves `GET /metrics` itself from its trio nursery.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from monitor import log
from monitor.handlers.base import CallContext
from protocol import worker as wire

if TYPE_CHECKING:
    from monitor.server import Service

# Calls take microseconds; buckets from 5 us to 50 ms.
LATENCY_BUCKETS = (5e-6, 1e-5, 2e-5, 3e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4,
                   1e-3, 2e-3, 5e-3, 1e-2, 5e-2)
MAX_REQUEST = 8192


class Metrics:
    def __init__(self, service: Service) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter("fhmon_calls", "Emulated calls by syscall and result (errno name)",
                             ["syscall", "result"], registry=r)
        self.latency = Histogram("fhmon_call_duration_seconds",
                                 "Time fhmon spends on one call, receive to answer",
                                 ["syscall"], buckets=LATENCY_BUCKETS, registry=r)
        self.mac_failures = Counter("fhmon_mac_failures",
                                    "Handles refused because their MAC did not verify",
                                    registry=r)
        self.refusals = Counter("fhmon_confinement_refusals",
                                "Calls refused on policy, by reason", ["reason"], registry=r)
        self.registrations = Counter("fhmon_registrations", "Registrations by outcome",
                                     ["outcome"], registry=r)
        targets = Gauge("fhmon_targets", "Registered listeners", registry=r)
        targets.set_function(lambda: len(service.targets))
        fds = Gauge("fhmon_open_fds", "fhmon's own open file descriptors", registry=r)
        fds.set_function(lambda: len(os.listdir("/proc/self/fd")))
        keys = Gauge("fhmon_keys", "Keys loaded (all verify, one signs)", registry=r)
        keys.set_function(lambda: len(service.keys.key_ids))
        key_ok = Gauge("fhmon_key_dir_healthy", "1 if the last key dir load succeeded",
                       registry=r)
        key_ok.set_function(lambda: 0 if service.key_error else 1)
        self._call_counters: dict[tuple[str, str], Counter] = {}
        self._histograms: dict[str, Histogram] = {}

    def observe(self, syscall: str, result: str, seconds: float, ctx: CallContext) -> None:
        self._counter(syscall, result).inc()
        self._histogram(syscall).observe(seconds)
        if ctx.note:
            self._refused(ctx.note, 1)

    def merge(self, report: wire.Report) -> None:
        """What a worker process answered since its last report."""
        for (syscall, result), count in report.results.items():
            self._counter(syscall, result).inc(count)
        for syscall, seconds in report.samples:
            self._histogram(syscall).observe(seconds)
        for note, count in report.refusals.items():
            self._refused(note, count)

    # The labelled children, found once: .labels() validates and locks on every call.
    def _counter(self, syscall: str, result: str) -> Counter:
        counter = self._call_counters.get((syscall, result))
        if counter is None:
            counter = self._call_counters[(syscall, result)] = self.calls.labels(syscall, result)
        return counter

    def _histogram(self, syscall: str) -> Histogram:
        histogram = self._histograms.get(syscall)
        if histogram is None:
            histogram = self._histograms[syscall] = self.latency.labels(syscall)
        return histogram

    def _refused(self, note: str, count: int) -> None:
        if note == "bad or foreign MAC":
            self.mac_failures.inc(count)
        self.refusals.labels(note).inc(count)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


async def serve_http(metrics: Metrics, address: str,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    host, _, port = address.rpartition(":")
    listeners = await trio.open_tcp_listeners(int(port), host=host.strip("[]") or None)
    log.event("metrics_serving", address=address)
    task_status.started()

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            with trio.move_on_after(5):
                request = b""
                while b"\r\n\r\n" not in request and len(request) < MAX_REQUEST:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return
                    request += chunk
                line = request.split(b"\r\n", 1)[0].split()
                if len(line) >= 2 and line[0] == b"GET" and line[1].split(b"?")[0] == b"/metrics":
                    body, status, ctype = metrics.exposition(), b"200 OK", CONTENT_TYPE_LATEST
                elif len(line) >= 2 and line[0] == b"GET" and line[1] == b"/healthz":
                    body, status, ctype = b"ok\n", b"200 OK", "text/plain"
                else:
                    body, status, ctype = b"not found\n", b"404 Not Found", "text/plain"
                await stream.send_all(b"HTTP/1.1 " + status + b"\r\nContent-Type: "
                                      + ctype.encode() + b"\r\nContent-Length: "
                                      + str(len(body)).encode()
                                      + b"\r\nConnection: close\r\n\r\n" + body)

    await trio.serve_listeners(handle, listeners)
