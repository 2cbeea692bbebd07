"""The KubeVirt test material several suites share: a real virt-launcher pod as virt-controller
renders it, a JSON Patch applier, the installed launcher (`fhmon install-launcher`) and a
probe run under it, and the admission webhook on loopback TLS with its certificates.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from monitor import http
from monitor.kubevirt import containers, webhook

DATA = Path(__file__).resolve().parents[1] / "unit" / "kubevirt"  # what virt-controller renders


LAUNCHER_POD = (DATA / "virt-launcher-pod.yaml").read_text()


def apply_patch(document: Any, patch: list[dict[str, Any]]) -> Any:
    """A small RFC 6902 applier for the operations the plan and the overlays use (add,
    replace, remove); a path that does not exist fails, as it does in kustomize."""
    document = copy.deepcopy(document)
    for operation in patch:
        assert operation["op"] in ("add", "replace", "remove"), operation
        parts = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"][1:].split("/")]
        parent = document
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if operation["op"] == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                assert last in parent, operation
                del parent[last]
            continue
        if isinstance(parent, list):
            if operation["op"] == "add":
                parent.insert(len(parent) if last == "-" else int(last), operation["value"])
            else:
                parent[int(last)] = operation["value"]
        else:
            assert operation["op"] == "add" or last in parent, operation
            parent[last] = operation["value"]
    return document


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")


def launcher_argv(root: Path, *args: str) -> list[str]:
    """The injected command line, with the launcher directory moved to `root`."""
    command = containers.launcher_command(containers.Settings(), "/data")
    moved = [a.replace(containers.LAUNCHER_DIR, str(root)) for a in command]
    return moved[:moved.index("launch")] + list(args)


PROBE = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
pidfd = os.pidfd_open(os.getppid())
got = libc.syscall(438, pidfd, 3, 0)  # pidfd_getfd(the launcher, its fd 3, 0)
print("pidfd_getfd", got, errno.errorcode.get(ctypes.get_errno(), "0") if got < 0 else "ok")
"""


def steal_from_launcher(bundle: Path, uid: int = 65534) -> list[str]:
    """Run PROBE as `uid` under the installed launcher (a fake fhmon accepts the registration):
    the child's pidfd_getfd() of its launcher's fd 3, as ["pidfd_getfd", result, errno]."""
    import socket as so

    from protocol import intake_wire

    base = Path(tempfile.mkdtemp(prefix="fhmon-bundle-", dir="/tmp"))
    base.chmod(0o755)
    try:
        sock_path = base / "fhmon.sock"
        server = so.socket(so.AF_UNIX, so.SOCK_STREAM)
        server.bind(str(sock_path))
        sock_path.chmod(0o777)
        server.listen()
        server.settimeout(30)
        argv = launcher_argv(bundle, "launch", "--socket", str(sock_path), "--share", str(base),
                             "--", sys.executable, "-I", "-c", PROBE)
        proc = subprocess.Popen(argv, env={}, user=uid, group=uid, extra_groups=[],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            conn, _ = server.accept()
            conn.settimeout(30)
            decoder = intake_wire.FrameDecoder()
            fds: list[int] = []
            while (hello := decoder.next_message()) is None:
                data, got, _, _ = so.recv_fds(conn, 65536, 4)
                fds += got
                assert data, "the launcher hung up"
                decoder.feed(data)
            assert isinstance(hello, intake_wire.Hello)
            assert hello.flags & intake_wire.HELLO_TARGET_PIDFD
            assert len(fds) == 2  # the listener, the child's pidfd
            for fd in fds:
                os.close(fd)
            conn.sendall(intake_wire.encode(intake_wire.Accept(1, bytes(32), "ok")))
            out, err = proc.communicate(timeout=60)
            conn.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            server.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert proc.returncode == 0, err
    return out.split()


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


def review(pod: Any, uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
           operation: str = "CREATE") -> bytes:
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "default", "operation": operation, "object": pod,
                    "userInfo": {"username": "system:serviceaccount:kubevirt:kubevirt-controller"},
                    "dryRun": False}}).encode()


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
