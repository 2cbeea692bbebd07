"""One container of a pod spec, translated to an OCI runtime config the way the kubelet and
containerd's CRI plugin translate it (sans-IO: data in, a config.json dict out).

Why our own translation: the e2e tests run the injected virt-launcher pod's containers under a
real OCI runtime (runc), and what that proves is only as good as the config it is given.  Read
from containerd (internal/cri/server/container_create{,_linux}.go, internal/cri/opts,
internal/cri/sputil, pkg/oci, contrib/seccomp; main, 2026-08, 301026e5) and the kubelet's
security-context rules; each step below names the containerd option it mirrors:

- the kubelet's part: the effective security context is the pod's overlaid with the
  container's; supplementalGroups gets the pod's fsGroup appended; no_new_privs is set exactly
  when allowPrivilegeEscalation is false; seccomp Localhost names a file under the kubelet's
  seccomp root (--seccomp-profile-root), no profile means Unconfined unless the kubelet runs with
  --seccomp-default (RuntimeDefault); volume mounts and the device plugin's Allocate mounts become
  CRI mounts (hostPath, containerPath, readonly, private propagation); the default masked and
  read-only /proc paths.
- containerd's part: populateDefaultUnixSpec (namespaces, default mounts, devices cgroup deny),
  WithoutRunMount, WithoutDefaultSecuritySettings (no rlimits, no seccomp), WithProcessArgs
  (command + args, else the image's entrypoint + cmd), WithDefaultPathEnv + HOSTNAME + the
  image's and the container's env, WithMounts (sorted by depth, rbind + rprivate + ro/rw),
  WithCapabilities (drop ALL empties every set), WithoutAmbientCaps, WithNoNewPrivileges,
  WithRootFSReadonly, WithResources (memory limit, CPU quota and shares), WithUser +
  WithAdditionalGIDs + WithSupplementalGroups (sorted union with the primary gid), and the
  seccomp profile: RuntimeDefault = contrib/seccomp's DefaultProfile for the container's
  bounding set, Localhost = the file decoded as a runtime-spec LinuxSeccomp (json.Unmarshal:
  fields it does not know, such as a containers-common profile's includes/excludes/archMap, are
  dropped, so every rule applies unconditionally), Unconfined = none.  CRI-O (OpenShift's
  runtime) reads a Localhost file as containers/common does instead, conditions evaluated
  (NodeContext.seccomp_reader): on HCO's kubevirt.json the two readers disagree about
  open_by_handle_at (containerd keeps its capability-conditioned ALLOW, CRI-O its ERRNO).

Not translated (not needed to run these containers; say so where a test relies on it): the pod
sandbox (each container gets its own namespaces, no pause container), /etc/hosts, hostname and
resolv.conf mounts, /dev/termination-log, OOM score, SELinux and AppArmor labels, user
namespaces, hugepages.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OCI_VERSION = "1.0.2-dev"   # what Debian 12's runc (1.1.5) reports as its spec version
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KUBELET_SECCOMP_ROOT = "/var/lib/kubelet/seccomp"
#: The kubelet's defaults for procMount: Default (pkg/securitycontext/util.go).
KUBELET_MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/sys/firmware", "/sys/devices/virtual/powercap")
KUBELET_READONLY_PATHS = (
    "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
#: containerd's seccomp.arches() on amd64.
AMD64_ARCHES = ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32")
#: The CPU period the kubelet uses for CFS quota (100 ms).
CPU_PERIOD = 100_000


class TranslationError(ValueError):
    """The pod cannot be run as written (containerd or the kubelet would refuse it too)."""


@dataclass(frozen=True)
class DeviceMount:
    """One mount of a device plugin's Allocate answer (v1beta1 Mount)."""

    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config the CRI plugin reads."""

    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ()
    working_dir: str = ""
    user: str = ""


@dataclass(frozen=True)
class NodeContext:
    """What the kubelet and the runtime know beyond the pod spec.

    volume_paths: each pod volume's host directory (the kubelet's volume manager);
    device_mounts: the Allocate answers for the container's device-plugin resources;
    localhost_profiles: file contents by absolute path, for Localhost seccomp profiles (the
    caller reads the files localhost_profile_path names; sans-IO keeps reading out of here);
    runtime_default: containerd's DefaultProfile as a function of the bounding set;
    image_groups: supplementary groups the image's /etc/group gives the user (WithAdditionalGIDs);
    seccomp_reader: "containerd" (json.Unmarshal: conditions dropped) or "cri-o" (OpenShift's
    runtime: conditions evaluated, containers_common_profile); the one place CRI-O is modelled.
    """

    rootfs: str
    volume_paths: Mapping[str, str]
    device_mounts: Sequence[DeviceMount] = ()
    image: ImageConfig = ImageConfig()
    hostname: str = ""
    cgroups_path: str = ""
    seccomp_root: str = KUBELET_SECCOMP_ROOT
    seccomp_default: bool = False
    localhost_profiles: Mapping[str, bytes] = field(default_factory=dict)
    runtime_default: Callable[[Sequence[str]], dict[str, Any]] | None = None
    image_groups: Sequence[int] = ()
    seccomp_reader: str = "containerd"   # or "cri-o": how a Localhost file is read


# ---------------------------------------------------------------------- the kubelet's part

def find_container(pod: Mapping[str, Any], name: str) -> dict[str, Any]:
    spec = pod["spec"]
    found = [c for key in ("initContainers", "containers") for c in spec.get(key) or []
             if c.get("name") == name]
    if len(found) != 1:
        raise TranslationError(f"pod has {len(found)} containers named {name!r}")
    return found[0]


def effective_security_context(pod: Mapping[str, Any], container: Mapping[str, Any]
                               ) -> dict[str, Any]:
    """The pod's security context overlaid with the container's (the container wins)."""
    pod_sc = pod["spec"].get("securityContext") or {}
    sc = {k: pod_sc[k] for k in ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile",
                                 "seLinuxOptions") if k in pod_sc}
    sc.update(container.get("securityContext") or {})
    groups = list(pod_sc.get("supplementalGroups") or [])
    if "fsGroup" in pod_sc:
        groups.append(pod_sc["fsGroup"])
    sc["supplementalGroups"] = groups
    return sc


def seccomp_profile(sc: Mapping[str, Any], ctx: NodeContext) -> tuple[str, str]:
    """(type, localhost path): Unconfined, RuntimeDefault or Localhost with its file."""
    profile = sc.get("seccompProfile")
    if not profile:
        return ("RuntimeDefault", "") if ctx.seccomp_default else ("Unconfined", "")
    kind = profile.get("type")
    if kind == "Localhost":
        ref = profile.get("localhostProfile") or ""
        if not ref or posixpath.isabs(ref) or ".." in ref.split("/"):
            raise TranslationError(f"invalid localhostProfile {ref!r}")
        return "Localhost", posixpath.join(ctx.seccomp_root, ref)
    if kind in ("RuntimeDefault", "Unconfined"):
        return kind, ""
    raise TranslationError(f"unknown seccompProfile type {kind!r}")


def localhost_profile_path(pod: Mapping[str, Any], name: str, ctx: NodeContext) -> str | None:
    """The file a Localhost profile names for this container (the caller reads it)."""
    sc = effective_security_context(pod, find_container(pod, name))
    kind, path = seccomp_profile(sc, ctx)
    return path if kind == "Localhost" else None


def cri_mounts(pod: Mapping[str, Any], container: Mapping[str, Any], ctx: NodeContext
               ) -> list[tuple[str, str, bool]]:
    """(containerPath, hostPath, readonly): the volume mounts, then the device mounts."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    out = []
    for m in container.get("volumeMounts") or []:
        name = m["name"]
        if name not in volumes:
            raise TranslationError(f"volumeMount {name!r} names no volume of the pod")
        if name not in ctx.volume_paths:
            raise TranslationError(f"no host directory for volume {name!r}")
        host = ctx.volume_paths[name]
        if m.get("subPath"):
            host = posixpath.join(host, m["subPath"])
        out.append((m["mountPath"], host, bool(m.get("readOnly"))))
    out.extend((d.container_path, d.host_path, d.read_only) for d in ctx.device_mounts)
    return out


