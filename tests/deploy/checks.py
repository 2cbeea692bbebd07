"""Cross-reference checks of deploy/: each returns a list of problems (empty when all is
well), so that a negative test can show it catches a broken copy (`broken`).
"""

from __future__ import annotations

import configparser
import copy
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

from tests.deploy.flags import (
    ds_flags,
    ds_socket,
    fhmon_container,
    glob_root,
    mount_for,
    serve_flags,
    split_launch,
    virtiofsd_options,
)
from tests.deploy.render import all_containers, by_kind

# The documented contract (docs/deploy.md, comments in daemonset.yaml).
CAPABILITIES = {"SYS_PTRACE", "DAC_READ_SEARCH", "SETUID", "SETGID", "KILL"}
KEY_SECRET = "fhmon-keys"
# kubelet's link to the current files of a Secret volume, whose root is world-writable.
SECRET_DATA = "..data"
CONFIG_MAP = "fhmon-config"
HANDLE_SYSCALLS = {"name_to_handle_at", "open_by_handle_at"}


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
            continue
        # liveness must not fail on a key error: a restart would stop at start-up on
        # the same key directory, in a loop (issue 37.3)
        expected = ["fhmon", "probe", *(["--liveness"] if kind == "livenessProbe" else []),
                    "--socket", socket]
        if probe is not None and probe.get("exec", {}).get("command") != expected:
            problems.append(f"{kind} does not run `{' '.join(expected)}`")
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
        if c["name"] == "check" and c.get("securityContext") != sc:
            # It checks the real thing: the server's capabilities and filter.
            problems.append(f"init container {c['name']} runs with another security context")
        elif c["name"] != "check" and c.get("securityContext", {}).get("capabilities") != {
                "drop": ["ALL"]}:
            problems.append(f"init container {c['name']} needs no capability")
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


def broken(obj: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(obj)
