"""What the injection adds to a virt-launcher pod: the wrapped virtiofs container (launcher
prefix, virtiofsd's arguments, the device-plugin resource and memory overhead), the launcher
emptyDir and the init container that fills it. Pure data builders; monitor/kubevirt/inject.py
decides where they go.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, DecimalException
from typing import Any, Literal

LAUNCHER_DIR = "/var/run/fhmon/launcher"
LAUNCHER_VOLUME = "fhmon-launcher"
LAUNCHER_INIT = "fhmon-launcher"
QEMU_UID = 107


@dataclass(frozen=True, slots=True)
class Settings:
    """What the injected pieces point at; deploy/ and the webhook must agree on these."""

    image: str = "fhmon"
    socket: str = "/var/run/kubevirt/fhmon/fhmon.sock"
    resource: str = "devices.kubevirt.io/fhmon"
    # The launcher (CPython running `fhmon launch`) lives in the container's cgroup beside
    # virtiofsd; KubeVirt's 80M limit was sized for virtiofsd alone.
    memory_overhead: int = 64 * 1024 * 1024
    # prefer: files that cannot have a handle (EOPNOTSUPP) keep an O_PATH fd as today instead
    # of failing the guest's lookup; see docs/kubevirt.md.
    inode_file_handles: Literal["prefer", "mandatory"] = "prefer"


DEFAULT_SETTINGS = Settings()  # frozen: one shared default


def launcher_command(settings: Settings, share: str) -> list[str]:
    """The prefix put before virtiofsd: the copied loader runs the copied CPython.

    No environment is added: `-I` makes CPython find its prefix from its own path, and the
    loader's --library-path does not reach the exec'ed virtiofsd (see bundle.py).
    """
    return [
        f"{LAUNCHER_DIR}/ld.so", "--library-path", f"{LAUNCHER_DIR}/lib",
        f"{LAUNCHER_DIR}/bin/python3", "-I", "-m", "monitor.kubevirt.bundled",
        "launch", "--socket", settings.socket, "--share", share, "--",
    ]


def as_list(value: Any) -> list[Any]:
    """value if it is a list, else [] (a manifest may hold anything where a list belongs)."""
    return value if isinstance(value, list) else []


def inject_container(container: dict[str, Any], volume: str,
                     settings: Settings = Settings()) -> dict[str, Any]:
    """KubeVirt's virtiofs container, wrapped; key order kept, new keys appended."""
    new = copy.deepcopy(container)
    share = f"/{volume}"
    new["command"] = launcher_command(settings, share) + list(container["command"])
    new["args"] = virtiofsd_args(as_list(container.get("args")), settings)
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


def virtiofsd_args(args: Sequence[Any], settings: Settings = Settings()) -> list[Any]:
    """virtiofsd's arguments with file handles on and, if it migrates, by handle."""
    out: list[Any] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--inode-file-handles":
            skip = True
            continue
        if isinstance(arg, str) and arg.startswith("--inode-file-handles="):
            continue
        if arg == "--migration-mode":
            out.append("--migration-mode=file-handles")
            skip = True
            continue
        if isinstance(arg, str) and arg.startswith("--migration-mode="):
            # Only where KubeVirt already asks for a mode: an older virtiofsd without
            # migration support would refuse an unknown flag.
            out.append("--migration-mode=file-handles")
            continue
        out.append(arg)
    out.append(f"--inode-file-handles={settings.inode_file_handles}")
    return out


def launcher_volume() -> dict[str, Any]:
    return {"name": LAUNCHER_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}}


def launcher_init_container(settings: Settings = Settings()) -> dict[str, Any]:
    """Copies the self-contained launcher out of the fhmon image into the emptyDir."""
    # requests == limits: keeps a Guaranteed (dedicated-CPU) virt-launcher pod Guaranteed.
    # Measured: 33 MiB peak RSS for the copy (two interpreters), plus page cache.
    amounts = {"cpu": "100m", "memory": "128Mi"}
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