# ---------------------------------------------------------------------- containerd's part

def default_mounts() -> list[dict[str, Any]]:
    """populateDefaultUnixSpec's mounts after WithoutRunMount (no /run tmpfs)."""
    return [
        {"destination": "/proc", "type": "proc", "source": "proc",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]


def _depth(path: str) -> int:
    return len(posixpath.normpath(path).split("/"))


def oci_mounts(mounts: Sequence[tuple[str, str, bool]]) -> list[dict[str, Any]]:
    """WithMounts: the cgroup mount, defaults not overridden, then the CRI mounts by depth."""
    ordered = sorted(mounts, key=lambda m: _depth(m[0]))   # sort.Stable on path depth
    supplied = {posixpath.normpath(m[0]) for m in ordered}
    cgroup = {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
              "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}
    out = []
    for m in [*default_mounts(), cgroup]:
        dst = posixpath.normpath(m["destination"])
        if dst in supplied or ("/dev" in supplied and dst.startswith("/dev/")):
            continue
        out.append(m)
    for container_path, host_path, readonly in ordered:
        out.append({"destination": container_path, "type": "bind", "source": host_path,
                    "options": ["rbind", "rprivate", "ro" if readonly else "rw"]})
    return out


def process_args(container: Mapping[str, Any], image: ImageConfig) -> list[str]:
    """WithProcessArgs: command replaces the entrypoint (and drops the image's cmd)."""
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    # A command replaces the entrypoint; args replace the image's cmd.
    argv = command + args if command else list(image.entrypoint) + (args or list(image.cmd))
    if not argv:
        raise TranslationError("no command specified")
    return [str(a) for a in argv]


def process_env(container: Mapping[str, Any], image: ImageConfig, hostname: str) -> list[str]:
    """WithDefaultPathEnv, HOSTNAME, the image's env, then the container's (later wins)."""
    env: dict[str, str] = {}
    for entry in [DEFAULT_PATH, f"HOSTNAME={hostname}", *image.env,
                  *(f"{e['name']}={e.get('value', '')}" for e in container.get("env") or [])]:
        key, _, _ = entry.partition("=")
        env.pop(key, None)
        env[key] = entry
    return list(env.values())


def capabilities(sc: Mapping[str, Any]) -> dict[str, list[str]]:
    """WithCapabilities + WithoutAmbientCaps, from containerd's default set."""
    caps = list(DEFAULT_CAPS)
    wanted = sc.get("capabilities") or {}
    add = [str(c).upper() for c in wanted.get("add") or []]
    drop = [str(c).upper() for c in wanted.get("drop") or []]
    if "ALL" in add:
        caps = list(ALL_CAPS)
    if "ALL" in drop:
        caps = []
    for c in add:
        if c != "ALL" and f"CAP_{c}" not in caps:
            caps.append(f"CAP_{c}")
    caps = [c for c in caps if c[4:] not in drop]
    sets = {"bounding": caps, "effective": caps, "permitted": caps}
    return {k: list(v) for k, v in sets.items() if v}


#: oci.defaultUnixCaps().
DEFAULT_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
                "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
                "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE")
ALL_CAPS = (*DEFAULT_CAPS, "CAP_DAC_READ_SEARCH", "CAP_LINUX_IMMUTABLE", "CAP_NET_BROADCAST",
            "CAP_NET_ADMIN", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO",
            "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
            "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_LEASE",
            "CAP_AUDIT_CONTROL", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
            "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
            "CAP_CHECKPOINT_RESTORE")


def user(sc: Mapping[str, Any], image: ImageConfig, image_groups: Sequence[int]
         ) -> dict[str, Any]:
    """WithUser(uid[:gid]) + WithAdditionalGIDs + WithSupplementalGroups: a sorted union."""
    image_uid, _, image_gid = image.user.partition(":")
    uid = sc.get("runAsUser", int(image_uid) if image_uid.isdigit() else 0)
    gid = sc.get("runAsGroup", int(image_gid) if image_gid.isdigit() else 0)
    groups = sorted({int(gid), *image_groups, *(int(g) for g in sc["supplementalGroups"])})
    return {"uid": int(uid), "gid": int(gid), "additionalGids": groups}


def _millicpu(value: Any) -> int:
    text = str(value)
    if text.endswith("m"):
        return int(text[:-1])
    return int(float(text) * 1000)


_MEMORY_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
                  "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "": 1}


def memory_bytes(value: Any) -> int:
    text = str(value)
    for suffix in sorted(_MEMORY_SUFFIX, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            return int(float(text[:-len(suffix)]) * _MEMORY_SUFFIX[suffix])
    return int(float(text))


def resources(container: Mapping[str, Any]) -> dict[str, Any]:
    """The kubelet's LinuxContainerResources through WithResources (cgroup v1 fields)."""
    res = container.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    out: dict[str, Any] = {"devices": [{"allow": False, "access": "rwm"}]}
    cpu: dict[str, Any] = {}
    request = requests.get("cpu", limits.get("cpu"))
    # MilliCPUToShares: 1024 per CPU, at least 2.
    cpu["shares"] = max(2, _millicpu(request) * 1024 // 1000) if request is not None else 2
    if "cpu" in limits:
        cpu["quota"] = max(1000, _millicpu(limits["cpu"]) * CPU_PERIOD // 1000)
        cpu["period"] = CPU_PERIOD
    out["cpu"] = cpu
    if "memory" in limits:
        out["memory"] = {"limit": memory_bytes(limits["memory"])}
    return out


def seccomp(kind: str, path: str, caps: Sequence[str], ctx: NodeContext) -> dict[str, Any] | None:
    """The profile containerd puts in the spec for this container."""
    if kind == "Unconfined":
        return None
    if kind == "RuntimeDefault":
        if ctx.runtime_default is None:
            raise TranslationError("RuntimeDefault needs containerd's default profile")
        return ctx.runtime_default(caps)
    if path not in ctx.localhost_profiles:
        raise TranslationError(f"cannot load seccomp profile {path!r}")
    if ctx.seccomp_reader == "cri-o":
        return containers_common_profile(json.loads(ctx.localhost_profiles[path]), caps)
    return decode_linux_seccomp(ctx.localhost_profiles[path])


#: runtime-spec LinuxSeccomp and LinuxSyscall fields (what Go's json.Unmarshal keeps).
_SECCOMP_FIELDS = ("defaultAction", "defaultErrnoRet", "architectures", "flags",
                   "listenerPath", "listenerMetadata", "syscalls")
_SYSCALL_FIELDS = ("names", "action", "errnoRet", "args")
_ARG_FIELDS = ("index", "value", "valueTwo", "op")


def _keep(obj: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """Go's case-insensitive field match, unknown fields dropped, null as absent."""
    lower = {n.lower(): n for n in names}
    return {lower[k.lower()]: v for k, v in obj.items() if k.lower() in lower and v is not None}


def decode_linux_seccomp(data: bytes) -> dict[str, Any]:
    """contrib/seccomp's WithProfile: the file decoded straight into a LinuxSeccomp."""
    raw = json.loads(data)
    if not isinstance(raw, dict):
        raise TranslationError("decoding seccomp profile failed: not an object")
    out = _keep(raw, _SECCOMP_FIELDS)
    out["syscalls"] = [
        {**_keep(s, _SYSCALL_FIELDS),
         **({"args": [_keep(a, _ARG_FIELDS) for a in s["args"]]} if s.get("args") else {})}
        for s in out.get("syscalls") or []]
    return out


def containers_common_profile(source: Mapping[str, Any], caps: Sequence[str],
                              arch: str = "amd64") -> dict[str, Any]:
    """How CRI-O (containers/common's pkg/seccomp) reads a Localhost profile: a rule applies
    only when its includes hold (every capability in the bounding set, the architecture) and
    its excludes do not (no listed capability, not the architecture); archMap gives the
    native architecture and its sub-architectures (x86-64: x86, x32)."""
    have = set(caps)
    rules = []
    for rule in source.get("syscalls") or []:
        inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
        if inc.get("caps") and not set(inc["caps"]) <= have:
            continue
        if inc.get("arches") and arch not in inc["arches"]:
            continue
        if exc.get("caps") and set(exc["caps"]) & have:
            continue
        if exc.get("arches") and arch in exc["arches"]:
            continue
        rules.append(rule)
    profile = decode_linux_seccomp(json.dumps({**source, "syscalls": rules}).encode())
    if source.get("archMap") and "architectures" not in profile:
        profile["architectures"] = list(AMD64_ARCHES)
    return profile


# ---------------------------------------------------------------------- the whole config

def namespaces(spec: Mapping[str, Any]) -> list[str]:
    """The namespaces a container gets: hostPID, hostIPC and hostNetwork (NamespaceMode NODE
    in the CRI) leave it in the host's pid, ipc and network namespace (WithHostNamespace)."""
    host = {"pid": spec.get("hostPID"), "ipc": spec.get("hostIPC"),
            "network": spec.get("hostNetwork")}
    return [t for t in ("pid", "ipc", "uts", "mount", "network") if not host.get(t)]


def translate(pod: Mapping[str, Any], name: str, ctx: NodeContext) -> dict[str, Any]:
    """The OCI config containerd's CRI plugin would hand runc for container `name`."""
    container = find_container(pod, name)
    sc = effective_security_context(pod, container)
    if sc.get("privileged"):
        raise TranslationError("privileged containers are not translated")
    if sc.get("runAsNonRoot") and user(sc, ctx.image, ())["uid"] == 0:
        raise TranslationError("container has runAsNonRoot and its user is root")
    caps = capabilities(sc)
    process: dict[str, Any] = {
        "terminal": bool(container.get("tty")),
        "user": user(sc, ctx.image, ctx.image_groups),
        "args": process_args(container, ctx.image),
        "env": process_env(container, ctx.image, ctx.hostname),
        "cwd": container.get("workingDir") or ctx.image.working_dir or "/",
        "noNewPrivileges": sc.get("allowPrivilegeEscalation") is False,
    }
    # Always present, possibly empty (Go: a non-nil LinuxCapabilities): runc drops every
    # capability it does not list, but keeps the parent's bounding set if the key is missing.
    process["capabilities"] = caps
    linux: dict[str, Any] = {
        "resources": resources(container),
        "namespaces": [{"type": t} for t in namespaces(pod["spec"])],
        "maskedPaths": list(KUBELET_MASKED_PATHS),
        "readonlyPaths": list(KUBELET_READONLY_PATHS),
    }
    if ctx.cgroups_path:
        linux["cgroupsPath"] = ctx.cgroups_path
    kind, path = seccomp_profile(sc, ctx)
    profile = seccomp(kind, path, caps.get("bounding", []), ctx)
    if profile is not None:
        linux["seccomp"] = profile
    return {
        "ociVersion": OCI_VERSION,
        "process": process,
        "root": {"path": ctx.rootfs, "readonly": bool(sc.get("readOnlyRootFilesystem"))},
        "hostname": ctx.hostname,
        "mounts": oci_mounts(cri_mounts(pod, container, ctx)),
        "linux": linux,
    }
