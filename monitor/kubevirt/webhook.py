"""`fhmon webhook`: a mutating admission webhook giving virt-launcher pods what `fhmon inject`
gives their manifests.

POST /mutate takes an AdmissionReview (admission.k8s.io/v1) and answers allowed: true with,
for a Pod that has KubeVirt virtiofs containers of PVC volumes, the JSON Patch of
`patch.pod_patch`. It never refuses a pod: fhmon is an improvement, not a gate (a pod it
cannot or need not change is allowed unchanged). A review it cannot read is a 400 with a
message; the API server then applies the webhook's failurePolicy. GET /healthz says the
process serves; GET /readyz says a certificate is loaded and its files still load.

Whatever a review's shape, its cost is bounded (the Deployment's memory limit is 128Mi): a
body of more JSON values than MAX_JSON_VALUES is a 400 before it is parsed (json.loads
costs up to ~70 bytes per value), a pod of more than MAX_CONTAINERS containers, or whose
patch would exceed MAX_PATCH_BYTES, is allowed unchanged with a warning; reviews are
computed one at a time (trio runs them on one thread, without awaiting) and at most
LIMITS.max_bodies requests hold a body in memory at once (monitor/http/).

The serving certificate is re-read when its files change (a cert-manager renewal or a
kubelet Secret-volume update swaps them), checked on every new connection by stat(): an
update that is half written (a key that does not match the certificate) keeps the previous
certificate until the pair loads again.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
from dataclasses import dataclass
from typing import Any

import trio

from monitor import http, log
from monitor.http import Request, Response
from monitor.kubevirt.containers import DEFAULT_SETTINGS, Settings
from monitor.kubevirt.patch import plan_pod

# An AdmissionReview carries the whole Pod (and, for updates, the old one); the API server
# stores objects of up to 1.5 MiB, so 4 MiB bounds every real review.
# The API server gives the webhook timeoutSeconds (5 s, deploy/components/kubevirt-webhook):
# a review must arrive within it, a TLS handshake within a fraction of it. Anyone who reaches
# the Service may connect, also from the API server's own address (a NAT, a node's SNAT), so
# no number of slow or silent connections may keep the API server out (monitor/http/
# admission.py): up to 2048 connections are held (a quarter of the fd limit, which serve()
# raises to the hard one), half of them per client address, and at a cap the connection that
# has waited longest for its client is closed to make room; a connection's TLS state is
# only made once its client speaks, for at most 128 at once (the oldest waiting one gives
# way). Memory, against the 128Mi limit (measured: ~36 MiB idle): a connection costs ~180
# KiB with its TLS state (128: 23 MiB), a silent one a few KiB (2048: ~10 MiB), and at most
# max_bodies bodies over 64 KiB, of up to 4 MiB, are read, held and answered at once (each
# connection may hold a smaller one: 8 MiB; a virt-launcher pod's review is ~10-30 KiB, so
# the API server's never wait behind large ones); reviews are parsed in turn
# (docs/threat-model.md has the budget).
LIMITS = http.Limits(max_connections=2048, max_header_bytes=16384, max_body_bytes=4 * 2**20,
                     request_timeout=5.0, idle_timeout=30.0, max_requests_per_connection=1000,
                     handshake_timeout=1.0, max_per_source=1024, max_sessions=128,
                     max_bodies=4, body_timeout=2.0, small_body_bytes=64 * 1024)
ADMISSION_API = "admission.k8s.io/v1"
# Bounds on one review's cost, far above any pod the API server accepts for a VM (a
# virt-launcher pod has a few dozen containers and a patch of a few KiB per virtiofs one).
MAX_JSON_VALUES = 200_000
MAX_CONTAINERS = 256
MAX_PATCH_BYTES = 1 * 2**20
MAX_UID_CHARS = 128


class BadReview(ValueError):
    """The body is not an AdmissionReview we can answer; the message says why."""


@dataclass(frozen=True, slots=True)
class Review:
    uid: str
    pod: Any  # request.object; None for operations without one (DELETE, CONNECT)
    operation: str


def _short(value: Any) -> str:
    """A value for a message: its repr, cut (the message is answered and logged)."""
    text = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def json_values_at_most(body: bytes) -> int:
    """An upper bound on the JSON values and keys in `body` (every one but the first follows
    a comma, a colon or an opening bracket; those inside strings count too)."""
    return (body.count(b",") + body.count(b":") + body.count(b"[") + body.count(b"{") + 1)


def parse_review(body: bytes) -> Review:
    """The parts of an AdmissionReview v1 request the webhook uses; BadReview otherwise."""
    if (values := json_values_at_most(body)) > MAX_JSON_VALUES:
        raise BadReview(f"the review has up to {values} JSON values, more than the "
                        f"{MAX_JSON_VALUES} a pod review needs")
    try:
        review = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadReview(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise BadReview("body is not JSON we read: nested too deeply") from None
    except ValueError as exc:  # an integer beyond Python's int_max_str_digits
        raise BadReview(f"body is not JSON we read: {exc}") from None
    if not isinstance(review, dict):
        raise BadReview("an AdmissionReview is a JSON object")
    if review.get("apiVersion") != ADMISSION_API or review.get("kind") != "AdmissionReview":
        raise BadReview(f"expected apiVersion {ADMISSION_API} and kind AdmissionReview, got "
                        f"{_short(review.get('apiVersion'))} {_short(review.get('kind'))}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing")
    if len(uid) > MAX_UID_CHARS:  # echoed and logged: an API server sends a UUID
        raise BadReview(f"request.uid is longer than {MAX_UID_CHARS} characters")
    pod = request.get("object")
    if pod is not None and not isinstance(pod, dict):
        raise BadReview("request.object is not an object")
    operation = request.get("operation")
    return Review(uid, pod, operation if isinstance(operation, str) else "")


class _Unchanged(Exception):
    """The pod is allowed unchanged; the message (a warning for the API client) says why."""


def review_response(review: Review, settings: Settings) -> dict[str, Any]:
    """allowed: true, with the patch when the pod has something for fhmon.

    Only a CREATE (the exact string) is patched: any other operation, or none, is allowed
    unchanged. A pod beyond this webhook's bounds is allowed unchanged with a warning.
    """
    response: dict[str, Any] = {"uid": review.uid, "allowed": True}
    if review.operation == "CREATE" and review.pod is not None and (
            review.pod.get("kind", "Pod") == "Pod"):
        try:
            patch = _bounded_patch(review.pod, settings)
        except _Unchanged as why:
            log.event("webhook_pod_unchanged", logging.WARNING, uid=review.uid, reason=str(why))
            response["warnings"] = [f"fhmon: pod left unchanged: {why}"]
        else:
            if patch:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(patch).decode("ascii")
    return {"apiVersion": ADMISSION_API, "kind": "AdmissionReview", "response": response}


def _bounded_patch(pod: dict[str, Any], settings: Settings) -> bytes:
    """The pod's JSON Patch as compact JSON (b"" for none), within MAX_CONTAINERS and
    MAX_PATCH_BYTES; _Unchanged beyond them. Operations are serialised one by one so that a
    patch over the bound is given up before it is all in memory."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if isinstance(containers, list) and len(containers) > MAX_CONTAINERS:
        raise _Unchanged(f"{len(containers)} containers, more than the {MAX_CONTAINERS} "
                         "this webhook looks at")
    pieces: list[bytes] = []
    size = 2
    for op in plan_pod(pod, settings):
        piece = json.dumps(op.as_json_patch(), separators=(",", ":")).encode()
        size += len(piece) + 1
        if size > MAX_PATCH_BYTES:
            raise _Unchanged(f"its patch would exceed {MAX_PATCH_BYTES} bytes")
        pieces.append(piece)
    return b"[" + b",".join(pieces) + b"]" if pieces else b""


