"""deploy/ for KubeVirt: the webhook's objects agree with each other, with the DaemonSet and with
what `fhmon inject` puts into virt-launcher pods. Offline, like test_manifests.py (whose
renderer and schema checks also cover these files)."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml

from monitor.kubevirt import containers, inject, webhook
from tests.deploy.flags import ds_socket, run_fhmon
from tests.deploy.render import K8S_VERSIONS, NAMESPACE, OVERLAYS, key, one, render
from tests.support.kubevirt import LAUNCHER_POD

OVERLAY = OVERLAYS / "kubevirt"


@pytest.fixture(scope="module")
def overlay() -> list[dict[str, Any]]:
    return render(OVERLAY)


def named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def webhook_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def check_webhook(objs: list[dict[str, Any]]) -> list[str]:
    """Cross-references between the webhook's Deployment, PDB, Service, MWC and Certificate."""
    problems: list[str] = []
    deployment = named(objs, "Deployment", "fhmon-webhook")
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    container = webhook_container(deployment)
    args = container["args"]
    if args[0] != "webhook":
        problems.append("the container does not run `fhmon webhook`")
    if deployment["spec"]["replicas"] < 2:
        problems.append("fewer than 2 replicas")
    pdb = named(objs, "PodDisruptionBudget", "fhmon-webhook")
    if not set(pdb["spec"]["selector"]["matchLabels"].items()) <= set(labels.items()):
        problems.append("the PodDisruptionBudget selects no webhook pod")
    if not 0 < pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]:
        problems.append("the PodDisruptionBudget allows no drain or protects nothing")
    service = named(objs, "Service", "fhmon-webhook")
    if not set(service["spec"]["selector"].items()) <= set(labels.items()):
        problems.append("the Service selects no webhook pod")
    (port,) = container["ports"]
    listen_port = int(flag(args, "--address").rpartition(":")[2])
    if port["containerPort"] != listen_port:
        problems.append("containerPort is not the --address port")
    (service_port,) = service["spec"]["ports"]
    if service_port["targetPort"] not in (port["name"], port["containerPort"]):
        problems.append("the Service's targetPort is not the webhook's port")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        if get["path"] != path or get["scheme"] != "HTTPS" or get["port"] != port["name"]:
            problems.append(f"{probe} does not ask {path} over HTTPS on the webhook's port")
    # Certificates: the flags point into the Secret volume the Certificate fills.
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "tls")
    for name in ("--tls-cert", "--tls-key"):
        if not flag(args, name).startswith(mount["mountPath"] + "/"):
            problems.append(f"{name} is not in the certificate volume")
    certificates = [o for o in objs if o["kind"] == "Certificate"]
    for certificate in certificates:
        if certificate["spec"]["secretName"] != volume["secret"]["secretName"]:
            problems.append("the Certificate fills another Secret than the webhook mounts")
        dns = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
        if dns not in certificate["spec"]["dnsNames"]:
            problems.append(f"the certificate does not name {dns}")
    # The image the injected init container copies the launcher from is this image.
    if flag(args, "--image") != container["image"]:
        problems.append("--image is not the webhook's own (rendered) image")
    # Two configurations call that Service, on that port, at /mutate: the optional
    # improvement (Ignore) for every virt-launcher pod but those that opted in to migrating
    # by handle, and the gate (Fail) for exactly those.
    mwc = named(objs, "MutatingWebhookConfiguration", "fhmon")
    migration = named(objs, "MutatingWebhookConfiguration", "fhmon-migration")
    (hook,) = mwc["webhooks"]
    (gate,) = migration["webhooks"]
    for config in (hook, gate):
        target = config["clientConfig"]["service"]
        if (target["namespace"], target["name"]) != (service["metadata"]["namespace"],
                                                     service["metadata"]["name"]):
            problems.append("the webhook configuration calls another Service")
        if target.get("port", 443) != service_port["port"] or target["path"] != "/mutate":
            problems.append("the webhook configuration calls another port or path")
        if config["sideEffects"] != "None" or not 1 <= config["timeoutSeconds"] <= 10:
            problems.append("sideEffects must be None and timeoutSeconds 1..10")
        if config["rules"] != [{"operations": ["CREATE"], "apiGroups": [""],
                                "apiVersions": ["v1"], "resources": ["pods"],
                                "scope": "Namespaced"}]:
            problems.append("the rules must be pod CREATE only")
    # A review must be read and answered while the API server still waits for it (the
    # webhook's bounds, monitor/kubevirt/webhook.py, were sized for its 5 s).
    for config in (hook, gate):
        if webhook.LIMITS.request_timeout > config["timeoutSeconds"]:
            problems.append("the webhook's request timeout is longer than timeoutSeconds")
    if hook["failurePolicy"] != "Ignore":
        problems.append("failurePolicy must be Ignore (docs/kubevirt.md)")
    if gate["failurePolicy"] != "Fail":
        problems.append("the migration opt-in's failurePolicy must be Fail")
    problems += check_selectors(hook["objectSelector"], gate["objectSelector"])
    for config in (mwc, migration):
        injected_from = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        for certificate in certificates:
            if injected_from != f"{certificate['metadata']['namespace']}/" \
                                f"{certificate['metadata']['name']}":
                problems.append("cert-manager.io/inject-ca-from names another Certificate")
    return problems


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions) applied as the API server does."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get(
            "values", [])
        present = key in labels
        if not {"In": present and labels[key] in values,
                "NotIn": not present or labels[key] not in values,
                "Exists": present, "DoesNotExist": not present}[operator]:
            return False
    return True


