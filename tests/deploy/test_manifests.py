"""Offline checks of deploy/: Kubernetes schemas, cross-references, image recipe, systemd unit.

No cluster is needed. The kustomizations are rendered by the small renderer below (no PyPI
package renders kustomize offline); where `kubectl` is installed its built-in kustomize renders
them too and both results must agree. Every manifest is validated against the OpenAPI schemas
shipped by the `kubernetes-validate` package, in strict mode (unknown fields fail).

The cross-reference checks are functions returning a list of problems, so that the negative
tests at the end can show that each of them catches a broken copy.
"""

from __future__ import annotations

import configparser
import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any, cast

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BASE = DEPLOY / "base"
EXAMPLES = DEPLOY / "examples"
COMPONENTS = DEPLOY / "components"
OVERLAYS = DEPLOY / "overlays"
SECCOMP_PROFILE = EXAMPLES / "seccomp" / "virtiofs-notify.json"
LAUNCH_POD = EXAMPLES / "virtiofs-launch-pod.yaml"
LISTENER_POD = EXAMPLES / "virtiofs-listener-pod.yaml"
CONTAINERFILE = DEPLOY / "Containerfile"
SERVICE_UNIT = DEPLOY / "systemd" / "fhmon.service"
DOCS = REPO / "docs" / "deploy.md"

NAMESPACE = "kubevirt"
# The documented contract (docs/deploy.md, comments in daemonset.yaml).
CAPABILITIES = {"SYS_PTRACE", "DAC_READ_SEARCH", "SETUID", "SETGID", "KILL"}
KEY_SECRET = "fhmon-keys"
# kubelet's link to the current files of a Secret volume, whose root is world-writable.
SECRET_DATA = "..data"
CONFIG_MAP = "fhmon-config"
HANDLE_SYSCALLS = {"name_to_handle_at", "open_by_handle_at"}
# `fhmon serve` flags; each takes one value, --allow may repeat.
SERVE_FLAGS = {
    "--socket",
    "--key-dir",
    "--allow",
    "--config",
    "--socket-mode",
    "--socket-group",
    "--metrics-address",
    "--log-level",
    "--keeper",
}
SERVE_REQUIRED = {"--socket", "--key-dir", "--allow"}
# The oldest Kubernetes minor the manifests target (appArmorProfile is a field since 1.30)
# and the newest one kubernetes-validate ships.
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]


# --------------------------------------------------------------------------------------------
# Loading and a kustomize subset renderer

CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
}
WORKLOADS = {"DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job"}
KUSTOMIZATION_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "labels",
    "commonLabels",
    "resources",
    "components",
    "images",
}


def load_docs(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def load_kustomization(directory: Path, kind: str) -> dict[str, Any]:
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert k["kind"] == kind, f"{directory}: expected kind {kind}, got {k['kind']}"
    unsupported = set(k) - KUSTOMIZATION_KEYS
    # A new kustomize feature must be taught to this renderer before it is used.
    assert not unsupported, f"{directory}: renderer does not support {sorted(unsupported)}"
    return cast(dict[str, Any], k)


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    spec: dict[str, Any] | None = None
    if obj["kind"] == "Pod":
        spec = obj["spec"]
    elif obj["kind"] in WORKLOADS:
        spec = obj["spec"]["template"]["spec"]
    return spec


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("initContainers", [])) + list(spec.get("containers", []))


def apply_transformers(objs: list[dict[str, Any]], k: dict[str, Any]) -> None:
    namespace = k.get("namespace")
    if namespace:
        for obj in objs:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = namespace

    label_sets = list(k.get("labels", []))
    if k.get("commonLabels"):
        label_sets.append({"pairs": k["commonLabels"], "includeSelectors": True})
    for entry in label_sets:
        pairs = entry["pairs"]
        selectors = entry.get("includeSelectors", False)
        templates = selectors or entry.get("includeTemplates", False)
        for obj in objs:
            obj["metadata"].setdefault("labels", {}).update(pairs)
            if obj["kind"] in WORKLOADS:
                if templates:
                    meta = obj["spec"]["template"].setdefault("metadata", {})
                    meta.setdefault("labels", {}).update(pairs)
                if selectors:
                    obj["spec"]["selector"].setdefault("matchLabels", {}).update(pairs)
            if obj["kind"] == "Service" and selectors:
                obj["spec"].setdefault("selector", {}).update(pairs)

    for image in k.get("images", []):
        for obj in objs:
            spec = pod_spec(obj)
            if spec is None:
                continue
            for c in all_containers(spec):
                name = re.split(r"[:@]", c["image"], maxsplit=1)[0]
                if name != image["name"]:
                    continue
                new = image.get("newName", name)
                if "digest" in image:
                    new += "@" + image["digest"]
                elif "newTag" in image:
                    new += ":" + str(image["newTag"])
                else:
                    new = new + c["image"][len(name) :]
                c["image"] = new


def render(directory: Path) -> list[dict[str, Any]]:
    """Render a kustomization: resources (files or directories), components, transformers."""
    k = load_kustomization(directory, "Kustomization")
    objs: list[dict[str, Any]] = []
    for res in k.get("resources", []):
        path = directory / res
        objs += render(path) if path.is_dir() else load_docs(path)
    for comp in k.get("components", []):
        ck = load_kustomization(directory / comp, "Component")
        for res in ck.get("resources", []):
            objs += load_docs(directory / comp / res)
        apply_transformers(objs, ck)
    apply_transformers(objs, k)
    return objs


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected exactly one {kind}, found {len(found)}"
    return found[0]


def kustomization_roots() -> list[Path]:
    return [BASE, *sorted(p for p in OVERLAYS.iterdir() if (p / "kustomization.yaml").exists())]


def write_composite(tmp_path: Path) -> Path:
    """A kustomization of base + every component, to render the components too."""

    def rel(path: Path) -> str:
        return os.path.relpath(path, tmp_path)

    components = sorted(p for p in COMPONENTS.iterdir() if (p / "kustomization.yaml").exists())
    k = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": NAMESPACE,
        "resources": [rel(BASE)],
        "components": [rel(c) for c in components],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(k))
    return tmp_path


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(BASE)


@pytest.fixture(scope="module")
def daemonset(base: list[dict[str, Any]]) -> dict[str, Any]:
    return one(base, "DaemonSet")


@pytest.fixture(scope="module")
def servicemonitor() -> dict[str, Any]:
    return one(render(OVERLAYS / "prometheus-operator"), "ServiceMonitor")


@pytest.fixture(scope="module")
def profile() -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(SECCOMP_PROFILE.read_text()))


@pytest.fixture(scope="module")
def launch_pod() -> dict[str, Any]:
    (pod,) = load_docs(LAUNCH_POD)
    return pod


@pytest.fixture(scope="module")
def listener_pod() -> dict[str, Any]:
    (pod,) = load_docs(LISTENER_POD)
    return pod


@pytest.fixture(scope="module")
def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(SERVICE_UNIT.read_text())
    return parser


# --------------------------------------------------------------------------------------------
# Helpers shared by the checks


def fhmon_container(ds: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "fhmon"]
    return cast(dict[str, Any], c)