def make_handler(settings: Settings, certificates: CertificateFiles) -> http.Handler:
    async def mutate(request: Request) -> Response:
        try:
            review = parse_review(request.body)
        except BadReview as exc:
            log.event("webhook_bad_review", logging.WARNING, error=str(exc))
            return http.text(400, str(exc))
        try:
            answer = review_response(review, settings)
        except RecursionError:  # an object nested deeper than the API server would send
            log.event("webhook_bad_review", logging.WARNING, error="nested too deeply")
            return http.text(400, "request.object is nested too deeply")
        except Exception:
            # A pod shape the plan does not expect is a bug of ours (the property test in
            # tests/unit/test_kubevirt_webhook.py looks for them), but the pod itself is
            # allowed unchanged, as failurePolicy: Ignore would: fhmon is not a gate.
            log.event("webhook_review_failed", logging.ERROR, exc_info=True, uid=review.uid)
            answer = {"apiVersion": ADMISSION_API, "kind": "AdmissionReview",
                      "response": {"uid": review.uid, "allowed": True}}
        patched = "patch" in answer["response"]
        log.event("webhook_reviewed", logging.DEBUG, uid=review.uid, patched=patched)
        return Response(200, json.dumps(answer).encode(), content_type="application/json")

    async def healthz(request: Request) -> Response:
        return http.text(200, "ok")

    async def readyz(request: Request) -> Response:
        problem = certificates.problem()
        return http.text(503, problem) if problem else http.text(200, "ok")

    return http.route({"/mutate": {"POST": mutate}, "/healthz": {"GET": healthz},
                       "/readyz": {"GET": readyz}})


