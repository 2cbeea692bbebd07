"""`fhmon webhook` over real TLS sockets: AdmissionReviews in, the inject patch out."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import yaml

from monitor.kubevirt import inject, webhook
from tests.support.kubevirt import (
    LAUNCHER_POD,
    LIMITS,
    Server,
    apply_patch,
    make_certificate,
    raw_exchange,
    review,
)


async def test_mutate_gives_what_inject_gives(server: Server) -> None:
    pod = yaml.safe_load(LAUNCHER_POD)
    reply = await server.call("POST", "/mutate", review(pod, uid="abc-1"))
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "abc-1" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert patch == inject.pod_patch(pod)
    assert apply_patch(pod, patch) == yaml.safe_load(inject.inject(LAUNCHER_POD))


async def test_nothing_to_do_is_allowed_without_a_patch(server: Server) -> None:
    pod = yaml.safe_load(LAUNCHER_POD)
    injected = apply_patch(pod, inject.pod_patch(pod))
    for obj, operation in ((injected, "CREATE"), ({"kind": "Pod", "spec": {}}, "CREATE"),
                           (pod, "UPDATE"), (None, "DELETE")):
        reply = await server.call("POST", "/mutate", review(obj, operation=operation))
        assert reply.status == 200
        assert reply.json()["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                                            "allowed": True}


@pytest.mark.parametrize("body, message", [
    (b"{not json", b"not JSON"),
    (b"[1, 2]", b"JSON object"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                 "request": {"uid": "x"}}).encode(), b"apiVersion"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
     b"no request"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"object": {}}}).encode(), b"uid"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"uid": "u", "object": [1]}}).encode(), b"request.object"),
    ("\udcff".encode("utf-8", "surrogatepass"), b"not JSON"),
    (b'{"a":' * 5000 + b"1" + b"}" * 5000, b"nested too deeply"),
])
async def test_malformed_review_is_400_and_the_server_keeps_serving(
        server: Server, body: bytes, message: bytes) -> None:
    reply = await server.call("POST", "/mutate", body)
    assert reply.status == 400 and message in reply.body, reply.body
    good = await server.call("POST", "/mutate", review(yaml.safe_load(LAUNCHER_POD)))
    assert good.status == 200 and "patch" in good.json()["response"]


async def test_health_routes_and_methods(server: Server) -> None:
    assert (await server.call("GET", "/healthz")).status == 200
    assert (await server.call("GET", "/readyz")).status == 200
    assert (await server.call("GET", "/mutate")).status == 405
    assert (await server.call("POST", "/elsewhere", b"{}")).status == 404


async def test_body_is_bounded(server: Server) -> None:
    # Refused on the declared length, before a byte of the body is read.
    head = (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (LIMITS.max_body_bytes + 1))
    assert (await raw_exchange(server, head)).startswith(b"HTTP/1.1 413")
    # (A body that grows past the limit without a declared length: tests/unit/test_http.py.)
    assert (await server.call("GET", "/healthz")).status == 200


async def test_request_time_is_bounded(server: Server) -> None:
    partial = b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
    started = trio.current_time()
    reply = await raw_exchange(server, partial, timeout=LIMITS.request_timeout + 3)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:40]
    assert trio.current_time() - started < LIMITS.request_timeout + 2
    assert (await server.call("GET", "/healthz")).status == 200


async def test_certificate_rotation_without_restart(server: Server) -> None:
    first = (await server.call("GET", "/healthz")).serial
    second = server.volume.rotate("second")
    assert second != first
    reply = await server.call("GET", "/healthz")
    assert reply.serial == second and reply.status == 200
    assert server.certificates.loads == 2
    # A half-done update (the new certificate with the old key): keep serving the last
    # good pair; /readyz says why it is not current.
    cert, _, _ = make_certificate(server.volume.root, "third")
    server.volume.trusted.append(cert)
    old_key = (server.volume.root / "tls.key").read_bytes()
    server.volume.write(cert, old_key)
    assert (await server.call("GET", "/healthz")).serial == second
    ready = await server.call("GET", "/readyz")
    assert ready.status == 503 and b"cannot load" in ready.body
    fourth = server.volume.rotate("fourth")
    assert (await server.call("GET", "/healthz")).serial == fourth
    assert (await server.call("GET", "/readyz")).status == 200


def test_certificate_files_must_load_at_start(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        webhook.CertificateFiles(str(tmp_path / "none.crt"), str(tmp_path / "none.key"))
    (tmp_path / "bad.crt").write_text("not a certificate")
    (tmp_path / "bad.key").write_text("not a key")
    with pytest.raises((OSError, ssl.SSLError)):
        webhook.CertificateFiles(str(tmp_path / "bad.crt"), str(tmp_path / "bad.key"))


def test_cli_reports_a_missing_certificate(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "monitor.cli", "webhook", "--address", "127.0.0.1:0",
         "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "tls.crt" in result.stderr and "Traceback" not in result.stderr