LABEL_SETS = [
    {},
    {"kubevirt.io": "virt-launcher"},
    {"kubevirt.io": "virt-launcher", containers.MIGRATION_LABEL: containers.MIGRATION_BY_HANDLE},
    {"kubevirt.io": "virt-launcher", containers.MIGRATION_LABEL: "find-paths"},
    {"kubevirt.io": "virt-handler", containers.MIGRATION_LABEL: containers.MIGRATION_BY_HANDLE},
    {containers.MIGRATION_LABEL: containers.MIGRATION_BY_HANDLE},
]


def check_selectors(improvement: dict[str, Any], gate: dict[str, Any]) -> list[str]:
    """Every virt-launcher pod is shown to exactly one configuration, and the gate gets
    exactly the pods the injection migrates by handle."""
    problems: list[str] = []
    for labels in LABEL_SETS:
        launcher = labels.get("kubevirt.io") == "virt-launcher"
        by_handle = labels.get(containers.MIGRATION_LABEL) == containers.MIGRATION_BY_HANDLE
        shown = (selects(improvement, labels), selects(gate, labels))
        if shown != (launcher and not by_handle, launcher and by_handle):
            problems.append(f"objectSelector: pod labels {labels} go to {shown}")
    return problems


def test_overlay_adds_the_webhook(overlay: list[dict[str, Any]]) -> None:
    added = {key(o) for o in overlay} - {key(o) for o in render(OVERLAYS.parent / "base")}
    assert added == {
        ("ServiceAccount", NAMESPACE, "fhmon-webhook"),
        ("Deployment", NAMESPACE, "fhmon-webhook"),
        ("PodDisruptionBudget", NAMESPACE, "fhmon-webhook"),
        ("Service", NAMESPACE, "fhmon-webhook"),
        ("MutatingWebhookConfiguration", "", "fhmon"),
        ("MutatingWebhookConfiguration", "", "fhmon-migration"),
        ("Issuer", NAMESPACE, "fhmon-selfsigned"),
        ("Certificate", NAMESPACE, "fhmon-webhook"),
    }


def test_webhook_objects_agree(overlay: list[dict[str, Any]]) -> None:
    assert check_webhook(overlay) == []


def test_webhook_flags_exist() -> None:
    result = run_fhmon("webhook", "--help")
    assert result.returncode == 0, result.stderr
    for name in ("--address", "--tls-cert", "--tls-key", "--image"):
        assert name in result.stdout


