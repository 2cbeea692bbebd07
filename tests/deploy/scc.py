"""OpenShift's SCC admission of a pod, for the fields fhmon's manifests use.

What an SCC lets a pod do, as OpenShift's admission (apiserver-library-go's SCC provider)
decides it: host namespaces and ports, volume types (hostPath also needs
allowHostDirVolumePlugin), privileged containers and privilege escalation, added and
required-dropped capabilities, the runAsUser, SELinux, seccomp, fsGroup and supplemental
group strategies, and a read-only root filesystem. A field the pod leaves unset that the
SCC would fill in (a MustRunAs uid, SELinux options, the first seccomp profile) is admitted:
admission sets it. `refusals` says why a pod is not admitted, one line per reason; an empty
list admits it.
"""

from __future__ import annotations

from typing import Any

from tests.deploy.render import all_containers

SECCOMP_NAMES = {"RuntimeDefault": "runtime/default", "Unconfined": "unconfined"}


def volume_type(volume: dict[str, Any]) -> str:
    (kind,) = [key for key in volume if key != "name"]
    return kind


def seccomp_name(profile: dict[str, Any]) -> str:
    if profile["type"] == "Localhost":
        return f"localhost/{profile['localhostProfile']}"
    return SECCOMP_NAMES[profile["type"]]


def _in_ranges(value: int, ranges: list[dict[str, int]]) -> bool:
    return any(r["min"] <= value <= r["max"] for r in ranges)


def _group_strategy(name: str, strategy: dict[str, Any] | None, values: list[int],
                    namespace_range: tuple[int, int]) -> list[str]:
    if not strategy or strategy.get("type") in (None, "RunAsAny"):
        return []
    ranges = strategy.get("ranges") or [{"min": namespace_range[0], "max": namespace_range[1]}]
    return [f"{name} {v} outside {ranges}" for v in values if not _in_ranges(v, ranges)]


def _run_as_user(scc: dict[str, Any], where: str, uid: int | None,
                 non_root: bool | None, namespace_range: tuple[int, int]) -> list[str]:
    strategy = scc.get("runAsUser") or {"type": "RunAsAny"}
    kind = strategy["type"]
    if kind == "RunAsAny":
        return []
    if kind == "MustRunAs":
        if uid is not None and uid != strategy["uid"]:
            return [f"{where}: runAsUser {uid}, the SCC requires {strategy['uid']}"]
        return []
    if kind == "MustRunAsRange":
        low = strategy.get("uidRangeMin", namespace_range[0])
        high = strategy.get("uidRangeMax", namespace_range[1])
        if uid is not None and not low <= uid <= high:
            return [f"{where}: runAsUser {uid} outside {low}-{high}"]
        return []
    if kind == "MustRunAsNonRoot":
        if uid == 0 or (uid is None and not non_root):
            return [f"{where}: must run as non-root"]
        return []
    return [f"{where}: unknown runAsUser strategy {kind}"]


def _container(scc: dict[str, Any], pod_sc: dict[str, Any], c: dict[str, Any],
               namespace_range: tuple[int, int]) -> list[str]:
    where = f"container {c['name']}"
    sc = c.get("securityContext") or {}
    out: list[str] = []
    if sc.get("privileged") and not scc.get("allowPrivilegedContainer"):
        out.append(f"{where}: privileged")
    if scc.get("allowPrivilegeEscalation") is False and sc.get("allowPrivilegeEscalation"):
        out.append(f"{where}: allowPrivilegeEscalation")
    caps = sc.get("capabilities") or {}
    allowed = set(scc.get("allowedCapabilities") or []) | set(
        scc.get("defaultAddCapabilities") or [])
    if "*" not in allowed:
        for cap in caps.get("add") or []:
            if cap not in allowed:
                out.append(f"{where}: capability {cap} not allowed")
    dropped = set(caps.get("drop") or [])
    for cap in scc.get("requiredDropCapabilities") or []:
        if cap not in dropped and "ALL" not in dropped:
            out.append(f"{where}: must drop {cap}")
    out += _run_as_user(scc, where, sc.get("runAsUser", pod_sc.get("runAsUser")),
                        sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")), namespace_range)
    selinux = scc.get("seLinuxContext") or {"type": "RunAsAny"}
    if selinux["type"] == "MustRunAs":
        wanted = selinux.get("seLinuxOptions") or {}
        given = sc.get("seLinuxOptions", pod_sc.get("seLinuxOptions")) or {}
        for field, value in given.items():
            if field in wanted and wanted[field] != value:
                out.append(f"{where}: seLinuxOptions.{field} {value}, the SCC sets "
                           f"{wanted[field]}")
            elif field not in wanted:  # the level included: the namespace's is set
                out.append(f"{where}: seLinuxOptions.{field} {value} not allowed")
    profiles = scc.get("seccompProfiles") or []
    profile = sc.get("seccompProfile", pod_sc.get("seccompProfile"))
    if profile is not None and "*" not in profiles and seccomp_name(profile) not in profiles:
        out.append(f"{where}: seccomp profile {seccomp_name(profile)} not allowed")
    if scc.get("readOnlyRootFilesystem") and sc.get("readOnlyRootFilesystem") is False:
        out.append(f"{where}: must have a read-only root filesystem")
    for port in c.get("ports") or []:
        if port.get("hostPort") and not scc.get("allowHostPorts"):
            out.append(f"{where}: hostPort {port['hostPort']}")
    return out


def refusals(scc: dict[str, Any], pod: dict[str, Any],
             namespace_range: tuple[int, int] = (1000660000, 1000669999)) -> list[str]:
    """Why `scc` does not admit the pod spec `pod`; namespace_range: the namespace's
    openshift.io/sa.scc.uid-range (also its groups'), for the strategies that use it."""
    out: list[str] = []
    for field, allow in (("hostPID", "allowHostPID"), ("hostNetwork", "allowHostNetwork"),
                         ("hostIPC", "allowHostIPC")):
        if pod.get(field) and not scc.get(allow):
            out.append(f"pod: {field}")
    allowed_volumes = set(scc.get("volumes") or [])
    for volume in pod.get("volumes") or []:
        kind = volume_type(volume)
        if "*" not in allowed_volumes and kind not in allowed_volumes:
            out.append(f"volume {volume['name']}: {kind} not allowed")
        if kind == "hostPath" and not scc.get("allowHostDirVolumePlugin"):
            out.append(f"volume {volume['name']}: hostPath needs allowHostDirVolumePlugin")
    pod_sc = pod.get("securityContext") or {}
    fs_group = [pod_sc["fsGroup"]] if "fsGroup" in pod_sc else []
    out += _group_strategy("fsGroup", scc.get("fsGroup"), fs_group, namespace_range)
    out += _group_strategy("supplementalGroups", scc.get("supplementalGroups"),
                           list(pod_sc.get("supplementalGroups") or []), namespace_range)
    for c in all_containers(pod):
        out += _container(scc, pod_sc, c, namespace_range)
    return out