def parse_flags(argv: list[str], allowed: set[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Parse `--flag value` pairs; return the values per flag and the problems found."""
    flags: dict[str, list[str]] = {}
    problems: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg not in allowed:
            problems.append(f"unknown or misplaced argument {arg!r}")
            i += 1
            continue
        if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
            problems.append(f"{arg} has no value")
            i += 1
            continue
        flags.setdefault(arg, []).append(argv[i + 1])
        i += 2
    for flag, values in flags.items():
        if flag != "--allow" and len(values) > 1:
            problems.append(f"{flag} given {len(values)} times")
    return flags, problems


def serve_flags(argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    if argv[:1] != ["serve"]:
        return {}, [f"expected `serve` first, got {argv[:1]}"]
    flags, problems = parse_flags(argv[1:], SERVE_FLAGS)
    missing = SERVE_REQUIRED - set(flags)
    if missing:
        problems.append(f"missing required flags {sorted(missing)}")
    return flags, problems


def ds_flags(ds: dict[str, Any]) -> dict[str, list[str]]:
    flags, problems = serve_flags(fhmon_container(ds)["args"])
    assert problems == []
    return flags


def ds_socket(ds: dict[str, Any]) -> str:
    return ds_flags(ds)["--socket"][0]


Mount = tuple[dict[str, Any], dict[str, Any]]


def mount_for(container: dict[str, Any], spec: dict[str, Any], path: str) -> Mount | None:
    """The (volumeMount, volume) whose mountPath is `path` or the deepest one containing it."""
    best: Mount | None = None
    target = PurePosixPath(path)
    for m in container.get("volumeMounts", []):
        mp = PurePosixPath(m["mountPath"])
        inside = target == mp or mp in target.parents
        if inside and (best is None or len(str(mp)) > len(best[0]["mountPath"])):
            vols = [v for v in spec.get("volumes", []) if v["name"] == m["name"]]
            best = (m, vols[0] if vols else {})
    return best


def glob_root(pattern: str) -> str:
    """The directory part of a glob before its first wildcard."""
    parts = []
    for part in PurePosixPath(pattern).parts:
        if any(ch in part for ch in "*?["):
            break
        parts.append(part)
    return str(PurePosixPath(*parts))


def split_launch(command: list[str]) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """`fhmon launch FLAGS -- CMD...` -> (flags, wrapped command, problems)."""
    if command[:2] != ["fhmon", "launch"] or "--" not in command:
        return {}, [], [f"not a `fhmon launch ... -- CMD` command: {command[:3]}"]
    sep = command.index("--")
    flags, problems = parse_flags(command[2:sep], {"--socket", "--share", "--user"})
    for required in ("--socket", "--share"):
        if required not in flags:
            problems.append(f"launch lacks {required}")
    return flags, command[sep + 1 :], problems


def virtiofsd_options(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)


# --------------------------------------------------------------------------------------------
# Checks returning problems (each one is exercised against a broken copy at the end)


def check_volumes(spec: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    volumes = [v["name"] for v in spec.get("volumes", [])]
    if len(volumes) != len(set(volumes)):
        problems.append(f"duplicate volume names {volumes}")
    used = set()
    for c in all_containers(spec):
        for m in c.get("volumeMounts", []):
            used.add(m["name"])
            if m["name"] not in volumes:
                problems.append(f"container {c['name']} mounts unknown volume {m['name']}")
    for unused in set(volumes) - used:
        problems.append(f"volume {unused} is never mounted")
    return problems


def check_refs(ds: dict[str, Any], objs: list[dict[str, Any]]) -> list[str]:
    """Secret, ConfigMap, ServiceAccount and file paths named by the DaemonSet."""
    problems: list[str] = []
    spec = ds["spec"]["template"]["spec"]
    container = fhmon_container(ds)
    flags, flag_problems = serve_flags(container["args"])
    problems += flag_problems
    configmaps = {o["metadata"]["name"]: o for o in by_kind(objs, "ConfigMap")}
    accounts = {o["metadata"]["name"] for o in by_kind(objs, "ServiceAccount")}
    if spec.get("serviceAccountName") not in accounts:
        problems.append(f"serviceAccountName {spec.get('serviceAccountName')} is not rendered")

    key_dir = flags.get("--key-dir", [""])[0]
    found = mount_for(container, spec, key_dir)
    if not found or f"{found[0]['mountPath']}/{SECRET_DATA}" != key_dir:
        problems.append(f"--key-dir {key_dir} is not <secret mount>/{SECRET_DATA}")
    else:
        mount, volume = found
        if volume.get("secret", {}).get("secretName") != KEY_SECRET:
            problems.append(f"--key-dir is not mounted from Secret {KEY_SECRET}")
        if not mount.get("readOnly"):
            problems.append("the key directory must be mounted read-only")

    config = flags.get("--config", [""])[0]
    found = mount_for(container, spec, config)
    if not found or found[0]["mountPath"] != config:
        problems.append(f"--config {config} is not a mount")
    else:
        mount, volume = found
        name = volume.get("configMap", {}).get("name")
        if name != CONFIG_MAP or name not in configmaps:
            problems.append(f"--config comes from ConfigMap {name}, expected rendered {CONFIG_MAP}")
        elif mount.get("subPath") not in configmaps[name].get("data", {}):
            problems.append(f"ConfigMap {name} has no key {mount.get('subPath')}")
        elif mount.get("subPath") != PurePosixPath(config).name:
            problems.append("the ConfigMap key and the config file name differ")
    return problems


def check_socket(ds: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    spec = ds["spec"]["template"]["spec"]
    container = fhmon_container(ds)
    socket = ds_socket(ds)
    socket_dir = str(PurePosixPath(socket).parent)
    found = mount_for(container, spec, socket)
    if not found:
        return [f"socket {socket} is on no volume"]
    mount, volume = found
    host = volume.get("hostPath", {})
    if mount["mountPath"] != socket_dir or host.get("path") != socket_dir:
        problems.append(
            f"socket dir {socket_dir} must be the same path in the pod and on the node "
            f"(mount {mount['mountPath']}, hostPath {host.get('path')})"
        )
    if host.get("type") != "DirectoryOrCreate":
        problems.append("the socket hostPath must be DirectoryOrCreate")
    if mount.get("readOnly"):
        problems.append("the socket directory must be writable")
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        if kind != "startupProbe" and probe is None:
            problems.append(f"{kind} missing")
        elif probe is not None and probe.get("exec", {}).get("command") != [
            "fhmon",
            "probe",
            "--socket",
            socket,
        ]:
            problems.append(f"{kind} does not run `fhmon probe --socket {socket}`")
    return problems


def check_security(ds: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    spec = ds["spec"]["template"]["spec"]
    if spec.get("hostPID") is not True:
        problems.append("hostPID must be true")
    if spec.get("hostNetwork") or spec.get("hostIPC"):
        problems.append("hostNetwork/hostIPC are not needed")
    container = fhmon_container(ds)
    sc = container.get("securityContext", {})
    caps = sc.get("capabilities", {})
    if caps.get("drop") != ["ALL"]:
        problems.append(f"capabilities.drop must be [ALL], got {caps.get('drop')}")
    if set(caps.get("add", [])) != CAPABILITIES or len(caps.get("add", [])) != len(CAPABILITIES):
        problems.append(f"capabilities.add {caps.get('add')} != {sorted(CAPABILITIES)}")
    if sc.get("privileged") is not False:
        problems.append("privileged must be false")
    if sc.get("seccompProfile", {}).get("type") not in ("Unconfined", "RuntimeDefault"):
        problems.append("seccompProfile must be Unconfined or RuntimeDefault")
    for c in spec.get("initContainers", []):
        if c.get("securityContext") != sc:
            problems.append(f"init container {c['name']} runs with another security context")
    return problems


def check_kubelet_mount(ds: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    spec = ds["spec"]["template"]["spec"]
    container = fhmon_container(ds)
    for pattern in ds_flags(ds)["--allow"]:
        found = mount_for(container, spec, glob_root(pattern))
        if not found:
            problems.append(f"--allow {pattern} is on no volume")
            continue
        mount, volume = found
        if volume.get("hostPath", {}).get("path") != mount["mountPath"]:
            problems.append(f"--allow {pattern}: node and pod paths differ")
        if mount.get("mountPropagation") != "HostToContainer":
            problems.append(f"{mount['mountPath']} needs mountPropagation HostToContainer")
        if mount.get("readOnly"):
            problems.append(f"{mount['mountPath']} must be writable (EROFS otherwise)")
    return problems


def check_metrics(
    ds: dict[str, Any], service: dict[str, Any], monitor: dict[str, Any] | None
) -> list[str]:
    problems: list[str] = []
    container = fhmon_container(ds)
    template = ds["spec"]["template"]
    address = ds_flags(ds).get("--metrics-address", [""])[0]
    port = int(address.rsplit(":", 1)[1]) if ":" in address else None
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    if ports.get("metrics") != port:
        problems.append(f"container port 'metrics' {ports.get('metrics')} != {address}")
    annotations = template["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") != "true":
        problems.append("prometheus.io/scrape annotation missing")
    if annotations.get("prometheus.io/port") != str(port):
        problems.append(f"prometheus.io/port {annotations.get('prometheus.io/port')} != {port}")
    (sport,) = [p for p in service["spec"]["ports"] if p["name"] == "metrics"] or [{}]
    if sport.get("port") != port or sport.get("targetPort") not in ("metrics", port):
        problems.append(f"Service port {sport} does not lead to {port}")
    selector = service["spec"].get("selector", {})
    labels = template["metadata"].get("labels", {})
    if not selector or any(labels.get(k) != v for k, v in selector.items()):
        problems.append("the Service selector does not match the pods")
    if monitor is not None:
        endpoints = monitor["spec"]["endpoints"]
        if [e.get("port") for e in endpoints] != ["metrics"]:
            problems.append("the ServiceMonitor does not scrape the port named metrics")
        paths = {e.get("path", "/metrics") for e in endpoints}
        if paths != {annotations.get("prometheus.io/path")}:
            problems.append("the ServiceMonitor and the annotations scrape different paths")
        match = monitor["spec"]["selector"]["matchLabels"]
        slabels = service["metadata"].get("labels", {})
        if any(slabels.get(k) != v for k, v in match.items()):
            problems.append("the ServiceMonitor selector does not match the Service")
        if monitor["metadata"].get("namespace") != service["metadata"].get("namespace"):
            problems.append("the ServiceMonitor is not in the Service's namespace")
    return problems


def check_profile(profile: dict[str, Any], socket: str, share: str) -> list[str]:
    problems: list[str] = []
    if profile.get("defaultAction") != "SCMP_ACT_ALLOW":
        problems.append(f"defaultAction {profile.get('defaultAction')}")
    notified = set()
    for rule in profile.get("syscalls", []):
        if rule.get("action") == "SCMP_ACT_NOTIFY":
            notified |= set(rule["names"])
    if notified != HANDLE_SYSCALLS:
        problems.append(f"SCMP_ACT_NOTIFY for {sorted(notified)} != {sorted(HANDLE_SYSCALLS)}")
    if profile.get("listenerPath") != socket:
        problems.append(f"listenerPath {profile.get('listenerPath')} != fhmon socket {socket}")
    if profile.get("listenerMetadata") != f"share={share}":
        problems.append(f"listenerMetadata {profile.get('listenerMetadata')!r} != 'share={share}'")
    return problems


def check_launch_pod(pod: dict[str, Any], ds: dict[str, Any]) -> list[str]:
    problems = check_volumes(pod["spec"])
    spec = pod["spec"]
    (container,) = spec["containers"]
    flags, wrapped, launch_problems = split_launch(container.get("command", []))
    problems += launch_problems
    if launch_problems:
        return problems
    socket = ds_socket(ds)
    if flags["--socket"] != [socket]:
        problems.append(f"launch --socket {flags['--socket']} != fhmon socket {socket}")
    share = flags["--share"][0]
    if wrapped[:1] != ["/usr/libexec/virtiofsd"]:
        problems.append(f"launch does not wrap virtiofsd: {wrapped[:1]}")
    opts = virtiofsd_options(wrapped)
    if opts.get("shared-dir") != share:
        problems.append(f"--share {share} != virtiofsd --shared-dir {opts.get('shared-dir')}")
    if opts.get("sandbox") != "none":
        problems.append("unprivileged virtiofsd needs --sandbox=none")
    if opts.get("inode-file-handles") not in ("prefer", "mandatory"):
        problems.append("virtiofsd does not use file handles")
    found = mount_for(container, spec, socket)
    ds_spec = ds["spec"]["template"]["spec"]
    ds_found = mount_for(fhmon_container(ds), ds_spec, socket)
    assert ds_found
    if not found or found[1].get("hostPath", {}).get("path") != ds_found[1]["hostPath"]["path"]:
        problems.append("the pod does not mount fhmon's socket directory from the node")
    elif found[0]["mountPath"] != str(PurePosixPath(socket).parent):
        problems.append("the socket directory is mounted at another path than fhmon's")
    if not mount_for(container, spec, share):
        problems.append(f"the share {share} is on no volume")
    # The socket is 0660 with group --socket-group: the pod must run with that group.
    group = ds_flags(ds).get("--socket-group", [None])[0]
    sc = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
    if (
        group is not None
        and str(sc.get("runAsGroup")) != group
        and group not in map(str, sc.get("supplementalGroups", []))
    ):
        problems.append(f"the pod's groups cannot reach the socket (group {group})")
    if container.get("securityContext", {}).get("allowPrivilegeEscalation") is not False:
        problems.append("launch needs allowPrivilegeEscalation: false to install its filter")
    return problems


def check_listener_pod(pod: dict[str, Any], profile_path: Path, share: str) -> list[str]:
    problems = check_volumes(pod["spec"])
    (container,) = pod["spec"]["containers"]
    sp = container.get("securityContext", {}).get("seccompProfile", {})
    if sp.get("type") != "Localhost":
        problems.append("the listener example must use a Localhost seccomp profile")
    local = sp.get("localhostProfile", "")
    if PurePosixPath(local).name != profile_path.name:
        problems.append(f"localhostProfile {local} is not {profile_path.name}")
    opts = virtiofsd_options(container["command"])
    if opts.get("shared-dir") != share:
        problems.append(f"--shared-dir {opts.get('shared-dir')} != profile share {share}")
    if not mount_for(container, pod["spec"], share):
        problems.append(f"the share {share} is on no volume")
    return problems


def check_unit(unit: configparser.ConfigParser, ds: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    service = unit["Service"]
    argv = shlex.split(service.get("ExecStart", ""))
    if not argv or PurePosixPath(argv[0]).name != "fhmon":
        return [f"ExecStart does not run fhmon: {argv[:1]}"]
    flags, flag_problems = serve_flags(argv[1:])
    problems += flag_problems
    if flag_problems:
        return problems
    socket = flags["--socket"][0]
    runtime_dir = service.get("RuntimeDirectory", "")
    if str(PurePosixPath(socket).parent) != f"/run/{runtime_dir}":
        problems.append(f"socket {socket} is not in RuntimeDirectory=/run/{runtime_dir}")
    if flags["--key-dir"] != [ds_flags(ds)["--key-dir"][0].removesuffix(f"/{SECRET_DATA}")]:
        problems.append("the unit and the DaemonSet use different key directories")
    if "--socket-group" not in flags and flags.get("--socket-mode") != ["0600"]:
        problems.append("without --socket-group the socket mode must be 0600")
    bounding = set(service.get("CapabilityBoundingSet", "").split())
    if bounding != {f"CAP_{c}" for c in CAPABILITIES}:
        problems.append(f"CapabilityBoundingSet {sorted(bounding)}")
    if service.get("ProtectSystem") != "strict":
        problems.append("ProtectSystem=strict expected")
    writable = [p.lstrip("-") for p in service.get("ReadWritePaths", "").split()]
    for pattern in flags["--allow"]:
        root = PurePosixPath(glob_root(pattern))
        if not any(root == PurePosixPath(w) or PurePosixPath(w) in root.parents for w in writable):
            problems.append(f"--allow {pattern} is read-only under ProtectSystem=strict")
    for option in ("PrivateUsers", "PrivatePIDs"):
        if service.get(option, "no") not in ("no", "false"):
            problems.append(f"{option} would hide the targets from fhmon")
    if service.get("ProtectProc", "default") != "default":
        problems.append("ProtectProc must stay default (fhmon reads /proc/<pid>)")
    return problems


# --------------------------------------------------------------------------------------------
# Rendering


def test_base_renders_expected_objects(base: list[dict[str, Any]]) -> None:
    assert sorted(key(o) for o in base) == [
        ("ConfigMap", NAMESPACE, CONFIG_MAP),
        ("DaemonSet", NAMESPACE, "fhmon"),
        ("Service", NAMESPACE, "fhmon-metrics"),
        ("ServiceAccount", NAMESPACE, "fhmon"),
    ]
    # The key Secret is created by the operator from `fhmon keygen` output, never shipped.
    assert by_kind(base, "Secret") == []


def test_overlay_adds_servicemonitor_in_namespace(base: list[dict[str, Any]]) -> None:
    overlay = render(OVERLAYS / "prometheus-operator")
    added = {key(o) for o in overlay} - {key(o) for o in base}
    assert added == {("ServiceMonitor", NAMESPACE, "fhmon"), ("PrometheusRule", NAMESPACE, "fhmon")}


@pytest.mark.parametrize("root", kustomization_roots(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_all_objects_labelled_and_namespaced(root: Path) -> None:
    for obj in render(root):
        if obj["kind"] in CLUSTER_SCOPED:
            continue
        assert obj["metadata"]["namespace"] == NAMESPACE, key(obj)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "fhmon", key(obj)


def test_image_is_set_by_kustomization(daemonset: dict[str, Any]) -> None:
    images = {c["image"] for c in all_containers(daemonset["spec"]["template"]["spec"])}
    assert images == {"localhost/fhmon:latest"}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
@pytest.mark.parametrize("root", ["base", "overlays/prometheus-operator", "overlays/kubevirt",
                                  "overlays/kubevirt-self-signed", "composite"])
def test_renderer_agrees_with_kubectl_kustomize(root: str, tmp_path: Path) -> None:
    directory = write_composite(tmp_path) if root == "composite" else DEPLOY / root
    out = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    theirs = sorted(yaml.safe_load_all(out), key=key)
    ours = sorted(render(directory), key=key)
    assert [key(o) for o in ours] == [key(o) for o in theirs]
    assert ours == theirs


# --------------------------------------------------------------------------------------------
# Schemas


def manifest_cases() -> list[tuple[str, dict[str, Any]]]:
    sources: list[tuple[Path, list[dict[str, Any]]]] = [
        (root, render(root)) for root in kustomization_roots()
    ]
    for comp in sorted(COMPONENTS.iterdir()):
        ck = load_kustomization(comp, "Component")
        sources += [(comp, load_docs(comp / res)) for res in ck.get("resources", [])]
    sources += [(path, load_docs(path)) for path in sorted(EXAMPLES.glob("*.yaml"))]
    return [
        (f"{src.relative_to(DEPLOY)}:{obj['kind']}/{obj['metadata']['name']}", obj)
        for src, objs in sources
        for obj in objs
    ]


CASES = manifest_cases()
# Kinds without a schema in kubernetes-validate (custom resources), checked by hand below.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"),
                ("monitoring.coreos.com/v1", "PrometheusRule"),
                ("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name,obj", CASES, ids=[c[0] for c in CASES])
def test_manifest_matches_kubernetes_schema(name: str, obj: dict[str, Any], version: str) -> None:
    if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(obj, version, strict=True)
        return
    kubernetes_validate.validate(obj, version, strict=True)


def test_every_yaml_under_deploy_is_validated() -> None:
    """Each YAML file under deploy/ is a kustomization or a resource the schema test sees."""
    covered = set()
    for root in kustomization_roots() + sorted(COMPONENTS.iterdir()):
        k = yaml.safe_load((root / "kustomization.yaml").read_text())
        covered.add((root / "kustomization.yaml").resolve())
        for res in k.get("resources", []):
            path = (root / res).resolve()
            if path.is_file():
                covered.add(path)
    covered |= {p.resolve() for p in EXAMPLES.glob("*.yaml")}
    on_disk = {p.resolve() for p in DEPLOY.rglob("*.y*ml")}
    assert on_disk - covered == set()


def test_servicemonitor_shape(servicemonitor: dict[str, Any]) -> None:
    spec = servicemonitor["spec"]
    assert set(spec) == {"selector", "endpoints"}
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scheme", "scrapeTimeout"}
        assert re.fullmatch(r"\d+[smh]", endpoint.get("interval", "30s"))


OPERATIONS_DOC = REPO / "docs" / "operations.md"


def exported_metric_names() -> set[str]:
    """Every metric name fhmon serve exports (keeper configured), as Prometheus sees them."""
    from types import SimpleNamespace

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from monitor.metrics import CallStats
    from monitor.prom import Metrics
    from monitor.signing import KeyInfo

    stats = CallStats()
    stats.record("open_by_handle_at", "ok", 1e-5)
    keys = SimpleNamespace(key_ids=(1,), describe=lambda: [KeyInfo(1, True)])
    service = SimpleNamespace(stats=stats, targets={}, keys=keys, key_error=None,
                              config=SimpleNamespace(keeper_socket="/run/keeper.sock"))
    text = generate_latest(Metrics(service).registry).decode()  # type: ignore[arg-type]
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def runbook_anchors() -> set[str]:
    """GitHub's anchors of the "### " headings of docs/operations.md."""
    return {re.sub(r"[^a-z0-9 _-]", "", line[4:].strip().lower()).replace(" ", "-")
            for line in OPERATIONS_DOC.read_text().splitlines() if line.startswith("### ")}


def check_rules(rule_object: dict[str, Any], exported: set[str], anchors: set[str]) -> list[str]:
    problems = []
    spec = rule_object["spec"]
    if set(spec) != {"groups"}:
        problems.append(f"PrometheusRule spec keys {sorted(spec)}")
    for group in spec["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert", "?")
            if set(rule) - {"alert", "expr", "for", "labels", "annotations"}:
                problems.append(f"{name}: unknown keys {sorted(set(rule) - {'alert'})}")
            if not re.fullmatch(r"Fhmon[A-Z][A-Za-z]+", name):
                problems.append(f"{name}: alert names are FhmonCamelCase")
            if not re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))):
                problems.append(f"{name}: 'for' is not a duration")
            if rule.get("labels", {}).get("severity") not in {"warning", "critical"}:
                problems.append(f"{name}: severity is warning or critical")
            notes = rule.get("annotations", {})
            if not {"summary", "description", "runbook"} <= set(notes):
                problems.append(f"{name}: needs summary, description and runbook annotations")
            runbook = str(notes.get("runbook", ""))
            if runbook != f"docs/operations.md#{name.lower()}" or name.lower() not in anchors:
                problems.append(f"{name}: no runbook section '### {name}' in docs/operations.md")
            for metric in re.findall(r"\b(?:fhmon|process)_[a-z_]+", str(rule.get("expr", ""))):
                if metric not in exported:
                    problems.append(f"{name}: fhmon exports no metric {metric}")
    return problems