def test_injected_pod_fits_the_cluster(overlay: list[dict[str, Any]]) -> None:
    """What the webhook puts into a virt-launcher pod points at what the DaemonSet serves, and
    the result is a valid Pod for every Kubernetes version the manifests target."""
    daemonset = one(overlay, "DaemonSet")
    args = webhook_container(named(overlay, "Deployment", "fhmon-webhook"))["args"]
    settings = containers.Settings(image=flag(args, "--image"))
    assert settings.socket == ds_socket(daemonset)
    pod = yaml.safe_load(inject.inject(LAUNCHER_POD, settings))
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)
    init = next(c for c in pod["spec"]["initContainers"] if c["name"] == containers.LAUNCHER_INIT)
    assert init["image"] == webhook_container(named(overlay, "Deployment",
                                                    "fhmon-webhook"))["image"]


def test_self_signed_overlay_is_the_webhook_without_cert_manager(
        overlay: list[dict[str, Any]]) -> None:
    self_signed = render(OVERLAYS / "kubevirt-self-signed")
    assert {key(o) for o in overlay} - {key(o) for o in self_signed} == {
        ("Issuer", NAMESPACE, "fhmon-selfsigned"), ("Certificate", NAMESPACE, "fhmon-webhook")}
    assert check_webhook(self_signed) == []
    text = (OVERLAYS.parents[1] / "docs" / "kubevirt.md").read_text()
    for needed in ("create secret tls fhmon-webhook-tls", "clientConfig/caBundle",
                   "kubectl apply -k deploy/overlays/kubevirt-self-signed",
                   "kubectl apply -k deploy/overlays/kubevirt"):
        assert needed in text, needed


# Each check catches a broken copy.


@pytest.mark.parametrize("breakage, message", [
    (lambda o: named(o, "Deployment", "fhmon-webhook")["spec"].update(replicas=1), "replicas"),
    (lambda o: named(o, "PodDisruptionBudget", "fhmon-webhook")["spec"].update(minAvailable=2),
     "drain"),
    (lambda o: named(o, "Service", "fhmon-webhook")["spec"]["ports"][0].update(port=8443),
     "port or path"),
    (lambda o: named(o, "MutatingWebhookConfiguration", "fhmon")["webhooks"][0].update(
        failurePolicy="Fail"), "failurePolicy"),
    (lambda o: named(o, "MutatingWebhookConfiguration", "fhmon")["webhooks"][0].update(
        objectSelector={}), "objectSelector"),
    (lambda o: named(o, "MutatingWebhookConfiguration", "fhmon")["webhooks"][0][
        "objectSelector"].pop("matchExpressions"), "objectSelector"),
    (lambda o: named(o, "MutatingWebhookConfiguration", "fhmon-migration")["webhooks"][0].update(
        failurePolicy="Ignore"), "Fail"),
    (lambda o: named(o, "MutatingWebhookConfiguration", "fhmon-migration")["webhooks"][0][
        "clientConfig"]["service"].update(path="/other"), "port or path"),
    (lambda o: named(o, "Certificate", "fhmon-webhook")["spec"].update(secretName="other"),
     "another Secret"),
    (lambda o: webhook_container(named(o, "Deployment", "fhmon-webhook"))["args"].__setitem__(
        -1, "fhmon:old"), "--image"),
])
def test_negative_webhook(overlay: list[dict[str, Any]], breakage: Any, message: str) -> None:
    objs = copy.deepcopy(overlay)
    breakage(objs)
    assert any(message in p for p in check_webhook(objs)), check_webhook(objs)


