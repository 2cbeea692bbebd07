"""`fhmon webhook` over real TLS sockets: AdmissionReviews in, the inject patch out."""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import json
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from monitor import http
from monitor.kubevirt import inject, webhook
from tests.unit.test_kubevirt_inject import LAUNCHER_POD, apply_patch

LIMITS = http.Limits(max_body_bytes=256 * 1024, request_timeout=1.0, idle_timeout=1.0)


def make_certificate(directory: Path, name: str) -> tuple[bytes, bytes, int]:
    """A self-signed serving certificate for localhost / 127.0.0.1: (cert PEM, key PEM, serial)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    serial = x509.random_serial_number()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(serial)
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem, serial


class SecretVolume:
    """Files laid out the way the kubelet updates a Secret volume: tls.crt -> ..data/tls.crt,
    ..data -> a timestamped directory, switched with one rename."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        self.trusted: list[bytes] = []

    def write(self, cert: bytes, key: bytes) -> None:
        self.generation += 1
        version = self.root / f"..v{self.generation}"
        version.mkdir()
        (version / "tls.crt").write_bytes(cert)
        (version / "tls.key").write_bytes(key)
        os.symlink(version.name, self.root / "..data_tmp")
        os.rename(self.root / "..data_tmp", self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            if not (self.root / name).is_symlink():
                os.symlink(f"..data/{name}", self.root / name)

    def rotate(self, name: str) -> int:
        cert, key, serial = make_certificate(self.root, name)
        self.trusted.append(cert)
        self.write(cert, key)
        return serial

    @property
    def cert(self) -> str:
        return str(self.root / "tls.crt")

    @property
    def key(self) -> str:
        return str(self.root / "tls.key")


@dataclass
class Reply:
    status: int
    body: bytes
    serial: int

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Server:
    port: int
    volume: SecretVolume
    certificates: webhook.CertificateFiles

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata="".join(c.decode() for c in
                                                            self.volume.trusted))
        return context

    async def call(self, method: str, path: str, body: bytes = b"",
                   content_type: str = "application/json") -> Reply:
        stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        tls = trio.SSLStream(stream, self.client_context(), server_hostname="localhost")
        try:
            await tls.do_handshake()
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            serial = x509.load_der_x509_certificate(der).serial_number
            conn = h11.Connection(h11.CLIENT)
            data = conn.send(h11.Request(method=method, target=path, headers=[
                ("Host", "localhost"), ("Content-Type", content_type),
                ("Content-Length", str(len(body)))]))
            data += conn.send(h11.Data(data=body)) if body else b""
            data += conn.send(h11.EndOfMessage())
            await tls.send_all(data)
            status, out = 0, bytearray()
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await tls.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    out += event.data
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    break
            return Reply(status, bytes(out), serial)
        finally:
            await trio.aclose_forcefully(tls)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    volume = SecretVolume(tmp_path)
    volume.rotate("first")
    certificates = webhook.CertificateFiles(volume.cert, volume.key)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(webhook.serve, "127.0.0.1:0", certificates,
                                    webhook.DEFAULT_SETTINGS, LIMITS)
        yield Server(bound[0][1], volume, certificates)
        nursery.cancel_scope.cancel()


def review(pod: Any, uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
           operation: str = "CREATE") -> bytes:
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "default", "operation": operation, "object": pod,
                    "userInfo": {"username": "system:serviceaccount:kubevirt:kubevirt-controller"},
                    "dryRun": False}}).encode()


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


async def raw_exchange(server: Server, data: bytes, timeout: float = 5.0) -> bytes:
    """Send `data` over TLS as is, return everything until the server closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    tls = trio.SSLStream(stream, server.client_context(), server_hostname="localhost")
    received = bytearray()
    try:
        await tls.send_all(data)
        with trio.fail_after(timeout):
            with contextlib.suppress(trio.BrokenResourceError):
                while chunk := await tls.receive_some(4096):
                    received += chunk
    finally:
        await trio.aclose_forcefully(tls)
    return bytes(received)


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
