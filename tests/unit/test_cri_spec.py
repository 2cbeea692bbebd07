"""cri_spec.translate against what containerd's CRI plugin (main, 301026e5) and the kubelet
produce for the same containers, field by field as read in their code (not e2e: no guest).

The expected configs below are written out by hand from containerd's spec options, so that a
change in the translation shows up as a diff against containerd, not against itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.kubevirt import containers, inject
from tests.support import cri_spec
from tests.support.kubevirt import LAUNCHER_POD

VOLUMES = {"virtiofs-containers": "/k/vc", "data": "/k/pvc", "fhmon-launcher": "/k/launcher",
           "private": "/k/private", "virt-bin-share-dir": "/k/bin", "rootdv": "/k/rootdv"}
DEVICE = cri_spec.DeviceMount("/var/run/kubevirt/fhmon", "/var/run/kubevirt/fhmon", True)
MASKED = ["/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
          "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
          "/sys/firmware", "/sys/devices/virtual/powercap"]
READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
#: populateDefaultUnixSpec's mounts without /run (WithoutRunMount), then WithMounts' cgroup.
DEFAULTS = [
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
    {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
     "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
]
NAMESPACES = [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]
PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def bind(destination: str, source: str, mode: str) -> dict[str, Any]:
    return {"destination": destination, "type": "bind", "source": source,
            "options": ["rbind", "rprivate", mode]}


def injected() -> dict[str, Any]:
    pod: dict[str, Any] = yaml.safe_load(inject.inject(LAUNCHER_POD, containers.Settings()))
    return pod


def ctx(**kw: Any) -> cri_spec.NodeContext:
    base: dict[str, Any] = {"rootfs": "/b/rootfs", "volume_paths": VOLUMES, "hostname": "vm1"}
    return cri_spec.NodeContext(**{**base, **kw})


def test_the_injected_virtiofs_container_is_what_containerd_would_run() -> None:
    pod = injected()
    virtiofs = cri_spec.find_container(pod, "virtiofs-data")
    config = cri_spec.translate(pod, "virtiofs-data", ctx(device_mounts=[DEVICE]))
    assert config == {
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": False,
            # WithUser("107:107"), ensureAdditionalGids, WithSupplementalGroups([fsGroup]).
            "user": {"uid": 107, "gid": 107, "additionalGids": [107]},
            "args": [*virtiofs["command"], *virtiofs["args"]],
            "env": [PATH, "HOSTNAME=vm1"],
            "cwd": "/",
            "noNewPrivileges": True,       # allowPrivilegeEscalation: false
            "capabilities": {},            # drop ALL: WithCapabilities(nil)
        },
        "root": {"path": "/b/rootfs", "readonly": False},
        "hostname": "vm1",
        # Sorted by depth (stable): volume mounts in pod order, then the device's mount.
        "mounts": [*DEFAULTS,
                   bind("/data", "/k/pvc", "rw"),
                   bind("/var/run/kubevirt/virtiofs-containers", "/k/vc", "rw"),
                   bind(containers.LAUNCHER_DIR, "/k/launcher", "ro"),
                   bind("/var/run/kubevirt/fhmon", "/var/run/kubevirt/fhmon", "ro")],
        "linux": {
            # requests.cpu 10m -> 10 shares; limits.cpu 100m -> 10 ms per 100 ms;
            # limits.memory 80M + the launcher's 8 MiB, in whole megabytes (89M).
            "resources": {"devices": [{"allow": False, "access": "rwm"}],
                          "cpu": {"shares": 10, "quota": 10000, "period": 100000},
                          "memory": {"limit": 89_000_000}},
            "namespaces": NAMESPACES,
            "maskedPaths": MASKED,
            "readonlyPaths": READONLY,
            # No seccompProfile anywhere and no --seccomp-default: Unconfined, no "seccomp".
        },
    }


def test_the_launcher_init_container_runs_the_images_entrypoint_read_only() -> None:
    pod = injected()
    image = cri_spec.ImageConfig(entrypoint=["/usr/bin/fhmon"], cmd=["serve"],
                                 env=["LANG=C.UTF-8", "PATH=/opt/fhmon/bin:/usr/bin"])
    config = cri_spec.translate(pod, containers.LAUNCHER_INIT, ctx(image=image))
    process = config["process"]
    # args replace the image's cmd; the entrypoint stays.
    assert process["args"] == ["/usr/bin/fhmon", "install-launcher", containers.LAUNCHER_DIR]
    # The image's PATH replaces the default one (same key, later wins).
    assert process["env"] == ["HOSTNAME=vm1", "LANG=C.UTF-8", "PATH=/opt/fhmon/bin:/usr/bin"]
    assert process["user"] == {"uid": 107, "gid": 107, "additionalGids": [107]}
    assert process["capabilities"] == {} and process["noNewPrivileges"] is True
    assert config["root"] == {"path": "/b/rootfs", "readonly": True}
    assert config["mounts"] == [*DEFAULTS, bind(containers.LAUNCHER_DIR, "/k/launcher", "rw")]
    assert config["linux"]["resources"] == {
        "devices": [{"allow": False, "access": "rwm"}],
        "cpu": {"shares": 102, "quota": 10000, "period": 100000},
        "memory": {"limit": 64 * 2**20}}
    assert "seccomp" not in config["linux"]


def test_groups_are_the_sorted_union_of_gid_image_groups_supplemental_and_fs_group() -> None:
    pod = injected()
    pod["spec"]["securityContext"]["supplementalGroups"] = [3000, 20]
    sc = cri_spec.find_container(pod, "virtiofs-data")["securityContext"]
    sc["runAsGroup"] = 2000
    config = cri_spec.translate(pod, "virtiofs-data", ctx(image_groups=[44]))
    assert config["process"]["user"] == {"uid": 107, "gid": 2000,
                                         "additionalGids": [20, 44, 107, 2000, 3000]}


def test_capabilities_without_drop_all_are_containerds_defaults_minus_the_dropped() -> None:
    pod = injected()
    sc = cri_spec.find_container(pod, "virtiofs-data")["securityContext"]
    sc["capabilities"] = {"drop": ["NET_RAW", "mknod"], "add": ["SYS_PTRACE"]}
    caps = cri_spec.translate(pod, "virtiofs-data", ctx())["process"]["capabilities"]
    want = [c for c in cri_spec.DEFAULT_CAPS if c not in ("CAP_NET_RAW", "CAP_MKNOD")]
    assert caps == {"bounding": [*want, "CAP_SYS_PTRACE"], "effective": [*want, "CAP_SYS_PTRACE"],
                    "permitted": [*want, "CAP_SYS_PTRACE"]}


def test_allow_privilege_escalation_unset_leaves_new_privileges_on() -> None:
    pod = injected()
    del cri_spec.find_container(pod, "virtiofs-data")["securityContext"]["allowPrivilegeEscalation"]
    assert cri_spec.translate(pod, "virtiofs-data", ctx())["process"]["noNewPrivileges"] is False


HCO_LIKE = {
    "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
    "archMap": [{"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86"]}],
    "syscalls": [
        {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW", "comment": "x"},
        {"names": ["open_by_handle_at"], "action": "SCMP_ACT_ALLOW",
         "includes": {"caps": ["CAP_DAC_READ_SEARCH"]}},
        {"names": ["open_by_handle_at"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
         "excludes": {"caps": ["CAP_DAC_READ_SEARCH"]}},
        {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
         "args": [{"index": 0, "value": 8, "valueTwo": 0, "op": "SCMP_CMP_EQ"}],
         "includes": {"arches": ["s390x"]}},
    ],
}


def test_a_localhost_profile_is_decoded_as_json_unmarshal_does() -> None:
    """WithProfile: unknown fields (archMap, comment, includes, excludes) dropped, so every
    rule applies whatever the capabilities and the architecture."""
    pod = injected()
    pod["spec"]["securityContext"]["seccompProfile"] = {
        "type": "Localhost", "localhostProfile": "kubevirt/kubevirt.json"}
    path = "/var/lib/kubelet/seccomp/kubevirt/kubevirt.json"
    context = ctx(localhost_profiles={path: json.dumps(HCO_LIKE).encode()})
    assert cri_spec.localhost_profile_path(pod, "virtiofs-data", context) == path
    seccomp = cri_spec.translate(pod, "virtiofs-data", context)["linux"]["seccomp"]
    assert seccomp == {
        "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
        "syscalls": [
            {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["open_by_handle_at"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["open_by_handle_at"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
            {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": 8, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]},
        ]}
    # The init container has the pod's profile too (pod level, no container override).
    init = cri_spec.translate(pod, containers.LAUNCHER_INIT, context)
    assert init["linux"]["seccomp"] == seccomp


def test_a_container_level_profile_wins_over_the_pods() -> None:
    pod = injected()
    pod["spec"]["securityContext"]["seccompProfile"] = {
        "type": "Localhost", "localhostProfile": "kubevirt/kubevirt.json"}
    sc = cri_spec.find_container(pod, "virtiofs-data")["securityContext"]
    sc["seccompProfile"] = {"type": "Localhost", "localhostProfile": "fhmon/virtiofsd.json"}
    context = ctx(seccomp_root="/var/lib/k/seccomp")
    assert cri_spec.localhost_profile_path(pod, "virtiofs-data", context) == \
        "/var/lib/k/seccomp/fhmon/virtiofsd.json"
    sc["seccompProfile"] = {"type": "Unconfined"}
    assert "seccomp" not in cri_spec.translate(pod, "virtiofs-data", context)["linux"]


def test_a_missing_localhost_file_or_an_escaping_name_is_refused() -> None:
    pod = injected()
    pod["spec"]["securityContext"]["seccompProfile"] = {
        "type": "Localhost", "localhostProfile": "kubevirt/kubevirt.json"}
    with pytest.raises(cri_spec.TranslationError, match="cannot load seccomp profile"):
        cri_spec.translate(pod, "virtiofs-data", ctx())
    for bad in ("/etc/x.json", "../x.json", ""):
        pod["spec"]["securityContext"]["seccompProfile"]["localhostProfile"] = bad
        with pytest.raises(cri_spec.TranslationError, match="invalid localhostProfile"):
            cri_spec.translate(pod, "virtiofs-data", ctx())


def test_runtime_default_is_the_runtimes_default_for_the_bounding_set() -> None:
    """DefaultProfile(spec) is called with the container's bounding set; --seccomp-default
    applies it to pods that name no profile, and only to them."""
    asked: list[list[str]] = []

    def default(caps: Any) -> dict[str, Any]:
        asked.append(list(caps))
        return {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []}

    pod = injected()
    seccomp = cri_spec.translate(pod, "virtiofs-data", ctx(
        seccomp_default=True, runtime_default=default))["linux"]["seccomp"]
    assert seccomp == {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []} and asked == [[]]
    assert "seccomp" not in cri_spec.translate(pod, "virtiofs-data", ctx(
        runtime_default=default))["linux"]


def test_cri_o_reads_a_localhost_profile_with_its_conditions() -> None:
    """containers/common's reading (OpenShift): a capability-conditioned rule only with the
    capability, an architecture-conditioned one only there, archMap's architectures."""
    pod = injected()
    pod["spec"]["securityContext"]["seccompProfile"] = {
        "type": "Localhost", "localhostProfile": "kubevirt/kubevirt.json"}
    path = "/var/lib/kubelet/seccomp/kubevirt/kubevirt.json"
    context = ctx(localhost_profiles={path: json.dumps(HCO_LIKE).encode()},
                  seccomp_reader="cri-o")
    seccomp = cri_spec.translate(pod, "virtiofs-data", context)["linux"]["seccomp"]
    assert seccomp == {
        "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [
            {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["open_by_handle_at"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]}
    with_cap = cri_spec.containers_common_profile(HCO_LIKE, ["CAP_DAC_READ_SEARCH"])
    assert with_cap["syscalls"][1:] == [{"names": ["open_by_handle_at"],
                                         "action": "SCMP_ACT_ALLOW"}]


def test_what_the_kubelet_would_refuse_is_refused() -> None:
    pod = injected()
    sc = cri_spec.find_container(pod, "virtiofs-data")["securityContext"]
    sc["runAsUser"] = 0
    with pytest.raises(cri_spec.TranslationError, match="runAsNonRoot"):
        cri_spec.translate(pod, "virtiofs-data", ctx())
    with pytest.raises(cri_spec.TranslationError, match="no host directory"):
        cri_spec.translate(injected(), "virtiofs-data", ctx(volume_paths={}))
    with pytest.raises(cri_spec.TranslationError, match="0 containers"):
        cri_spec.translate(pod, "nope", ctx())


SECCOMP_DATA = Path(__file__).resolve().parents[1] / "data" / "seccomp"


def rules_for(profile: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [r for r in profile["syscalls"] if name in r["names"]]


def test_the_real_profiles_refuse_open_by_handle_at_as_containerd_loads_them() -> None:
    """What the HCO pod and a --seccomp-default kubelet give the virtiofs container on
    containerd: open_by_handle_at refused (EPERM) before any notify filter of the launcher."""
    runtime_default = cri_spec.decode_linux_seccomp(
        (SECCOMP_DATA / "containerd-runtime-default-amd64.json").read_bytes())
    assert runtime_default["defaultAction"] == "SCMP_ACT_ERRNO"
    assert rules_for(runtime_default, "open_by_handle_at") == []      # the default: EPERM
    assert [r["action"] for r in rules_for(runtime_default, "name_to_handle_at")] == [
        "SCMP_ACT_ALLOW"]
    hco = cri_spec.decode_linux_seccomp((SECCOMP_DATA / "kubevirt.json").read_bytes())
    # json.Unmarshal keeps both rules, their capability conditions gone.
    assert [(r["action"], r.get("errnoRet")) for r in rules_for(hco, "open_by_handle_at")] == [
        ("SCMP_ACT_ALLOW", None), ("SCMP_ACT_ERRNO", 1)]
    assert all(set(r) <= {"names", "action", "errnoRet", "args"} for r in hco["syscalls"])
    assert set(hco) == {"defaultAction", "defaultErrnoRet", "syscalls"}


@pytest.mark.parametrize("field,gone", [("hostPID", "pid"), ("hostIPC", "ipc"),
                                         ("hostNetwork", "network")])
def test_host_namespaces_leave_the_container_in_the_hosts(field: str, gone: str) -> None:
    pod = injected()
    pod["spec"][field] = True
    config = cri_spec.translate(pod, containers.LAUNCHER_INIT, ctx())
    kinds = [n["type"] for n in config["linux"]["namespaces"]]
    assert gone not in kinds and len(kinds) == len(NAMESPACES) - 1
    pod["spec"][field] = False
    config = cri_spec.translate(pod, containers.LAUNCHER_INIT, ctx())
    assert config["linux"]["namespaces"] == NAMESPACES