def check_device_plugin(daemonset: dict[str, Any]) -> list[str]:
    """The DaemonSet's device plugin serves the resource the injection requests, mounts the
    directory of the socket the injection connects to, and reaches the kubelet's socket."""
    problems: list[str] = []
    spec = daemonset["spec"]["template"]["spec"]
    plugins = [c for c in spec["containers"] if c["name"] == "device-plugin"]
    if len(plugins) != 1:
        return ["no device-plugin container"]
    (plugin,) = plugins
    args = plugin["args"]
    if args[0] != "device-plugin":
        problems.append("the container does not run `fhmon device-plugin`")
    settings = containers.Settings()
    if flag(args, "--resource") != settings.resource:
        problems.append("--resource is not the resource fhmon inject requests")
    socket = ds_socket(daemonset)
    if flag(args, "--socket-dir") != socket.rpartition("/")[0]:
        problems.append("--socket-dir is not the directory of fhmon's socket")
    volumes = {v["name"]: v for v in spec["volumes"]}
    paths = {m["mountPath"]: volumes[m["name"]] for m in plugin["volumeMounts"]}
    kubelet = paths.get("/var/lib/kubelet/device-plugins", {}).get("hostPath", {})
    if kubelet.get("path") != "/var/lib/kubelet/device-plugins":
        problems.append("the kubelet's device-plugins directory is not mounted")
    sockets = paths.get(flag(args, "--socket-dir"), {}).get("hostPath", {})
    if sockets.get("path") != socket.rpartition("/")[0]:
        problems.append("fhmon's socket directory is not mounted where --socket-dir says")
    if plugin["securityContext"]["capabilities"] != {"drop": ["ALL"]}:
        problems.append("the device plugin needs no capability")
    return problems


def test_device_plugin_in_the_daemonset(overlay: list[dict[str, Any]]) -> None:
    assert check_device_plugin(one(overlay, "DaemonSet")) == []
    result = run_fhmon("device-plugin", "--help")
    assert result.returncode == 0, result.stderr
    for name in ("--resource", "--socket-dir", "--plugin-dir", "--devices"):
        assert name in result.stdout


def test_negative_device_plugin(overlay: list[dict[str, Any]]) -> None:
    daemonset = copy.deepcopy(one(overlay, "DaemonSet"))
    (plugin,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "device-plugin"]
    plugin["args"][plugin["args"].index("--resource") + 1] = "example.com/other"
    plugin["args"][plugin["args"].index("--socket-dir") + 1] = "/run/other"
    plugin["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    problems = check_device_plugin(daemonset)
    assert len(problems) == 4, problems


def test_openshift_overlay_is_the_webhook_in_openshift_cnv_on_cri_o(
        overlay: list[dict[str, Any]]) -> None:
    """The namespace is one line of a kustomization: every reference to it (the webhook
    configurations' Service, the CA injector's Certificate, the certificate's names) follows."""
    openshift = render(OVERLAYS / "openshift")
    assert check_webhook(openshift) == []
    # the same objects, and the SCC with its binding (tests/deploy/test_openshift_scc.py)
    assert {key(o)[0::2] for o in openshift} == {key(o)[0::2] for o in overlay} | {
        ("SecurityContextConstraints", "fhmon"), ("ClusterRole", "fhmon-scc"),
        ("RoleBinding", "fhmon-scc")}
    for config in (o for o in openshift if o["kind"] == "MutatingWebhookConfiguration"):
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
            "openshift-cnv/fhmon-webhook"
        assert {w["clientConfig"]["service"]["namespace"] for w in config["webhooks"]} == {
            "openshift-cnv"}
    assert named(openshift, "Certificate", "fhmon-webhook")["spec"]["dnsNames"] == [
        "fhmon-webhook.openshift-cnv.svc", "fhmon-webhook.openshift-cnv.svc.cluster.local"]
    args = webhook_container(named(openshift, "Deployment", "fhmon-webhook"))["args"]
    assert "--runtime=cri-o" in args
    assert "kubevirt.svc" not in yaml.safe_dump_all(openshift)
    result = run_fhmon(*args[:1], "--help")
    assert "--runtime" in result.stdout and "cri-o" in result.stdout


def test_inject_defaults_to_the_image_deploy_builds(overlay: list[dict[str, Any]]) -> None:
    """`fhmon inject` without --image names a full reference, the one deploy/ builds and the
    rendered webhook runs (registry/name:tag, not a bare name a node would pull from
    docker.io)."""
    image = webhook_container(named(overlay, "Deployment", "fhmon-webhook"))["image"]
    assert containers.DEFAULT_IMAGE == image == "localhost/fhmon:latest"
    assert "localhost/fhmon:latest" in (OVERLAYS.parent / "Containerfile").read_text()
    pod = yaml.safe_load(inject.inject(LAUNCHER_POD))
    assert pod["spec"]["initContainers"][-1]["image"] == image
    result = run_fhmon("inject", "--help")
    assert "localhost/fhmon:latest" in result.stdout
