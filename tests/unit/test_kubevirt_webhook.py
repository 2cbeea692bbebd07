"""`fhmon webhook` over real TLS sockets: AdmissionReviews in, the inject patch out."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import trio
import yaml
from hypothesis import strategies as st

from monitor.kubevirt import inject, webhook
from monitor.kubevirt.patch import pod_patch
from monitor.kubevirt.pods import VIRTIOFSD
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
    assert patch == pod_patch(pod)
    assert apply_patch(pod, patch) == yaml.safe_load(inject.inject(LAUNCHER_POD))


async def test_nothing_to_do_is_allowed_without_a_patch(server: Server) -> None:
    pod = yaml.safe_load(LAUNCHER_POD)
    injected = apply_patch(pod, pod_patch(pod))
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


# --------------------------------------------------------------------------------------------
# Hostile JSON: every shape is a 400 or allowed unchanged, never 500.

ALLOWED_UNCHANGED = {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def _launcher_pod() -> dict[str, Any]:
    pod = yaml.safe_load(LAUNCHER_POD)
    assert isinstance(pod, dict)
    return pod


def _virtiofs(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "virtiofs-data")


def _with(change: Any) -> dict[str, Any]:
    pod = _launcher_pod()
    change(pod)
    return pod


def _set_limits(value: Any) -> Any:
    return lambda pod: _virtiofs(pod)["resources"].__setitem__("limits", value)


def _set_requests(value: Any) -> Any:
    return lambda pod: _virtiofs(pod)["resources"].__setitem__("requests", value)


def _volume_name(value: Any) -> Any:
    def change(pod: dict[str, Any]) -> None:
        for volume in pod["spec"]["volumes"]:
            volume["name"] = value
    return change


ODD_PODS = {
    "volume name a list": _with(_volume_name(["data"])),
    "volume name an object": _with(_volume_name({"data": 1})),
    "limits a number": _with(_set_limits(80)),
    "limits a list": _with(_set_limits(["memory", "80M"])),
    "limits a string": _with(_set_limits("memory=80M")),
    "requests a list": _with(_set_requests([1])),
    "resources a string": _with(lambda pod: _virtiofs(pod).__setitem__("resources", "x")),
}


@pytest.mark.parametrize("name", sorted(ODD_PODS))
async def test_odd_fields_are_allowed_unchanged(server: Server, name: str) -> None:
    reply = await server.call("POST", "/mutate", review(ODD_PODS[name]))
    assert reply.status == 200, reply.body
    response = reply.json()["response"]
    # The other PVC container (virtiofs-dv) may still be patched; the odd one never is.
    if "patch" in response:
        patch = json.loads(base64.b64decode(response["patch"]))
        index = ODD_PODS[name]["spec"]["containers"].index(_virtiofs(ODD_PODS[name]))
        assert all(not op["path"].startswith(f"/spec/containers/{index}") for op in patch)
        apply_patch(ODD_PODS[name], patch)
    else:
        assert response == ALLOWED_UNCHANGED


@pytest.mark.parametrize("quantity", ["1e999999999", "9e999999999Mi", "1" * 5000, "1e30Ei",
                                      "NaN", 1e308, True, {"a": 1}])
def test_memory_quantities_no_limit_has_are_left_alone(quantity: Any) -> None:
    pod = _with(_set_limits({"memory": quantity}))
    patched = apply_patch(pod, pod_patch(pod))
    assert _virtiofs(patched)["resources"]["limits"]["memory"] == quantity


def _review_text(object_text: str, operation: str = '"CREATE"') -> bytes:
    return ('{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
            f'{{"uid": "u", "operation": {operation}, "object": {object_text}}}}}').encode()


@pytest.mark.parametrize("where", ["object", "operation", "limits"])
async def test_an_integer_of_5000_digits_is_400(server: Server, where: str) -> None:
    big = "7" * 5000
    pod = json.dumps(_launcher_pod())
    body = {"object": _review_text(big),
            "operation": _review_text(pod, operation=big),
            "limits": _review_text(pod.replace('"80M"', big, 1))}[where]
    reply = await server.call("POST", "/mutate", body)
    assert reply.status == 400 and b"not JSON we read" in reply.body, reply.body


@pytest.mark.parametrize("operation", [None, "", 5, ["CREATE"], {"CREATE": 1}, "create",
                                       "CREATE ", "UPDATE", "MISSING"])
async def test_only_the_exact_operation_create_is_patched(server: Server,
                                                          operation: Any) -> None:
    document = json.loads(review(_launcher_pod()))
    if operation == "MISSING":
        del document["request"]["operation"]
    else:
        document["request"]["operation"] = operation
    reply = await server.call("POST", "/mutate", json.dumps(document).encode())
    assert reply.status == 200 and reply.json()["response"] == ALLOWED_UNCHANGED


def test_a_review_beyond_the_value_bound_is_refused_before_parsing() -> None:
    body = _review_text("[" + ",".join(["{}"] * webhook.MAX_JSON_VALUES) + "]")
    with pytest.raises(webhook.BadReview, match="JSON values"):
        webhook.parse_review(body)


def test_a_pod_beyond_the_container_or_patch_bound_is_allowed_unchanged() -> None:
    pod = _launcher_pod()
    template = _virtiofs(pod)
    many = _launcher_pod()
    many["spec"]["containers"] = [template] * (webhook.MAX_CONTAINERS + 1)
    big = _launcher_pod()
    _virtiofs(big)["env"] = [{"name": "X", "value": "x" * webhook.MAX_PATCH_BYTES}]
    for shape, why in ((many, "containers"), (big, "patch")):
        answer = webhook.review_response(webhook.Review("u", shape, "CREATE"),
                                         webhook.DEFAULT_SETTINGS)["response"]
        assert "patch" not in answer and why in answer["warnings"][0], answer
    # Within the bounds the same pod is patched.
    answer = webhook.review_response(webhook.Review("u", pod, "CREATE"),
                                     webhook.DEFAULT_SETTINGS)["response"]
    assert "patch" in answer


JSON_LEAVES = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
               | st.sampled_from(["virtiofs-data", "data", "/data", VIRTIOFSD, "80M", "80Mi",
                                  "1e999999999", "--migration-mode", "fhmon-launcher", "Pod",
                                  "CREATE", "RuntimeDefault"]))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8) | st.sampled_from(
                               ["name", "limits", "memory", "persistentVolumeClaim", "command"]),
                               inner, max_size=4), max_leaves=8)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


REVIEW_PATHS = _paths(json.loads(review(_launcher_pod())))


@hypothesis.settings(max_examples=int(os.environ.get("FHMON_HYPOTHESIS_EXAMPLES", "400")),
                     deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(st.lists(st.tuples(st.sampled_from(REVIEW_PATHS), JSON_VALUES,
                                     st.booleans()), min_size=1, max_size=4))
def test_any_json_anywhere_in_a_review_is_400_or_allowed(
        mutations: list[tuple[tuple[Any, ...], Any, bool]]) -> None:
    """Every field the webhook and the plan read may hold any JSON type: replace (or delete)
    up to four values of a real review by arbitrary JSON. The plan must not raise (the
    handler's fail-open catch would hide it), and a patch it gives must apply."""
    document = json.loads(review(_launcher_pod()))
    for path, value, delete in mutations:
        parent = document
        try:
            for part in path[:-1]:
                parent = parent[part]
            if not path:
                document = value
            elif delete and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    try:
        parsed = webhook.parse_review(json.dumps(document).encode())
    except webhook.BadReview:
        return
    answer = webhook.review_response(parsed, webhook.DEFAULT_SETTINGS)["response"]
    assert answer["uid"] == parsed.uid and answer["allowed"] is True
    if "patch" in answer:
        patched = apply_patch(parsed.pod, json.loads(base64.b64decode(answer["patch"])))
        json.dumps(patched)


async def test_what_is_echoed_or_logged_is_short(server: Server) -> None:
    """The uid is answered and logged, a wrong apiVersion quoted: none may be megabytes."""
    long_uid = json.loads(review(_launcher_pod()))
    long_uid["request"]["uid"] = "u" * 100_000
    long_api = json.loads(review(_launcher_pod()))
    long_api["apiVersion"] = "v" * 100_000
    for document, message in ((long_uid, b"uid is longer"), (long_api, b"expected apiVersion")):
        reply = await server.call("POST", "/mutate", json.dumps(document).encode())
        assert reply.status == 400 and message in reply.body and len(reply.body) < 300, \
            reply.body[:100]
