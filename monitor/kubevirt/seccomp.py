"""The seccomp profiles fhmon gives a confined virtiofs container: the profile it would have
run under, with `name_to_handle_at` and `open_by_handle_at` allowed and nothing else changed.

Why a profile is needed at all: the runtime's filter and the launcher's notify filter are
stacked, and the kernel takes the most restrictive answer (an ERRNO outranks USER_NOTIF).
The runtimes' defaults refuse `open_by_handle_at` to a container without
CAP_DAC_READ_SEARCH, so under them the call never reaches fhmon. Allowed by the runtime's
filter, both calls go on to the launcher's filter, which turns them into notifications for
fhmon; without that filter the kernel itself refuses `open_by_handle_at` (it demands
CAP_DAC_READ_SEARCH, which the container does not have), so the allow grants nothing by itself.

Profiles are JSON objects in either format the runtimes read (OCI `LinuxSeccomp`, which
containerd loads as is, or containers/common's, which CRI-O loads): both keep the rules in
`syscalls`, each with `names` (or one `name`) and an `action`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

HANDLE_SYSCALLS = ("name_to_handle_at", "open_by_handle_at")
ALLOW = "SCMP_ACT_ALLOW"
# Where the profiles live under the kubelet's seccomp root (a Localhost profile's
# localhostProfile is relative to it); the DaemonSet installs them there.
PROFILE_DIR = "fhmon"


class ProfileError(ValueError):
    """Not a seccomp profile this module can derive from; the message says why."""


def with_handle_calls(profile: Any) -> dict[str, Any]:
    """`profile` with the two handle syscalls allowed unconditionally, every other rule as it
    was. A call the profile already allows unconditionally is left where it is; otherwise it
    is taken out of every rule that names it (an ERRNO rule, or an ALLOW only for holders of
    a capability; a rule left naming nothing is dropped) and one ALLOW rule names it at the
    end: the edit KubeVirt makes for userfaultfd in kubevirt/kubevirt.json. Deriving twice
    equals deriving once.
    """
    if not isinstance(profile, dict) or not isinstance(profile.get("syscalls"), list):
        raise ProfileError("a seccomp profile is an object with a list of syscalls")
    if not isinstance(profile.get("defaultAction"), str):
        raise ProfileError("the profile has no defaultAction")
    for rule in profile["syscalls"]:
        if not isinstance(rule, dict):
            raise ProfileError(f"a syscall rule is an object, not {rule!r}")
    out = copy.deepcopy(profile)
    allowed = {name for rule in out["syscalls"] if _unconditional_allow(rule)
               for name in _names(rule)}
    missing = [name for name in HANDLE_SYSCALLS if name not in allowed]
    if not missing:
        return out
    rules: list[Any] = []
    for rule in out["syscalls"]:
        names = rule.get("names") if isinstance(rule.get("names"), list) else []
        single = rule.get("name") if isinstance(rule.get("name"), str) else ""
        kept = [n for n in names if n not in missing]
        kept_single = "" if single in missing else single
        if (names or single) and not kept and not kept_single:
            continue  # it named only calls the new rule decides
        if names:
            rule["names"] = kept
        if single and not kept_single:
            del rule["name"]
        rules.append(rule)
    rules.append(_allow_rule(profile, missing))
    out["syscalls"] = rules
    return out


def _names(rule: dict[str, Any]) -> list[str]:
    names = rule.get("names")
    single = rule.get("name")
    return ((list(names) if isinstance(names, list) else [])
            + ([single] if isinstance(single, str) and single else []))


def _unconditional_allow(rule: dict[str, Any]) -> bool:
    return (rule.get("action") == ALLOW and not rule.get("args")
            and not any(rule.get(key) for key in ("includes", "excludes")))


def _allow_rule(profile: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """One ALLOW rule, in the base's format (containers/common's rules carry args, comment,
    includes and excludes; OCI's, as containerd renders them, leave empty args out)."""
    if any("includes" in r for r in profile["syscalls"]):
        return {"names": names, "action": ALLOW, "args": [],
                "comment": "fhmon: reaches the launcher's notify filter",
                "includes": {}, "excludes": {}}
    return {"names": names, "action": ALLOW}


def decisions(profile: dict[str, Any]) -> dict[str, list[str]]:
    """Every syscall the profile names, with the rules that name it (JSON, names removed):
    two profiles with equal decisions for a syscall treat it alike."""
    out: dict[str, list[str]] = {}
    for rule in profile["syscalls"]:
        names = _names(rule)
        rest = {k: v for k, v in rule.items() if k not in ("names", "name", "comment")}
        for name in names:
            out.setdefault(name, []).append(json.dumps(rest, sort_keys=True))
    return out


def dump(profile: dict[str, Any]) -> str:
    """The text fhmon ships: two-space JSON, keys in the base's order, newline at the end."""
    return json.dumps(profile, indent=2) + "\n"


def load(path: Path) -> dict[str, Any]:
    value = json.loads(path.read_text())
    if not isinstance(value, dict):
        raise ProfileError(f"{path}: not a JSON object")
    return value


# The profiles fhmon ships (deploy/seccomp/, installed under <kubelet seccomp root>/fhmon/),
# each derived from the profile a virtiofs container would otherwise run under (the sources,
# rendered from the runtimes' code, are in tests/data/seccomp/; README.md there says how).
SHIPPED = {
    # containerd's RuntimeDefault for a container without capabilities (x86-64).
    "containerd-runtime-default.json": "containerd-runtime-default-amd64.json",
    # CRI-O's RuntimeDefault: containers/common's seccomp.json.
    "cri-o-runtime-default.json": "containers-common-seccomp.json",
    # What KubeVirt's virt-handler installs as kubevirt/kubevirt.json (HCO sets it).
    "kubevirt.json": "kubevirt.json",
}
