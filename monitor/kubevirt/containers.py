"""What the injection adds to a virt-launcher pod: the wrapped virtiofs container (launcher
prefix, virtiofsd's arguments, the device-plugin resource and memory overhead), the launcher
emptyDir and the init container that fills it. Pure data builders; monitor/kubevirt/patch.py
decides where they go.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from decimal import Decimal, DecimalException
from typing import Any, Literal

LAUNCHER_DIR = "/var/run/fhmon/launcher"
# The device plugin's extended resource: fhmon's own domain (devices.kubevirt.io/ is
# KubeVirt's). One name for the injection, the device plugin's default and deploy/.
DEFAULT_RESOURCE = "fhmon.io/virtiofs"
# What deploy/ builds and names (deploy/base/kustomization.yaml's images entry).
DEFAULT_IMAGE = "localhost/fhmon:latest"
# A VM (its VMI's labels reach the pod) opts in to migrating by file handle with this label;
# deploy/components/kubevirt-webhook's second configuration (failurePolicy: Fail) is the
# only one shown such pods, so both ends of its migrations are injected.
MIGRATION_LABEL = "fhmon.io/migration"
MIGRATION_BY_HANDLE = "file-handles"
# The launcher's opt-in (monitor/node.py's `launch`): migrate by handle.
LAUNCHER_MIGRATION_FLAG = "--virtiofsd-migration=file-handles"
LAUNCHER_VOLUME = "fhmon-launcher"
# What `fhmon install-launcher` puts in LAUNCHER_DIR (monitor/launcher.py's INSTALLED_NAME).
LAUNCHER_BINARY = "fhmon-launch"
LAUNCHER_INIT = "fhmon-launcher"
QEMU_UID = 107


@dataclass(frozen=True, slots=True)
class Settings:
    """What the injected pieces point at; deploy/ and the webhook must agree on these."""

    image: str = DEFAULT_IMAGE
    socket: str = "/var/run/kubevirt/fhmon/fhmon.sock"
    resource: str = DEFAULT_RESOURCE
    # The launcher (native/launcher, a static executable) lives in the container's cgroup
    # beside virtiofsd; KubeVirt's 80M limit was sized for virtiofsd alone. bench.launcher
    # measured 1.2 MiB RSS and its file is 1.2 MB of page cache: 8 MiB leaves room for
    # that three times over (docs/kubevirt.md, "The launcher's memory").
    memory_overhead: int = 8 * 1024 * 1024
    # prefer: files that cannot have a handle (EOPNOTSUPP) keep an O_PATH fd as today instead
    # of failing the guest's lookup; see docs/kubevirt.md.
    inode_file_handles: Literal["prefer", "mandatory"] = "prefer"
    # The nodes' container runtime: which shipped profile replaces RuntimeDefault
    # (monitor/kubevirt/seccomp.py; a cluster runs one, OpenShift CRI-O).
    runtime: Literal["containerd", "cri-o"] = "containerd"
    # Kubelets run with --seccomp-default: a pod without a profile gets RuntimeDefault
    # without saying so, and the injected container needs the replacement all the same.
    seccomp_default: bool = False
    # Where the DaemonSet installs the shipped profiles, relative to the kubelet's seccomp
    # root (a Localhost profile's localhostProfile).
    profile_dir: str = "fhmon"


DEFAULT_SETTINGS = Settings()  # frozen: one shared default


def launcher_command(settings: Settings, share: str, *,
                     migration_by_handle: bool = False) -> list[str]:
    """The prefix put before KubeVirt's own virtiofsd command and args (kept unchanged).

    The launcher fails open (fhmon unreachable, refusing, or its start-up probe failing:
    KubeVirt's command line runs exactly as rendered) and adds virtiofsd's handle flags
    only once fhmon serves. migration_by_handle: also turn KubeVirt's --migration-mode into
    file-handles then; only for pods whose migration targets are guaranteed to run under
    fhmon with the same keys (a plain target could not open the handles). Such a launcher
    does not fail open: a migration target that ran without fhmon could not open the
    source's handles, so it must fail (the migration fails, the VM stays on its source).
    The launcher is static (it needs nothing of KubeVirt's image) and adds no environment:
    virtiofsd gets the container's own.
    """
    failing = [LAUNCHER_MIGRATION_FLAG] if migration_by_handle else ["--fail-open"]
    return [
        f"{LAUNCHER_DIR}/{LAUNCHER_BINARY}",
        "launch", "--socket", settings.socket, "--share", share, *failing,
        f"--virtiofsd-handles={settings.inode_file_handles}", "--",
    ]


def as_list(value: Any) -> list[Any]:
    """value if it is a list, else [] (a manifest may hold anything where a list belongs)."""
    return value if isinstance(value, list) else []


def inject_container(container: dict[str, Any], volume: str,
                     settings: Settings = Settings(), *, seccomp_profile: str | None = None,
                     migrate_by_handle: bool = False) -> dict[str, Any]:
    """KubeVirt's virtiofs container, wrapped; key order kept, new keys appended.

    seccomp_profile: a Localhost profile (under the kubelet's seccomp root) for this
    container, replacing the one it would run under (see plan_pod). migrate_by_handle: the
    launcher's opt-in to migrating by file handle; otherwise virtiofsd keeps KubeVirt's
    migration mode.
    """
    new = copy.deepcopy(container)
    share = f"/{volume}"
    # KubeVirt's args stay as rendered (the launcher adds the handle flags once fhmon serves)
    new["command"] = (launcher_command(settings, share, migration_by_handle=migrate_by_handle)
                      + list(container["command"]))
    if seccomp_profile is not None:
        found_context = new.get("securityContext")
        context = dict(found_context) if isinstance(found_context, dict) else {}
        context["seccompProfile"] = {"type": "Localhost", "localhostProfile": seccomp_profile}
        new["securityContext"] = context
    new["volumeMounts"] = [*as_list(new.get("volumeMounts")),
                           {"name": LAUNCHER_VOLUME, "mountPath": LAUNCHER_DIR, "readOnly": True}]
    found = new.get("resources")
    resources: dict[str, Any] = found if isinstance(found, dict) else {}
    limits = dict(resources.get("limits") or {})
    limits[settings.resource] = "1"
    requests = resources.get("requests")
    if "memory" in limits:
        limit = limits["memory"]
        limits["memory"] = add_quantity(limit, settings.memory_overhead)
        if isinstance(requests, dict) and requests.get("memory") == limit:
            # Raised with the limit only where they were equal: a Guaranteed pod
            # (requests == limits) stays Guaranteed; others keep their request.
            requests = {**requests, "memory": limits["memory"]}
    resources = {**resources, "limits": limits}
    if isinstance(requests, dict):
        resources["requests"] = requests
    new["resources"] = resources
    return new


def launcher_volume() -> dict[str, Any]:
    # One 1.2 MB file (the limit leaves room for a larger build of it).
    return {"name": LAUNCHER_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}


def launcher_init_container(settings: Settings = Settings()) -> dict[str, Any]:
    """Copies the native launcher out of the fhmon image into the emptyDir."""
    # requests == limits: keeps a Guaranteed (dedicated-CPU) virt-launcher pod Guaranteed.
    # Measured: 35 MiB peak RSS for `fhmon install-launcher` (CPython and the command
    # line), plus 1.2 MB of page cache for the copy.
    amounts = {"cpu": "100m", "memory": "64Mi"}
    return {
        "name": LAUNCHER_INIT,
        "image": settings.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["install-launcher", LAUNCHER_DIR],
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "securityContext": {
            "runAsUser": QEMU_UID,
            "runAsGroup": QEMU_UID,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": LAUNCHER_VOLUME, "mountPath": LAUNCHER_DIR}],
    }


_SUFFIXES: dict[str, Decimal | int] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}


_MAX_QUANTITY_CHARS = 64
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")


def add_quantity(quantity: Any, extra: int) -> Any:
    """A Kubernetes memory quantity plus at least `extra` bytes, in the same family of
    suffixes where it can be (80M -> 148M, 80Mi -> 144Mi); unparseable values are left alone,
    and so are values no memory limit has (over 10**30 bytes: "1e999999999" would otherwise
    be a billion-digit integer).
    """
    if isinstance(quantity, bool) or not isinstance(quantity, str | int | float):
        return quantity
    text = str(quantity).strip()
    match = _QUANTITY.match(text) if len(text) <= _MAX_QUANTITY_CHARS else None
    if match is None:
        return quantity
    suffix = match.group(2)
    try:
        total = Decimal(match.group(1)) * Decimal(_SUFFIXES[suffix])
    except DecimalException:
        return quantity
    if not total.is_finite() or total.adjusted() > 30:
        return quantity
    whole = int(total.to_integral_value(rounding="ROUND_CEILING"))
    if suffix.endswith("i"):
        return _format_bytes(whole + extra, 2**20, "Mi")
    step = 10**6  # decimal suffixes: round the overhead up to whole megabytes
    return _format_bytes(whole + -(-extra // step) * step, step, "M")


def _format_bytes(value: int, unit: int, suffix: str) -> str:
    return f"{value // unit}{suffix}" if value % unit == 0 else str(value)
