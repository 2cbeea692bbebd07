"""Attacks on the KubeVirt pieces: the launcher copied into virt-launcher pods and the
admission webhook. The webhook runs on loopback with a self-signed certificate, as in
tests/unit/test_kubevirt_webhook.py; the launcher is the one installed by
tests/unit/test_kubevirt_launcher_install.py."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from tests.adversarial.common import EXHAUSTION, FUZZING, PRIVILEGE
from tests.adversarial.recording import Recorder
from tests.support.http_attack import (
    Attacker,
    ReviewFlood,
    free_port,
    raise_nofile,
    tls_client_context,
)
from tests.support.kubevirt import (
    LAUNCHER_POD,
    LIMITS,
    Server,
    make_certificate,
    needs_root,
    raw_exchange,
    review,
    steal_from_launcher,
)


@needs_root
def test_virtiofsd_cannot_take_the_launchers_fds(bundle: Path, record: Recorder) -> None:
    """In KubeVirt's container the launcher and virtiofsd are both uid 107: a compromised
    virtiofsd trying pidfd_getfd() on its parent (the listener, fhmon's connection)."""
    _, result, err = steal_from_launcher(bundle)
    record(PRIVILEGE, "same-uid child of the KubeVirt launcher: pidfd_getfd of its fds",
           "EPERM", err if result == "-1" else "success")


MALFORMED = [
    b"", b"{", b"null", b"[]", b'"AdmissionReview"', b"\xff\xfe", b"{}" * 1000,
    json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": []}).encode(),
    json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": 7}}).encode(),
    json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u", "object": "pod"}}).encode(),
    json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(),
    b'{"a":' * 5000 + b"1" + b"}" * 5000,  # deep nesting
]


async def test_webhook_malformed_reviews(server: Server, record: Recorder) -> None:
    statuses = [(await server.call("POST", "/mutate", body)).status for body in MALFORMED]
    record.every(FUZZING, "malformed AdmissionReview bodies to /mutate", 400, statuses)
    good = await server.call("POST", "/mutate", review(yaml.safe_load(LAUNCHER_POD)))
    record(FUZZING, "a valid review right after them", 200, good.status)


async def test_webhook_odd_pods_are_allowed_unchanged(server: Server, record: Recorder) -> None:
    odd = [{"kind": "Pod"}, {"kind": "Pod", "spec": []}, {"kind": "Pod", "spec": {"containers": 5}},
           {"kind": "Pod", "spec": {"containers": [None, 1, "x", {"name": 3}]}},
           {"kind": "Pod", "spec": {"containers": [{"name": "virtiofs-x",
                                                    "command": ["/usr/libexec/virtiofsd"],
                                                    "volumeMounts": "no"}]}},
           {"kind": "Pod", "spec": {"volumes": {"a": 1}, "containers": []}}]
    answers = []
    for pod in odd:
        reply = await server.call("POST", "/mutate", review(pod))
        answers.append("allowed" if reply.status == 200 and reply.json()["response"] == {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True} else
            f"{reply.status} {reply.body[:80]!r}")
    record.every(FUZZING, "Pods of odd shapes: allowed, no patch, no error", "allowed", answers)


async def test_webhook_oversized_and_slow_requests(server: Server, record: Recorder) -> None:
    head = (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
            % (LIMITS.max_body_bytes + 1))
    reply = await raw_exchange(server, head)
    record(EXHAUSTION, "review body over the limit (declared length)", "413",
           reply[9:12].decode(errors="replace"))
    started = trio.current_time()
    reply = await raw_exchange(server, b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 10"
                               b"\r\n\r\n{", timeout=LIMITS.request_timeout + 3)
    record(EXHAUSTION, "slow review (a byte, then nothing): answered and closed within the "
           "request timeout", "408",
           reply[9:12].decode(errors="replace") if trio.current_time() - started
           < LIMITS.request_timeout + 2 else "too late")
    ok = await server.call("GET", "/healthz")
    record(EXHAUSTION, "the webhook still serves afterwards", 200, ok.status)


# --------------------------------------------------------------------------------------------
# The webhook as deployed: its own process, the Deployment's memory limit, the API server's
# timeout, attackers from other addresses than the API server's.

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "components" / "kubevirt-webhook"
MiB = 2**20


def _deployed() -> tuple[int, float]:
    """(the webhook container's memory limit in bytes, the API server's timeoutSeconds)."""
    deployment = next(d for d in yaml.safe_load_all((DEPLOY / "webhook.yaml").read_text())
                      if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi"), limit
    # the shortest timeoutSeconds of the configurations (fhmon's, and the migration opt-in's)
    timeouts = [hook["timeoutSeconds"]
                for configuration in yaml.safe_load_all(
                    (DEPLOY / "mutatingwebhookconfiguration.yaml").read_text())
                for hook in configuration["webhooks"]]
    return int(limit[:-2]) * MiB, float(min(timeouts))


MEMORY_LIMIT, REVIEW_TIMEOUT = _deployed()


@dataclass
class MemoryWatch:
    """Enforces a memory limit on a process as the kubelet's cgroup would (this machine's
    cgroups are v1 and not ours to nest in): its RSS is sampled every 10 ms and the process
    is SIGKILLed beyond `limit`; VmHWM, the kernel's own peak, catches what sampling misses."""

    pid: int
    limit: int
    killed_at: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def _status(self, field_name: str) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def run(self) -> None:
        while not self.stop.wait(0.01):
            try:
                rss = self._status("VmRSS")
            except OSError:
                return
            if rss > self.limit:
                self.killed_at = rss
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                return

    def peak(self) -> int:
        return self._status("VmHWM")


@dataclass
class WebhookProcess:
    port: int
    proc: subprocess.Popen[bytes]
    watch: MemoryWatch
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None


@contextlib.contextmanager
def webhook_process(tmp_path: Path) -> Iterator[WebhookProcess]:
    cert, key, _ = make_certificate(tmp_path, "webhook")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    port = free_port()
    log = tmp_path / "webhook.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "monitor.cli", "webhook", "--address", f"127.0.0.1:{port}",
             "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")],
            stdout=out, stderr=out)
    watch = MemoryWatch(proc.pid, MEMORY_LIMIT)
    thread = threading.Thread(target=watch.run, daemon=True)
    try:
        deadline = time.monotonic() + 60
        while _get(port, "/healthz") != 200:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        thread.start()
        yield WebhookProcess(port, proc, watch, log)
    finally:
        watch.stop.set()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if thread.is_alive():
            thread.join(5)


