"""Attacks on the KubeVirt pieces: the launcher copied into virt-launcher pods and the
admission webhook (issue 18). The webhook runs on loopback with a self-signed certificate,
as in tests/unit/test_kubevirt_webhook.py; the launcher is the bundle of
tests/unit/test_kubevirt_bundle.py."""

from __future__ import annotations

import json
from pathlib import Path

import trio
import yaml

from tests.adversarial.common import EXHAUSTION, FUZZING, PRIVILEGE
from tests.adversarial.recording import Recorder
from tests.support.kubevirt import (
    LAUNCHER_POD,
    LIMITS,
    Server,
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