@pytest.fixture(scope="module")
def prometheusrule() -> dict[str, Any]:
    return one(render(OVERLAYS / "prometheus-operator"), "PrometheusRule")


def test_prometheusrule_alerts(prometheusrule: dict[str, Any]) -> None:
    """The alerts the issue asks for, on metrics fhmon really exports, each with a runbook."""
    assert check_rules(prometheusrule, exported_metric_names(), runbook_anchors()) == []
    alerts = {r["alert"] for g in prometheusrule["spec"]["groups"] for r in g["rules"]}
    assert {"FhmonKeyDirUnhealthy", "FhmonMacFailuresRising", "FhmonRegistrationsRefused",
            "FhmonDataPlaneSaturated"} <= alerts


def test_negative_rules(prometheusrule: dict[str, Any]) -> None:
    exported, anchors = exported_metric_names(), runbook_anchors()
    rule = broken(prometheusrule)
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "fhmon_no_such_metric > 0"
    assert any("no metric fhmon_no_such_metric" in p for p in check_rules(rule, exported, anchors))
    rule = broken(prometheusrule)
    rule["spec"]["groups"][0]["rules"][0]["alert"] = "FhmonWithoutRunbook"
    assert any("no runbook section" in p for p in check_rules(rule, exported, anchors))
    rule = broken(prometheusrule)
    del rule["spec"]["groups"][0]["rules"][0]["labels"]
    assert any("severity" in p for p in check_rules(rule, exported, anchors))