class CertificateFiles:
    """The server's TLS context from a certificate and key file, re-loaded when they change.

    Called for every new connection (monitor.http's ssl_context); a stat() of both files
    tells whether to load again (inode, size, mtime: a Secret volume swaps a symlink, an
    in-place rewrite changes the mtime).
    """

    def __init__(self, cert: str, key: str) -> None:
        self.cert = cert
        self.key = key
        self._signature: tuple[Any, ...] | None = None
        self._context: ssl.SSLContext | None = None
        self._problem: str | None = None
        self.loads = 0
        self()  # fail at start-up, not at the first connection
        if self._context is None:
            raise OSError(f"cannot load the TLS certificate: {self._problem}")

    def _stat(self) -> tuple[Any, ...]:
        out: list[Any] = []
        for path in (self.cert, self.key):
            st = os.stat(path)
            out += [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
        return tuple(out)

    def __call__(self) -> ssl.SSLContext:
        try:
            signature = self._stat()
        except OSError as exc:
            self._problem = f"{exc.filename}: {exc.strerror}"
            if self._context is None:
                raise
            return self._context  # files gone for a moment (a swap): keep serving
        if signature != self._signature or self._context is None:
            try:
                context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                context.load_cert_chain(self.cert, self.key)
            except (OSError, ssl.SSLError) as exc:
                self._problem = f"cannot load {self.cert} / {self.key}: {exc}"
                log.event("webhook_certificate_failed", logging.WARNING, error=self._problem)
                if self._context is None:
                    raise
                return self._context
            self._context = context
            self._signature = signature
            self._problem = None
            self.loads += 1
            if self.loads > 1:
                log.event("webhook_certificate_reloaded", cert=self.cert)
        return self._context

    def problem(self) -> str | None:
        """Why the current files do not load (None when they do)."""
        try:
            self()
        except (OSError, ssl.SSLError) as exc:
            return str(exc)
        return self._problem


async def serve(address: str, certificates: CertificateFiles,
                settings: Settings = DEFAULT_SETTINGS, limits: http.Limits = LIMITS,
                task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED,
                ) -> None:
    http.raise_fd_limit()  # a silent connection is cheap, but it is an fd
    await http.serve(make_handler(settings, certificates), address, name="webhook",
                     limits=limits, ssl_context=certificates, task_status=task_status)