def _connection(port: int, timeout: float) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout,
                                       context=tls_client_context())


def _get(port: int, path: str, timeout: float = 3) -> int:
    connection = _connection(port, timeout)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        connection.close()


def real_review(port: int, took: list[float] | None = None,
                within: float = REVIEW_TIMEOUT) -> str:
    """One virt-launcher pod's review, as the API server sends it (from 127.0.0.1): "answered"
    when its patch came back within `within` (the API server's timeout; its time added to
    `took`)."""
    body = review(yaml.safe_load(LAUNCHER_POD))
    started = time.monotonic()
    connection = _connection(port, within)
    try:
        connection.request("POST", "/mutate", body, {"Content-Type": "application/json"})
        reply = connection.getresponse()
        data = reply.read()
    except (OSError, http.client.HTTPException) as exc:
        return f"unanswered ({type(exc).__name__} after {time.monotonic() - started:.1f} s)"
    finally:
        connection.close()
    seconds = time.monotonic() - started
    if took is not None:
        took.append(seconds)
    if reply.status != 200 or "patch" not in json.loads(data)["response"]:
        return f"{reply.status} {data[:60]!r}"
    return "answered" if seconds <= within else f"answered after {seconds:.1f} s"


def _minimal_virtiofs_pod(count: int, env_bytes: int = 0) -> dict[str, Any]:
    """`count` minimal KubeVirt-looking virtiofs containers of one PVC (the amplification
    finding: each became a full injected container in the patch)."""
    env = [{"name": "PAD", "value": "x" * env_bytes}] if env_bytes else []
    container = {"name": "virtiofs-d", "command": ["/usr/libexec/virtiofsd"],
                 "volumeMounts": [{"name": "d", "mountPath": "/d"}],
                 **({"env": env} if env else {})}
    volumes = [{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]
    return {"kind": "Pod", "spec": {"containers": [container] * count, "volumes": volumes}}


def _compact(body: bytes) -> bytes:
    return json.dumps(json.loads(body), separators=(",", ":")).encode()


def hostile_reviews() -> dict[str, bytes]:
    """Shapes of the largest cost each bound lets through, all under the 4 MiB body cap."""
    out = {
        "30,000 virtiofs containers (the finding)":
            _compact(review(_minimal_virtiofs_pod(30_000))),
        "15,000 virtiofs containers (just under the value bound)":
            _compact(review(_minimal_virtiofs_pod(15_000))),
        "250 virtiofs containers with 15 KiB each (a patch over its bound)":
            _compact(review(_minimal_virtiofs_pod(250, env_bytes=15_000))),
        "256 virtiofs containers in a small review (a large patch to a small body)":
            _compact(review(_minimal_virtiofs_pod(256))),
    }
    dicts = '{"kind": "Pod", "x": [' + ",".join(["{}"] * 99_000) + '], "pad": "'
    envelope = review({"kind": "Pod"}).decode()
    filler = "\U0001f600" * ((4 * MiB - len(envelope) - len(dicts) - 2000) // 4)
    out["99,000 empty objects and a 4 MiB astral string"] = envelope.replace(
        '{"kind": "Pod"}', dicts + filler + '"}').encode()
    for name, body in out.items():
        assert len(body) < 4 * MiB, (name, len(body))
    return out


def _attack_for(process: WebhookProcess, seconds: float, floods: list[ReviewFlood],
                took: list[float]) -> list[str]:
    for flood in floods:
        flood.start()
    answers: list[str] = []
    try:
        time.sleep(1)  # the floods are under way
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and process.alive():
            answers.append(real_review(process.port, took))
            time.sleep(0.2)
    finally:
        for flood in floods:
            flood.close()
    return answers


def test_webhook_memory_under_concurrent_amplification(tmp_path: Path,
                                                       record: Recorder) -> None:
    """Item 3: six reviews in flight took the webhook to ~700 MiB against its 128Mi limit.
    Now: five addresses, each with six connections posting one of the costliest shapes (some
    never reading their answers), while the API server's reviews keep coming."""
    shapes = hostile_reviews()
    with webhook_process(tmp_path) as process:
        idle = process.watch.peak()
        floods = [ReviewFlood(process.port, body, connections=6, source=f"127.0.0.{2 + i}",
                              read_answers=i % 2 == 0)
                  for i, body in enumerate(shapes.values())]
        # And connections that hold no body: 64 silent ones from 4 more addresses.
        silent = [Attacker(process.port, 16, trickle=False, source=f"127.0.0.{10 + i}")
                  for i in range(4)]
        threads = [threading.Thread(target=a.run, daemon=True) for a in silent]
        for thread in threads:
            thread.start()
        took: list[float] = []
        try:
            answers = _attack_for(process, 12, floods, took)
            for attacker in silent:
                attacker.check()  # they held their connections all along
        finally:
            for attacker in silent:
                attacker.stop.set()
            for thread in threads:
                thread.join(10)
        alive = process.alive()
        peak = process.watch.peak() if alive else 0
        sent = sum(f.sent for f in floods)
        statuses: dict[str, int] = {}
        for flood in floods:
            for status, count in flood.statuses.items():
                statuses[status] = statuses.get(status, 0) + count
        log = process.log.read_text(errors="replace")
    record(EXHAUSTION, f"webhook under {sent} hostile reviews from 5 addresses (30 connections:"
           f" {', '.join(shapes)}; and 64 silent connections from 4 more), with the "
           f"Deployment's {MEMORY_LIMIT // MiB} MiB limit",
           f"alive, peak RSS within {MEMORY_LIMIT // MiB} MiB",
           f"alive {alive}, peak RSS {peak / MiB:.0f} MiB (idle {idle / MiB:.0f} MiB)"
           + (f", killed at {process.watch.killed_at / MiB:.0f} MiB"
              if process.watch.killed_at else "") + f"; answers {statuses}",
           ok=alive and 0 < peak <= MEMORY_LIMIT and "Traceback" not in log)
    record.every(EXHAUSTION, "the API server's reviews meanwhile: the patch within the "
                 f"{REVIEW_TIMEOUT:.0f} s timeoutSeconds (slowest "
                 f"{max(took, default=0):.2f} s)", "answered", answers)


@pytest.mark.parametrize("sources", [1, 4])
def test_webhook_answers_while_handshakes_stall(tmp_path: Path, record: Recorder,
                                                sources: int) -> None:
    """Item 4: 200 TCP connections that never send a ClientHello, reopened as they close,
    from one address or spread over four, against the webhook's own process."""
    with webhook_process(tmp_path) as process:
        attackers = [Attacker(process.port, 200 // sources, trickle=False,
                              source=f"127.0.0.{2 + i}") for i in range(sources)]
        threads = [threading.Thread(target=a.run, daemon=True) for a in attackers]
        for thread in threads:
            thread.start()
        answers: list[str] = []
        probes: list[int] = []
        try:
            deadline = time.monotonic() + 30
            while sum(a.holding for a in attackers) < 190 and time.monotonic() < deadline:
                time.sleep(0.1)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                answers.append(real_review(process.port))
                probes.append(_get(process.port, "/healthz"))
                time.sleep(0.2)
            for attacker in attackers:
                attacker.check()  # they stalled handshakes all along
        finally:
            for attacker in attackers:
                attacker.stop.set()
            for thread in threads:
                thread.join(10)
        opened = sum(a.opened for a in attackers)
        alive = process.alive()
    record.every(EXHAUSTION, f"webhook: 200 silent TLS clients from {sources} address(es), "
                 f"reopened as they close ({opened} opened): reviews answered within "
                 f"{REVIEW_TIMEOUT:.0f} s", "answered", answers)
    record.every(EXHAUSTION, "webhook: its liveness probe (/healthz) meanwhile", 200, probes)
    record(EXHAUSTION, "webhook after the silent TLS clients", "alive", "alive" if alive
           else "dead")


@pytest.mark.parametrize("held", [200, 1000])
def test_every_review_is_answered_while_its_own_address_holds_idle_connections(
        tmp_path: Path, record: Recorder, held: int) -> None:
    """Issue 36.5: 200 TCP connections that never send a ClientHello, reopened as they close,
    from the API server's own address (one address is all a NAT, a node's SNAT or a
    hostNetwork pod beside the API server needs) left 17 of 22 reviews without an answer,
    each closed at once (the address was at its cap of 16): failurePolicy Ignore then starts
    VM pods without fhmon, Fail refuses migration targets. 200, then 1,000 of them: every
    review of 20 (and the kubelet's /healthz probe) answered within 1 s."""
    raise_nofile(held + 1024)
    with webhook_process(tmp_path) as process:
        attacker = Attacker(process.port, held, trickle=False, source="127.0.0.1")
        thread = threading.Thread(target=attacker.run, daemon=True)
        thread.start()
        answers: list[str] = []
        probes: list[int] = []
        try:
            deadline = time.monotonic() + 30
            while attacker.holding < held * 0.95 and time.monotonic() < deadline:
                time.sleep(0.1)
            holding = attacker.holding
            while len(answers) < 20:
                answers.append(real_review(process.port, within=1.0))
                probes.append(_get(process.port, "/healthz", timeout=1.0))
                time.sleep(0.1)
            attacker.check()  # it held its connections all along
        finally:
            attacker.stop.set()
            thread.join(10)
        alive = process.alive()
        peak = process.watch.peak() if alive else 0
    record.every(EXHAUSTION, f"webhook: {held} silent TCP clients from the API server's own "
                 f"address 127.0.0.1 (holding {holding}, {attacker.opened} opened, reopened "
                 f"as they close): reviews patched within 1 s", "answered", answers)
    record.every(EXHAUSTION, f"webhook: its liveness probe (/healthz) within 1 s among {held} "
                 "silent clients of its own address", 200, probes)
    record(EXHAUSTION, f"webhook after {held} silent clients of the API server's address",
           f"alive, peak RSS within {MEMORY_LIMIT // MiB} MiB",
           f"alive, peak RSS {peak / MiB:.0f} MiB" if alive else "dead",
           ok=alive and 0 < peak <= MEMORY_LIMIT)
