"""Prometheus metrics, served from fhmon's trio nursery (no threads).

prometheus-client gives the exposition format and the metric types; its own HTTP server
runs in a thread, so fhmon serves `GET /metrics` itself, through monitor/http/.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sized
from typing import Protocol

import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

from monitor import __version__, http
from monitor.config import Config
from monitor.labels import MAC_INVALID
from monitor.metrics import LATENCY_BUCKETS, CallStats
from monitor.signing import KeyInfo


class KeysSource(Protocol):
    @property
    def key_ids(self) -> Sized: ...

    def describe(self) -> list[KeyInfo]: ...


class MetricsSource(Protocol):
    """What the metrics read from fhmon serve (monitor/server.py's Service), at scrape
    time: a Protocol, so that this module does not import the server that builds it."""

    @property
    def stats(self) -> CallStats: ...

    @property
    def config(self) -> Config: ...

    @property
    def targets(self) -> Sized: ...

    @property
    def keys(self) -> KeysSource: ...

    @property
    def key_error(self) -> str | None: ...

    @property
    def accepting(self) -> bool: ...

    def intake_full(self) -> bool: ...

    def plane_failure(self) -> str | None: ...

    def flush_counters(self) -> None: ...

# No *_created series: they double every counter's series and mean nothing to an operator
# (fhmon_registrations_created was one). Process-wide, and fhmon has one registry.
disable_created_metrics()  # type: ignore[no-untyped-call]
# The buckets' "le" labels, written as prometheus-client writes them
# The metrics address takes no body; the kubelet (an HTTP probe), Prometheus and anyone else
# on the node's address share one client address, so a slow or silent peer there must not
# keep them out: 512 connections (at most a quarter of the fd limit), 256 per address, and
# at a cap the one that has waited longest for its client gives way (monitor/http/
# admission.py). A connection costs an fd and a few KiB; a trickling one is read at most
# every 0.25 s.
LIMITS = http.Limits(max_connections=512, max_per_source=256)
_LE = [floatToGoString(b) for b in LATENCY_BUCKETS] + ["+Inf"]  # type: ignore[no-untyped-call]


class Metrics:
    def __init__(self, service: MetricsSource) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        r.register(_CallCollector(service.stats))
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
        r.register(_InfoCollector(service))
        # process_open_fds, process_max_fds, memory, CPU: for the FhmonFdsNearLimit alert
        ProcessCollector(registry=r)
        self.keeper_deposits: Counter | None = None
        if service.config.keeper_socket:
            self.keeper_deposits = Counter(
                "fhmon_keeper_deposits", "Listeners handed to the keeper, by outcome "
                "(failed: that listener will not survive a restart of fhmon)", ["outcome"],
                registry=r)
            self.keeper_restored = Counter(
                "fhmon_keeper_restored", "Listeners taken back from the keeper at start",
                registry=r)
            for outcome in ("ok", "failed"):
                self.keeper_deposits.labels(outcome)
        for outcome in ("accepted", "refused"):
            self.registrations.labels(outcome)  # both series exist from the start

    def count_deposit(self, outcome: str) -> None:
        if self.keeper_deposits is not None:
            self.keeper_deposits.labels(outcome).inc()

    def count_restored(self) -> None:
        if self.keeper_deposits is not None:
            self.keeper_restored.inc()

    def exposition(self) -> bytes:
        self.service.flush_counters()  # a scrape counts every call answered before it
        return generate_latest(self.registry)

    def unready(self) -> str | None:
        """Why fhmon cannot serve a new target right now (/readyz), or None when it can:
        its keys loaded without error, its answering machinery (worker processes, if any)
        runs, and its intake accepts registrations."""
        service = self.service
        if service.key_error is not None:  # the details (paths) are in the log only
            return "key directory: the last load failed (log event keys_reload_failed)"
        if not service.keys.key_ids:
            return "no keys loaded"
        if not service.accepting:
            return "intake not accepting (starting or stopping)"
        if service.intake_full():
            return "intake at its connection cap"
        failure = service.plane_failure()
        if failure is not None:
            return failure
        return None


class _InfoCollector:
    """fhmon_build_info{version} and fhmon_key_info{key_id, signer}: an operator compares
    them across nodes (every node must hold the same key ids, and sign with the same)."""

    def __init__(self, service: MetricsSource) -> None:
        self._service = service

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        build = GaugeMetricFamily("fhmon_build_info", "The running fhmon's version",
                                  labels=["version"])
        build.add_metric([__version__], 1)
        yield build
        keys = GaugeMetricFamily("fhmon_key_info", "One series per loaded key (its id, and "
                                 "whether fhmon signs with it)", labels=["key_id", "signer"])
        for key in self._service.keys.describe():
            keys.add_metric([f"{key.key_id:08x}", "true" if key.signing else "false"], 1)
        yield keys


class _CallCollector:
    """The per-call metrics, read from CallStats at scrape time: the calls themselves only
    count (monitor/metrics.py), worker processes' reports included."""

    def __init__(self, stats: CallStats) -> None:
        self._stats = stats

    def describe(self) -> list[Metric]:
        return []  # the families vary with what was called; nothing to check at register

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        with stats.lock:
            results = dict(stats.results)
            refusals = dict(stats.refusals)
            seconds = dict(stats.seconds)
            buckets = {syscall: list(counts) for syscall, counts in stats.buckets.items()}
        calls = CounterMetricFamily("fhmon_calls",
                                    "Emulated calls by syscall and result (errno name)",
                                    labels=["syscall", "result"])
        for (syscall, result), count in sorted(results.items()):
            calls.add_metric([syscall, result], count)
        yield calls
        latency = HistogramMetricFamily("fhmon_call_duration_seconds",
                                        "Time fhmon spends on one call, receive to answer",
                                        labels=["syscall"])
        for syscall, counts in sorted(buckets.items()):
            cumulative = list(itertools.accumulate(counts))
            latency.add_metric([syscall], list(zip(_LE, cumulative, strict=True)),
                               seconds.get(syscall, 0.0))
        yield latency
        yield CounterMetricFamily("fhmon_mac_failures",
                                  "Handles refused because their MAC did not verify",
                                  value=refusals.get(MAC_INVALID, 0))
        reasons = CounterMetricFamily("fhmon_confinement_refusals",
                                      "Calls refused on policy, by reason", labels=["reason"])
        for reason, count in sorted(refusals.items()):
            reasons.add_metric([reason], count)
        yield reasons


async def serve_http(metrics: Metrics, address: str,
                     task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED,
                     ) -> None:
    """`GET /metrics`, `/healthz` and `/readyz` on `address`, through the bounded server of
    monitor/http/ (no request body; a scrape must arrive within 5 s)."""

    async def scrape(request: http.Request) -> http.Response:
        return http.Response(200, metrics.exposition(), content_type=CONTENT_TYPE_LATEST)

    async def healthz(request: http.Request) -> http.Response:
        return http.text(200, "ok")  # the process is alive and its event loop answers

    async def readyz(request: http.Request) -> http.Response:
        reason = metrics.unready()
        return http.text(503, reason) if reason else http.text(200, "ready")

    handler = http.route({"/metrics": {"GET": scrape}, "/healthz": {"GET": healthz},
                          "/readyz": {"GET": readyz}})
    await http.serve(handler, address, name="metrics", limits=LIMITS, task_status=task_status)