# --------------------------------------------------------------------------------------------
# Cross-references in the DaemonSet


def test_daemonset_volumes(daemonset: dict[str, Any]) -> None:
    assert check_volumes(daemonset["spec"]["template"]["spec"]) == []


def test_daemonset_references(daemonset: dict[str, Any], base: list[dict[str, Any]]) -> None:
    assert check_refs(daemonset, base) == []


def test_daemonset_socket_and_probes(daemonset: dict[str, Any]) -> None:
    assert ds_socket(daemonset) == "/var/run/kubevirt/fhmon/fhmon.sock"
    assert check_socket(daemonset) == []


def test_daemonset_security(daemonset: dict[str, Any]) -> None:
    assert check_security(daemonset) == []


def test_daemonset_share_globs(daemonset: dict[str, Any]) -> None:
    globs = ds_flags(daemonset)["--allow"]
    assert globs == [
        "/var/lib/kubelet/pods/*/volumes/kubernetes.io~csi/*/mount",
        "/var/lib/kubelet/pods/*/volumes/kubernetes.io~empty-dir/*",
    ]
    assert check_kubelet_mount(daemonset) == []


def test_daemonset_metrics(
    daemonset: dict[str, Any], base: list[dict[str, Any]], servicemonitor: dict[str, Any]
) -> None:
    assert ds_flags(daemonset)["--metrics-address"] == ["0.0.0.0:9464"]
    assert check_metrics(daemonset, one(base, "Service"), servicemonitor) == []


def test_daemonset_scheduling_and_resources(daemonset: dict[str, Any]) -> None:
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "kubevirt-cluster-critical"
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in spec["tolerations"]
    assert {"operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    for c in all_containers(spec):
        assert c["resources"] == {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"memory": "256Mi"},
        }, c["name"]
    assert spec["automountServiceAccountToken"] is False


def check_like_virt_handler(ds: dict[str, Any]) -> list[str]:
    """What KubeVirt's own node agent does and fhmon's DaemonSet must do too."""
    problems: list[str] = []
    template = ds["spec"]["template"]
    spec = template["spec"]
    for c in all_containers(spec):
        limits = c.get("resources", {}).get("limits", {})
        if "cpu" in limits:
            problems.append(f"{c['name']}: a CPU limit throttles the guests' syscall path")
        if "cpu" not in c.get("resources", {}).get("requests", {}):
            problems.append(f"{c['name']}: no CPU request")
        if c.get("terminationMessagePolicy") != "FallbackToLogsOnError":
            problems.append(f"{c['name']}: terminationMessagePolicy is not "
                            f"FallbackToLogsOnError")
    if template["metadata"].get("labels", {}).get("prometheus.kubevirt.io") != "true":
        problems.append('pod label prometheus.kubevirt.io: "true" missing')
    if spec.get("nodeSelector", {}).get("kubernetes.io/os") != "linux":
        problems.append("nodeSelector kubernetes.io/os: linux missing")
    return problems


def check_init_matches_server(ds: dict[str, Any]) -> list[str]:
    """The init container checks the key directory, socket and globs the server uses."""
    spec = ds["spec"]["template"]["spec"]
    (init,) = [c for c in spec.get("initContainers", []) if c["name"] == "check"]
    args = init.get("args", [])
    if args[:1] != ["check"]:
        return ["the init container does not run `fhmon check`"]
    flags, rest = parse_flags(args[1:], {"--key-dir", "--socket", "--allow"})
    problems = [f"unexpected check arguments {rest}"] if rest else []
    served = ds_flags(ds)
    for flag in ("--key-dir", "--socket", "--allow"):
        if flags.get(flag) != served.get(flag):
            problems.append(f"check {flag} {flags.get(flag)} != serve {flag} "
                            f"{served.get(flag)}")
    mounts = {(m["name"], m["mountPath"]) for m in init.get("volumeMounts", [])}
    server_mounts = {(m["name"], m["mountPath"]) for m in fhmon_container(ds)["volumeMounts"]}
    for path in (flags.get("--key-dir", [""])[0], flags.get("--socket", [""])[0]):
        if not any(path.startswith(mp + "/") and (n, mp) in server_mounts for n, mp in mounts):
            problems.append(f"the init container does not mount {path} as the server does")
    return problems


def check_rolling_update(ds: dict[str, Any], containerfile: str) -> list[str]:
    """A rolling upgrade is SIGTERM to the old fhmon, then a new one (what
    tests/kernel/test_rolling_upgrade.py plays); one node at a time, never two at once."""
    problems: list[str] = []
    strategy = ds["spec"].get("updateStrategy", {})
    if strategy.get("type") != "RollingUpdate":
        problems.append(f"updateStrategy {strategy.get('type')}, not RollingUpdate")
    rolling = strategy.get("rollingUpdate", {})
    if rolling.get("maxUnavailable") != 1:
        problems.append("rollingUpdate.maxUnavailable is not 1")
    if rolling.get("maxSurge", 0) != 0:
        problems.append("rollingUpdate.maxSurge would run two fhmon on one node's socket")
    if "lifecycle" in fhmon_container(ds):
        problems.append("a lifecycle hook changes how fhmon is stopped")
    if re.search(r"(?im)^\s*STOPSIGNAL\b", containerfile):
        problems.append("the image's STOPSIGNAL is not SIGTERM")
    if ds["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30) < 10:
        problems.append("terminationGracePeriodSeconds leaves fhmon no time to close")
    return problems


def test_daemonset_like_virt_handler(daemonset: dict[str, Any]) -> None:
    assert check_like_virt_handler(daemonset) == []


def test_daemonset_init_checks_what_the_server_uses(daemonset: dict[str, Any]) -> None:
    assert check_init_matches_server(daemonset) == []


def test_daemonset_rolls_one_node_at_a_time_with_sigterm(daemonset: dict[str, Any]) -> None:
    assert check_rolling_update(daemonset, CONTAINERFILE.read_text()) == []


@pytest.mark.parametrize("breakage", ["cpu-limit", "policy", "label", "os", "init-key-dir",
                                      "init-socket", "on-delete", "surge", "prestop"])
def test_operating_checks_catch_a_broken_copy(daemonset: dict[str, Any], breakage: str) -> None:
    ds = copy.deepcopy(daemonset)
    spec = ds["spec"]["template"]["spec"]
    server = fhmon_container(ds)
    (init,) = spec["initContainers"]
    match breakage:
        case "cpu-limit":
            server["resources"]["limits"]["cpu"] = "500m"
        case "policy":
            del spec["containers"][-1]["terminationMessagePolicy"]
        case "label":
            del ds["spec"]["template"]["metadata"]["labels"]["prometheus.kubevirt.io"]
        case "os":
            del spec["nodeSelector"]
        case "init-key-dir":
            init["args"] = [a for a in init["args"] if not a.startswith("/etc/fhmon")]
            init["args"].remove("--key-dir")
        case "init-socket":
            init["args"][init["args"].index("--socket") + 1] = "/run/other.sock"
        case "on-delete":
            ds["spec"]["updateStrategy"] = {"type": "OnDelete"}
        case "surge":
            ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] = 1
        case "prestop":
            server["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    problems = (check_like_virt_handler(ds) + check_init_matches_server(ds)
                + check_rolling_update(ds, CONTAINERFILE.read_text()))
    assert problems, breakage


def test_key_secret_mode_is_private(daemonset: dict[str, Any]) -> None:
    (vol,) = [v for v in daemonset["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert vol["secret"]["defaultMode"] == 0o400


def secret_volume_layout(root: Path, files: dict[str, bytes], mode: int) -> None:
    """Lay out files the way kubelet's atomic writer fills a Secret volume."""
    root.mkdir()
    root.chmod(0o777)  # an emptyDir-style tmpfs root
    data = root / "..2025_01_01_00_00_00.000000001"
    data.mkdir()
    data.chmod(0o755)
    for name, content in files.items():
        (data / name).write_bytes(content)
        (data / name).chmod(mode)
        (root / name).symlink_to(f"{SECRET_DATA}/{name}")
    (root / SECRET_DATA).symlink_to(data.name)


def test_key_dir_loads_from_a_secret_volume(daemonset: dict[str, Any], tmp_path: Path) -> None:
    signing = pytest.importorskip("monitor.signing")
    staging = tmp_path / "keygen"
    signing.keygen(staging)
    files = {p.name: p.read_bytes() for p in staging.iterdir()}
    (vol,) = [v for v in daemonset["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    mount = tmp_path / "etc-fhmon-keys"
    secret_volume_layout(mount, files, vol["secret"]["defaultMode"])
    key_dir = ds_flags(daemonset)["--key-dir"][0]
    assert key_dir.endswith(f"/{SECRET_DATA}")
    ring = signing.KeyRing.load(mount / SECRET_DATA)
    assert [k.signing for k in ring.describe()] == [True]


def test_pod_security_component_labels_the_namespace() -> None:
    (ns,) = load_docs(COMPONENTS / "pod-security" / "namespace.yaml")
    assert ns["kind"] == "Namespace" and ns["metadata"]["name"] == NAMESPACE
    labels = ns["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "privileged"


# --------------------------------------------------------------------------------------------
# Client examples


def test_seccomp_profile(
    profile: dict[str, Any], daemonset: dict[str, Any], listener_pod: dict[str, Any]
) -> None:
    share = virtiofsd_options(listener_pod["spec"]["containers"][0]["command"])["shared-dir"]
    assert check_profile(profile, ds_socket(daemonset), share) == []


def test_listener_pod(listener_pod: dict[str, Any], profile: dict[str, Any]) -> None:
    share = profile["listenerMetadata"].removeprefix("share=")
    assert check_listener_pod(listener_pod, SECCOMP_PROFILE, share) == []


def test_launch_pod(launch_pod: dict[str, Any], daemonset: dict[str, Any]) -> None:
    assert check_launch_pod(launch_pod, daemonset) == []


def test_examples_share_the_same_share(
    launch_pod: dict[str, Any], listener_pod: dict[str, Any], profile: dict[str, Any]
) -> None:
    flags, _, _ = split_launch(launch_pod["spec"]["containers"][0]["command"])
    assert f"share={flags['--share'][0]}" == profile["listenerMetadata"]


# --------------------------------------------------------------------------------------------
# Container image recipe


def containerfile_instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        out.append((op.upper(), rest.strip()))
    return out


def test_containerfile(daemonset: dict[str, Any]) -> None:
    instructions = containerfile_instructions(CONTAINERFILE.read_text())
    assert instructions[0][0] == "FROM"
    froms = [rest.split()[0] for op, rest in instructions if op == "FROM"]
    digest = r"@sha256:[0-9a-f]{64}"
    allowed = rf"(python:3\.1[1-9]-slim-bookworm|debian:bookworm-slim){digest}"
    # the build stage may start from the Rust image (the data plane is a Rust extension) ...
    assert froms and all(re.fullmatch(allowed, f)
                         or re.fullmatch(rf"rust:1\.\d+-slim-bookworm{digest}", f)
                         for f in froms[:-1])
    assert re.fullmatch(allowed, froms[-1])
    # ... but the image that ships carries no toolchain: it only installs the built wheels
    last = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    shipped = " ; ".join(rest for _, rest in instructions[last:])
    assert not re.search(r"\b(cargo|rustc|rustup|maturin|gcc)\b", shipped), shipped
    ops = dict(instructions)  # last one of each wins, as in the image
    assert json.loads(ops["ENTRYPOINT"]) == ["fhmon"]
    cmd = json.loads(ops["CMD"])
    assert cmd[:1] == ["serve"]
    assert cmd[1:] == ["--config", ds_flags(daemonset)["--config"][0]]
    runs = " ; ".join(rest for op, rest in instructions if op == "RUN")
    assert re.search(r"apt-get install .*\blibseccomp2\b", runs)
    assert re.search(r"pip (install|wheel) .*(\.|/wheels/\*\.whl)(\s|$)", runs)
    for op, rest in instructions:
        assert not re.search(r"(curl|wget)[^|;&]*\|\s*(ba|z)?sh\b", rest), rest
        assert not (op == "ADD" and re.search(r"https?://", rest)), rest


def test_dockerignore_excludes_local_state() -> None:
    patterns = (REPO / ".dockerignore").read_text().split()
    assert ".git" in patterns and ".venv" in patterns


# --------------------------------------------------------------------------------------------
# systemd


def test_systemd_unit(unit: configparser.ConfigParser, daemonset: dict[str, Any]) -> None:
    assert check_unit(unit, daemonset) == []
    service = unit["Service"]
    assert service["NoNewPrivileges"] == "yes"
    assert service["RuntimeDirectory"] == "fhmon"
    assert shlex.split(service["ExecStartPre"])[1:2] == ["check"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_socket_unit_matches_the_service(unit: configparser.ConfigParser) -> None:
    socket_unit = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    socket_unit.optionxform = str  # type: ignore[assignment,method-assign]
    socket_unit.read_string((DEPLOY / "systemd" / "fhmon.socket").read_text())
    serve = shlex.split(unit["Service"]["ExecStart"])
    assert socket_unit["Socket"]["ListenStream"] == serve[serve.index("--socket") + 1]
    assert socket_unit["Socket"]["SocketMode"] == serve[serve.index("--socket-mode") + 1]
    assert socket_unit["Socket"]["Service"] == "fhmon.service"
    assert socket_unit["Socket"]["Accept"] == "no"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    stub = tmp_path / "fhmon"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    unit = tmp_path / "fhmon.service"
    unit.write_text(SERVICE_UNIT.read_text().replace(f"{SYSTEMD_PREFIX}/bin/fhmon", str(stub)))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    # Unknown or misspelt directives are only warned about.
    assert "fhmon.service" not in result.stderr, result.stderr


# --------------------------------------------------------------------------------------------
# The real command line accepts what the deploy files pass (when fhmon is installed)


def find_fhmon() -> str | None:
    beside = Path(sys.executable).with_name("fhmon")
    return str(beside) if beside.exists() else shutil.which("fhmon")


FHMON = find_fhmon()
needs_cli = pytest.mark.skipif(FHMON is None, reason="the fhmon command is not installed")
# Subcommand -> the flags the deploy files and docs give it.
CLI_USES = {
    "serve": sorted(SERVE_FLAGS),
    "probe": ["--socket"],
    "launch": ["--socket", "--share"],
    "keygen": ["--key-dir"],
    "check": [],
}


def run_fhmon(*args: str) -> subprocess.CompletedProcess[str]:
    assert FHMON is not None
    return subprocess.run([FHMON, *args], capture_output=True, text=True, timeout=60)


@needs_cli
@pytest.mark.parametrize("subcommand", sorted(CLI_USES))
def test_cli_has_the_subcommands_and_flags_used(subcommand: str) -> None:
    result = run_fhmon(subcommand, "--help")
    assert result.returncode == 0, f"`fhmon {subcommand}` is used by deploy/: {result.stderr}"
    for flag in CLI_USES[subcommand]:
        assert flag in result.stdout, f"`fhmon {subcommand}` lacks {flag}"


def effective_config(argv: list[str]) -> dict[str, Any]:
    result = run_fhmon(*argv, "--print-config")
    assert result.returncode == 0, result.stderr
    return tomllib.loads(result.stdout)


def assert_effective(effective: dict[str, Any], flags: dict[str, list[str]]) -> None:
    assert effective["socket"] == flags["--socket"][0]
    assert effective["key_dir"] == flags["--key-dir"][0]
    assert effective["allow"] == flags["--allow"]
    for flag in ("--socket-mode", "--socket-group", "--metrics-address", "--log-level"):
        if flag in flags:
            assert str(effective[flag[2:].replace("-", "_")]) == flags[flag][0], flag


@needs_cli
def test_cli_accepts_daemonset_args(
    daemonset: dict[str, Any], base: list[dict[str, Any]], tmp_path: Path
) -> None:
    # The ConfigMap's config.toml, where the DaemonSet's --config points.
    config = tmp_path / "config.toml"
    config.write_text(one(base, "ConfigMap")["data"]["config.toml"])
    args = list(fhmon_container(daemonset)["args"])
    args[args.index("--config") + 1] = str(config)
    assert_effective(effective_config(args), ds_flags(daemonset))


@needs_cli
def test_cli_accepts_unit_args(unit: configparser.ConfigParser) -> None:
    argv = shlex.split(unit["Service"]["ExecStart"])[1:]
    flags, problems = serve_flags(argv)
    assert problems == []
    assert_effective(effective_config(argv), flags)


# --------------------------------------------------------------------------------------------
# Documentation agrees with the manifests


def test_docs_name_the_real_things(
    daemonset: dict[str, Any], unit: configparser.ConfigParser
) -> None:
    text = DOCS.read_text()
    assert "kubectl apply -k deploy/base" in text
    assert f"kubectl create secret generic {KEY_SECRET}" in text
    assert "fhmon keygen --key-dir" in text
    assert ds_socket(daemonset) in text
    unit_socket = serve_flags(shlex.split(unit["Service"]["ExecStart"])[1:])[0]["--socket"][0]
    assert unit_socket in text
    assert "deploy/systemd/fhmon.service" in text


# --------------------------------------------------------------------------------------------
# The checks catch broken copies


def broken(obj: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(obj)


def test_negative_volume_name_mismatch(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    fhmon_container(ds)["volumeMounts"][0]["name"] = "sockets"
    assert any("unknown volume sockets" in p for p in check_volumes(ds["spec"]["template"]["spec"]))


def test_negative_secret_name(daemonset: dict[str, Any], base: list[dict[str, Any]]) -> None:
    ds = broken(daemonset)
    for v in ds["spec"]["template"]["spec"]["volumes"]:
        if "secret" in v:
            v["secret"]["secretName"] = "keys"
    assert any(KEY_SECRET in p for p in check_refs(ds, base))


def test_negative_configmap_missing(daemonset: dict[str, Any], base: list[dict[str, Any]]) -> None:
    objs = [o for o in base if o["kind"] != "ConfigMap"]
    assert any("ConfigMap" in p for p in check_refs(daemonset, objs))


def test_negative_probe_socket(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    fhmon_container(ds)["livenessProbe"]["exec"]["command"][-1] = "/run/fhmon/fhmon.sock"
    assert any("livenessProbe" in p for p in check_socket(ds))


def test_negative_socket_dir_not_shared(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    for v in ds["spec"]["template"]["spec"]["volumes"]:
        if v.get("hostPath", {}).get("path") == "/var/run/kubevirt/fhmon":
            v["hostPath"]["path"] = "/run/fhmon"
    assert check_socket(ds) != []


def test_negative_extra_capability(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    fhmon_container(ds)["securityContext"]["capabilities"]["add"].append("DAC_OVERRIDE")
    problems = check_security(ds)
    assert any("capabilities.add" in p for p in problems)
    assert any("init container" in p for p in problems)


def test_negative_privileged_and_no_hostpid(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    ds["spec"]["template"]["spec"]["hostPID"] = False
    fhmon_container(ds)["securityContext"]["privileged"] = True
    problems = check_security(ds)
    assert "hostPID must be true" in problems and "privileged must be false" in problems


def test_negative_readonly_kubelet(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    for m in fhmon_container(ds)["volumeMounts"]:
        if m["mountPath"] == "/var/lib/kubelet":
            m["readOnly"] = True
            del m["mountPropagation"]
    problems = check_kubelet_mount(ds)
    assert any("EROFS" in p for p in problems) and any("HostToContainer" in p for p in problems)


def test_negative_metrics_port(
    daemonset: dict[str, Any], base: list[dict[str, Any]], servicemonitor: dict[str, Any]
) -> None:
    service = broken(one(base, "Service"))
    service["spec"]["ports"][0]["port"] = 9090
    assert any("Service port" in p for p in check_metrics(daemonset, service, servicemonitor))
    ds = broken(daemonset)
    ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] = "8080"
    assert any("prometheus.io/port" in p for p in check_metrics(ds, one(base, "Service"), None))
    monitor = broken(servicemonitor)
    monitor["spec"]["endpoints"][0]["port"] = "http"
    problems = check_metrics(daemonset, one(base, "Service"), monitor)
    assert any("ServiceMonitor" in p for p in problems)


def test_negative_unknown_serve_flag() -> None:
    argv = ["serve", "--socket", "/s", "--key-dir", "/k", "--allow", "/a", "--keys", "/k"]
    _, problems = serve_flags(argv)
    assert problems == [
        "unknown or misplaced argument '--keys'",
        "unknown or misplaced argument '/k'",
    ]
    _, problems = serve_flags(["serve", "--socket", "--key-dir", "/k"])
    assert "--socket has no value" in problems
    assert any("missing required" in p for p in problems)


def test_negative_profile(profile: dict[str, Any]) -> None:
    p = broken(profile)
    p["listenerPath"] = "/run/fhmon/fhmon.sock"
    p["syscalls"][0]["names"] = ["open_by_handle_at"]
    p["listenerMetadata"] = "/srv"
    problems = check_profile(p, "/var/run/kubevirt/fhmon/fhmon.sock", "/srv")
    assert len(problems) == 3


def test_negative_launch_pod(launch_pod: dict[str, Any], daemonset: dict[str, Any]) -> None:
    pod = broken(launch_pod)
    command = pod["spec"]["containers"][0]["command"]
    command[command.index("--socket") + 1] = "/var/run/fhmon/fhmon.sock"
    command[command.index("--share") + 1] = "/elsewhere"
    pod["spec"]["securityContext"]["runAsGroup"] = 1000
    problems = check_launch_pod(pod, daemonset)
    assert any("launch --socket" in p for p in problems)
    assert any("--shared-dir" in p for p in problems)
    assert any("share /elsewhere is on no volume" in p for p in problems)
    assert any("cannot reach the socket" in p for p in problems)


def test_negative_listener_pod(listener_pod: dict[str, Any]) -> None:
    pod = broken(listener_pod)
    pod["spec"]["containers"][0]["securityContext"]["seccompProfile"] = {"type": "RuntimeDefault"}
    problems = check_listener_pod(pod, SECCOMP_PROFILE, "/somewhere/else")
    assert len(problems) == 4


def test_negative_unit(unit: configparser.ConfigParser, daemonset: dict[str, Any]) -> None:
    u = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    u.optionxform = str  # type: ignore[assignment,method-assign]
    u.read_dict(unit)
    u["Service"]["CapabilityBoundingSet"] += " CAP_SYS_ADMIN"
    u["Service"]["RuntimeDirectory"] = "other"
    u["Service"]["ReadWritePaths"] = ""
    problems = check_unit(u, daemonset)
    assert any("CapabilityBoundingSet" in p for p in problems)
    assert any("RuntimeDirectory" in p for p in problems)
    assert any("read-only under ProtectSystem" in p for p in problems)


def test_negative_schema_rejects_unknown_field(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    fhmon_container(ds)["securityContext"]["capabilites"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSIONS[0], strict=True)


def test_keeper_container_serves_the_socket_fhmon_deposits_to(
        daemonset: dict[str, Any]) -> None:
    spec = daemonset["spec"]["template"]["spec"]
    (keeper,) = [c for c in spec["containers"] if c["name"] == "keeper"]
    fhmon_args = fhmon_container(daemonset)["args"]
    keeper_socket = fhmon_args[fhmon_args.index("--keeper") + 1]
    assert keeper["args"] == ["keeper", "--socket", keeper_socket]
    assert keeper["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"] for m in keeper["volumeMounts"]}
    assert any(keeper_socket.startswith(path + "/") for path in mounts)


# --------------------------------------------------------------------------------------------
# Operating it: capability lists and the documented key rotation


def documented_capability_sets() -> dict[str, set[str]]:
    """Every place that lists fhmon's capabilities, as CAP_ names."""
    from monitor import check, hardening

    ds = yaml.safe_load((BASE / "daemonset.yaml").read_text())
    spec = ds["spec"]["template"]["spec"]
    sets = {"monitor/hardening.py KEPT": set(hardening.KEPT.values()),
            "monitor/check.py CAPS": set(check.CAPS)}
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        add = c.get("securityContext", {}).get("capabilities", {}).get("add")
        if add:
            sets[f"daemonset.yaml {c['name']}"] = {f"CAP_{a}" for a in add}
    unit_text = SERVICE_UNIT.read_text()
    (bounding,) = re.findall(r"(?m)^CapabilityBoundingSet=(.*)$", unit_text)
    sets["fhmon.service CapabilityBoundingSet"] = set(bounding.split())
    sets["fhmon.service comment"] = set(re.findall(r"(?m)^#\s+(CAP_[A-Z_]+)\s", unit_text))
    names = "|".join(sorted({n.removeprefix("CAP_") for n in hardening.KEPT.values()}
                            | {"CHOWN", "DAC_OVERRIDE", "SYS_ADMIN", "FOWNER"}))
    cf = re.search(r"capabilities fhmon needs \(([^)]*)\)", CONTAINERFILE.read_text())
    assert cf, "the Containerfile no longer says which capabilities fhmon needs"
    sets["Containerfile comment"] = {f"CAP_{n}" for n in re.findall(names, cf.group(1))}
    for doc in ("deploy.md", "operations.md"):
        text = (REPO / "docs" / doc).read_text()
        for para in re.split(r"\n\s*\n", text):
            if re.search(r"(capabilities|bounding set|keeps only)", para, re.I):
                found = set(re.findall(r"CAP_(?:" + names + r")\b", para))
                if len(found) >= 3:  # a paragraph that lists them
                    sets[f"docs/{doc}: {para.strip()[:40]}..."] = found
    return sets


def test_every_capability_list_is_the_same() -> None:
    sets = documented_capability_sets()
    expected = {"CAP_DAC_READ_SEARCH", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
                "CAP_SYS_PTRACE"}
    assert {f"CAP_{c}" for c in CAPABILITIES} == expected
    assert sum(1 for name in sets if name.startswith("docs/deploy.md")) >= 2
    wrong = {name: sorted(found) for name, found in sets.items() if found != expected}
    assert not wrong, wrong


def fake_cluster(tmp_path: Path) -> dict[str, str]:
    """PATH with a `kubectl` that keeps one Secret in a file: create/replace store it, get
    renders it with the real kubectl's go-template (offline, through create --dry-run)."""
    real = shutil.which("kubectl")
    if real is None:
        pytest.skip("kubectl is not installed")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    store = tmp_path / "secret.yaml"
    script = bindir / "kubectl"
    script.write_text(f'''#!{sys.executable}
import base64, os, subprocess, sys, tempfile, yaml
REAL, STORE = {str(real)!r}, {str(store)!r}
args = sys.argv[1:]
if args[:2] == ["replace", "-f"] and args[2] == "-":
    open(STORE, "w").write(sys.stdin.read()); sys.exit(0)
if args[:2] == ["create", "secret"] and "--dry-run=client" not in args:
    out = subprocess.run([REAL, *args, "--dry-run=client", "-o", "yaml"], check=True,
                         capture_output=True, text=True).stdout
    open(STORE, "w").write(out); sys.exit(0)
if args[:4] == ["-n", "kubevirt", "get", "secret"] and args[4] == "fhmon-keys":
    data = yaml.safe_load(open(STORE))["data"]
    with tempfile.TemporaryDirectory() as d:
        for name, value in data.items():
            open(os.path.join(d, name), "wb").write(base64.b64decode(value))
        os.execv(REAL, [REAL, "create", "secret", "generic", "fhmon-keys", "-n", "kubevirt",
                        f"--from-file={{d}}/", "--dry-run=client", *args[5:]])
os.execv(REAL, [REAL, *args])
''')
    script.chmod(0o755)
    fhmon_bin = Path(sys.executable).parent
    return {**os.environ, "PATH": f"{bindir}:{fhmon_bin}:/usr/bin:/bin", "STORE": str(store)}


def doc_block(after: str) -> str:
    text = DOCS.read_text()
    start = text.index(after)
    block = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert block, f"no sh block after {after!r}"
    return block.group(1)


def test_documented_key_setup_and_rotation_run(tmp_path: Path) -> None:
    """docs/deploy.md's commands, run as written against a one-Secret fake cluster."""
    from monitor import signing

    env = fake_cluster(tmp_path)
    setup = doc_block("2. Create the signing keys once")
    setup = "\n".join(line.strip() for line in setup.splitlines())
    rotation = doc_block("### Key rotation")
    keygen = "fhmon keygen --no-sign --key-dir ./fhmon-keys"
    assert rotation.count(keygen) == 1 and rotation.count("OLDID") == 1
    rotation = rotation.replace(keygen, f"NEWID=$({keygen})")
    rotation = rotation.replace("NEWID --key-dir", '"$NEWID" --key-dir')
    rotation = rotation.replace("retire OLDID", 'retire "$OLDID"')
    script = ("set -euo pipefail\n" + setup
              + '\nOLDID=$(python3 -c "import yaml,base64,os; print(base64.b64decode('
              "yaml.safe_load(open(os.environ['STORE']))['data']['signing-key-id'])"
              '.decode().strip())")\n' + rotation
              + '\necho "old=$OLDID new=$NEWID"\n')
    res = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    old, new = re.findall(r"old=(\w+) new=(\w+)", res.stdout)[0]
    assert old != new
    assert not (tmp_path / "fhmon-keys").exists()  # the docs remove the local copy again
    secret = yaml.safe_load((tmp_path / "secret.yaml").read_text())
    volume = tmp_path / "volume"
    files = {name: __import__("base64").b64decode(v) for name, v in secret["data"].items()}
    secret_volume_layout(volume, files, 0o400)
    ring = signing.KeyRing.load(volume / SECRET_DATA)
    assert ring.key_ids == (int(new, 16),) and ring.signer == int(new, 16)
    assert f"{old}.key" not in secret["data"]


# --------------------------------------------------------------------------------------------
# systemd: the documented install, and the socket across a stop

SYSTEMD_PREFIX = "/opt/fhmon"  # docs/deploy.md's venv; the unit runs its bin/fhmon


def socket_unit_config() -> configparser.ConfigParser:
    parsed = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parsed.optionxform = str  # type: ignore[assignment,method-assign]
    parsed.read_string((DEPLOY / "systemd" / "fhmon.socket").read_text())
    return parsed


def check_systemd_units(service_text: str, socket_text: str) -> list[str]:
    """The socket outlives a service stop; both units run the venv's fhmon on one path."""
    problems: list[str] = []
    unit_cfg = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    unit_cfg.optionxform = str  # type: ignore[assignment,method-assign]
    unit_cfg.read_string(service_text)
    sock_cfg = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    sock_cfg.optionxform = str  # type: ignore[assignment,method-assign]
    sock_cfg.read_string(socket_text)
    service, sock = unit_cfg["Service"], sock_cfg["Socket"]
    for key in ("ExecStart", "ExecStartPre"):
        binary = shlex.split(service.get(key, ""))[:1]
        if binary != [f"{SYSTEMD_PREFIX}/bin/fhmon"]:
            problems.append(f"{key} runs {binary}, not the documented venv's fhmon")
    listen = PurePosixPath(sock.get("ListenStream", ""))
    runtime = service.get("RuntimeDirectory", "")
    if runtime and listen.parent == PurePosixPath("/run") / runtime and service.get(
            "RuntimeDirectoryPreserve", "no") != "yes":
        problems.append(f"{listen} is in RuntimeDirectory=/run/{runtime}, which systemd "
                        f"removes when fhmon.service stops (RuntimeDirectoryPreserve=no)")
    argv = shlex.split(service.get("ExecStart", ""))
    if "--socket" in argv and argv[argv.index("--socket") + 1] != str(listen):
        problems.append("fhmon.socket listens elsewhere than fhmon serve --socket")
    if sock.get("Service", "fhmon.service") != "fhmon.service":
        problems.append("fhmon.socket activates another service")
    pre = shlex.split(service.get("ExecStartPre", ""))
    if pre[1:2] != ["check"]:
        problems.append("ExecStartPre does not run fhmon check")
    else:
        checked, unknown = parse_flags(pre[2:], {"--key-dir", "--socket", "--allow"})
        if unknown:
            problems.append(f"ExecStartPre check: unexpected {unknown}")
        served, _ = serve_flags(argv[1:])
        for flag in ("--key-dir", "--socket", "--allow"):
            if checked.get(flag) != served.get(flag):
                problems.append(f"ExecStartPre check {flag} {checked.get(flag)} != serve "
                                f"{served.get(flag)}")
    return problems


def test_systemd_units_agree_and_keep_the_socket() -> None:
    assert check_systemd_units(SERVICE_UNIT.read_text(),
                               (DEPLOY / "systemd" / "fhmon.socket").read_text()) == []


def test_systemd_checks_catch_a_broken_copy() -> None:
    service, sock = SERVICE_UNIT.read_text(), (DEPLOY / "systemd" / "fhmon.socket").read_text()
    assert check_systemd_units(service.replace("RuntimeDirectoryPreserve=yes\n", ""), sock)
    assert check_systemd_units(service.replace(f"{SYSTEMD_PREFIX}/bin/fhmon serve",
                                               "/usr/local/bin/fhmon serve"), sock)
    assert check_systemd_units(service, sock.replace("/run/fhmon/fhmon.sock",
                                                     "/run/other.sock"))
    assert check_systemd_units(service.replace("check --key-dir /etc/fhmon/keys",
                                               "check --key-dir /etc/other"), sock)


def rust_build_env() -> dict[str, str]:
    """What a build of fhmon needs of the caller's environment: cargo's directory on PATH
    and rustup's homes (a test that sets HOME elsewhere would hide the toolchain)."""
    cargo = shutil.which("cargo")  # the data plane's build needs the Rust toolchain (docs)
    assert cargo is not None, "building fhmon needs cargo on PATH (scripts/setup.sh checks)"
    home = Path.home()
    return {"CARGO_DIR": str(Path(cargo).parent),
            "RUSTUP_HOME": os.environ.get("RUSTUP_HOME", str(home / ".rustup")),
            "CARGO_HOME": os.environ.get("CARGO_HOME", str(home / ".cargo"))}


def test_documented_systemd_install_runs(tmp_path: Path) -> None:
    """docs/deploy.md's install block, run for real up to keygen with the system Python
    (a venv, pip from PyPI), paths moved under tmp_path; then systemd-analyze verifies the
    unit with the venv's real fhmon in ExecStart."""
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None:
        pytest.skip("no system python3")
    block = doc_block("## Hosts without Kubernetes (systemd)")
    assert f"python3 -m venv {SYSTEMD_PREFIX}" in block
    assert not re.search(r"(?m)^pip install", block), "a system-wide pip install fails on PEP 668"
    root = tmp_path / "root"
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
        "target", "results"))
    lines = []
    for line in block.splitlines():
        command = line.split("  #")[0].strip()
        if not command or command.startswith(("apt-get", "systemctl", "install ")):
            continue  # packages, and the live system's systemd: not here
        for path in (SYSTEMD_PREFIX, "/usr/local/bin", "/etc/fhmon"):
            command = command.replace(path, f"{root}{path}")
        lines.append(command)
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    rust = rust_build_env()
    env = {"PATH": f"{root}/usr/local/bin:{rust.pop('CARGO_DIR')}:/usr/bin:/bin",
           "HOME": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1", **rust}
    res = subprocess.run(["bash", "-c", script], cwd=source, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    venv_fhmon = root / SYSTEMD_PREFIX.lstrip("/") / "bin" / "fhmon"
    assert venv_fhmon.exists()
    keys = list((root / "etc" / "fhmon" / "keys").glob("*.key"))
    assert len(keys) == 1 and keys[0].stat().st_mode & 0o077 == 0
    if shutil.which("systemd-analyze") is not None:
        unit = tmp_path / "fhmon.service"
        unit.write_text(SERVICE_UNIT.read_text().replace(f"{SYSTEMD_PREFIX}/bin/fhmon",
                                                         str(venv_fhmon)))
        verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                                text=True, timeout=120)
        assert verify.returncode == 0 and "fhmon.service" not in verify.stderr, verify.stderr


# --------------------------------------------------------------------------------------------
# Container image: the base pinned by digest, the dependencies locked with hashes

LOCK = DEPLOY / "requirements.lock"


def lock_entries(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a pip-compile --generate-hashes file."""
    joined = re.sub(r"\\\n", " ", text)
    out = {}
    for line in joined.splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        spec, *options = line.split()
        name, _, version = spec.partition("==")
        hashes = [o.removeprefix("--hash=sha256:") for o in options
                  if o.startswith("--hash=sha256:")]
        out[re.sub(r"[-_.]+", "-", name).lower()] = (version, hashes)
    return out


def check_locked_image(containerfile: str, lock: str, pyproject: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    instructions = containerfile_instructions(containerfile)
    for op, rest in instructions:
        if op == "FROM" and not re.search(r"@sha256:[0-9a-f]{64}(\s|$)", rest):
            problems.append(f"FROM {rest}: not pinned by digest")
    entries = lock_entries(lock)
    for name, (version, hashes) in entries.items():
        if not re.fullmatch(r"[0-9][0-9A-Za-z.+!]*", version):
            problems.append(f"{name}: not pinned to one version ({version!r})")
        if not hashes or not all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes):
            problems.append(f"{name}: no sha256 hashes")
    for dep in pyproject["project"]["dependencies"]:
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!~ ;\[]", dep, maxsplit=1)[0]).lower()
        if name not in entries:
            problems.append(f"dependency {name} is not in deploy/requirements.lock: run "
                            f"scripts/lock-deps.sh")
    runs = [rest for op, rest in instructions if op == "RUN" and re.search(r"\bpip\b", rest)]
    for run in runs:
        for command in re.split(r"&&|;", run):
            words = command.split()
            if words[:1] != ["pip"] or words[1:2] not in (["install"], ["wheel"]):
                continue
            locked = "--require-hashes" in words and "-r" in words
            own = "--no-deps" in words and (words[-1] == "." or words[-1].startswith(
                "/wheels/fhmon-"))
            if not (locked or own):
                problems.append(f"unlocked install: {command.strip()}")
    return problems


def test_image_is_pinned_and_locked() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert check_locked_image(CONTAINERFILE.read_text(), LOCK.read_text(), pyproject) == []


def test_lock_checks_catch_a_broken_copy() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    cf, lock = CONTAINERFILE.read_text(), LOCK.read_text()
    assert check_locked_image(re.sub(r"@sha256:[0-9a-f]{64}", "", cf, count=1), lock,
                              pyproject)
    assert check_locked_image(cf.replace("--require-hashes", ""), lock, pyproject)
    assert check_locked_image(cf, re.sub(r"(?m)^trio==\S+", "trio>=0.25", lock), pyproject)
    assert check_locked_image(cf, re.sub(r"(?ms)^trio==.*?(?=^\S|\Z)", "", lock), pyproject)
    more = copy.deepcopy(pyproject)
    more["project"]["dependencies"].append("not-locked-anywhere>=0.14")
    assert any("not-locked-anywhere" in p for p in check_locked_image(cf, lock, more))


def test_image_install_steps_run(tmp_path: Path) -> None:
    """The Containerfile's pip steps, run as written with the system Python 3.11 (the
    image's minor version): locked wheels from PyPI, hash-checked, then fhmon."""
    system_python = "/usr/bin/python3"
    if not os.path.exists(system_python):
        pytest.skip("no system python3")
    instructions = containerfile_instructions(CONTAINERFILE.read_text())
    runs = [rest for op, rest in instructions
            if op == "RUN" and re.search(r"\bpip (wheel|install --no-cache-dir --no-index)", rest)]
    assert len(runs) == 2, runs  # the build stage's wheels, then the runtime stage's install
    build_env = {rest.split("=", 1)[0]: rest.split("=", 1)[1].strip('"')
                 for op, rest in instructions if op == "ENV" and "=" in rest}
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
        "target", "results"))
    wheels = tmp_path / "wheels"
    rust = rust_build_env()
    env = {"PATH": f"{rust.pop('CARGO_DIR')}:/usr/bin:/bin", "HOME": str(tmp_path),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", **rust, **build_env}
    for stage, run in zip(("build", "runtime"), runs, strict=True):
        venv = tmp_path / stage
        subprocess.run([system_python, "-m", "venv", str(venv)], check=True)
        script = run.replace("/wheels", str(wheels))
        script = re.sub(r"(^|&&\s*)(/opt/build/bin/)?pip ", rf"\1{venv}/bin/pip ", script)
        res = subprocess.run(["sh", "-ec", script], cwd=source, env=env, capture_output=True,
                             text=True, timeout=900)
        assert res.returncode == 0, f"{stage}: {script}\n{res.stdout[-2000:]}{res.stderr[-3000:]}"
    assert not wheels.exists(), "the runtime step removes /wheels"
    version = subprocess.run([str(tmp_path / "runtime" / "bin" / "fhmon"), "--version"],
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("fhmon "), version
