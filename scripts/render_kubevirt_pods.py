"""Render the virt-launcher pods of tests/data/kubevirt/pods/ the way KubeVirt renders them.

  python3 scripts/render_kubevirt_pods.py

Each builder follows kubevirt/kubevirt's Go code field by field (the commit is in
tests/data/kubevirt/pods/README.md; the functions are named at each step): the object is
written in the field order of the Go structs (k8s.io/api core/v1), omitempty fields left out,
as the API server shows the pod to an admission webhook. Values KubeVirt takes from the VMI
or the cluster (names, uid, image, the qemu timeout's jitter) are fixed examples.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "kubevirt" / "pods"
IMAGE = "quay.io/kubevirt/virt-launcher:v1.7.0"
VMI_UID = "8f2e7c1a-8d43-4c0e-9a55-3f1f8f2d9c11"
QEMU = 107  # util.NonRootUID
SOCKETS = "/var/run/kubevirt/virtiofs-containers"  # virtiofs.VirtioFSContainersMountBaseDir
PRIVATE = "/var/run/kubevirt-private"  # config.mountBaseDir


def virtiofs_resources() -> dict[str, Any]:
    """pkg/virtiofs/resources.go ResourcesForVirtioFSContainer (no dedicated CPUs, no
    guaranteed QOS, no support-container overrides); Go maps marshal with sorted keys."""
    return {"limits": {"cpu": "100m", "memory": "80M"},
            "requests": {"cpu": "10m", "memory": "1M"}}


def virtiofs_security_context() -> dict[str, Any]:
    """virtiofs.go generateContainerFromVolume; k8s SecurityContext field order."""
    return {"capabilities": {"drop": ["ALL"]}, "runAsUser": QEMU, "runAsGroup": QEMU,
            "runAsNonRoot": True, "allowPrivilegeEscalation": False}


def virtiofs_container(volume: str, kind: str = "pvc") -> dict[str, Any]:
    """services/virtiofs.go generateContainerFromVolume for one filesystem volume."""
    mount_point = {"pvc": f"/{volume}", "configMap": f"{PRIVATE}/config-map/{volume}",
                   "secret": f"{PRIVATE}/secret/{volume}",
                   "serviceAccount": "/var/run/secrets/kubernetes.io/serviceaccount/",
                   "downwardAPI": f"{PRIVATE}/downwardapi/{volume}"}[kind]
    args = [f"--socket-path={SOCKETS}/{volume}.sock", f"--shared-dir={mount_point}",
            "--sandbox=none", "--cache=auto", "--migration-on-error=guest-error",
            "--migration-mode=find-paths"]
    if kind == "serviceAccount":
        args.append(f"--translate-uid=host:{QEMU}:0:1")
    mounts = [{"name": "virtiofs-containers", "mountPath": SOCKETS}]
    if kind != "serviceAccount":  # isAutoMount: the token is the pod's automount
        mounts.append({"name": volume, "mountPath": mount_point})
    return {"name": f"virtiofs-{volume}", "image": IMAGE, "command": ["/usr/libexec/virtiofsd"],
            "args": args, "resources": virtiofs_resources(), "volumeMounts": mounts,
            "imagePullPolicy": "IfNotPresent", "securityContext": virtiofs_security_context()}


def containerpath_virtiofs_container(volume: str, source: str, sub_path: str = "",
                                     translate_uid: bool = False) -> dict[str, Any]:
    """virt-api's virt-launcher-pod-mutator createVirtiofsContainer (a containerPath
    volume: the compute container's mount of `source`, read-only, at /virtiofs-data/<vol>)."""
    inside = f"/virtiofs-data/{volume}"
    args = [f"--socket-path={SOCKETS}/{volume}.sock", f"--shared-dir={inside}",
            "--sandbox=none", "--cache=auto", "--migration-on-error=guest-error",
            "--migration-mode=find-paths"]
    if translate_uid:
        args.append(f"--translate-uid=host:{QEMU}:0:1")
    mount: dict[str, Any] = {"name": source, "readOnly": True, "mountPath": inside}
    if sub_path:
        mount["subPath"] = sub_path
    return {"name": f"virtiofs-{volume}", "image": IMAGE, "command": ["/usr/libexec/virtiofsd"],
            "args": args, "resources": virtiofs_resources(),
            "volumeMounts": [{"name": "virtiofs-containers", "mountPath": SOCKETS}, mount],
            "imagePullPolicy": "IfNotPresent", "securityContext": virtiofs_security_context()}


def guest_console_log() -> dict[str, Any]:
    """services/serialconsolelog.go generateSerialConsoleLogContainer: a native sidecar (an
    init container with restartPolicy Always)."""
    return {"name": "guest-console-log", "image": IMAGE, "command": ["/usr/bin/virt-tail"],
            "args": ["--logfile", f"{PRIVATE}/vm1/virt-serial0-log"],
            "env": [{"name": "VIRT_LAUNCHER_LOG_VERBOSITY", "value": "2"}],
            "resources": {"limits": {"cpu": "15m", "memory": "60M"},
                          "requests": {"cpu": "5m", "memory": "35M"}},
            "restartPolicy": "Always",
            "volumeMounts": [{"name": "private", "readOnly": True, "mountPath": PRIVATE}],
            "imagePullPolicy": "IfNotPresent",
            "securityContext": {"capabilities": {"drop": ["ALL"]}, "runAsUser": QEMU,
                                "runAsNonRoot": True, "allowPrivilegeEscalation": False}}


def compute(filesystem_mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """services/template.go renderLaunchManifest's compute container (rendercontainer.go
    Render: non-root, capabilities NET_BIND_SERVICE added and ALL dropped)."""
    return {
        "name": "compute", "image": IMAGE, "command": ["/usr/bin/virt-launcher-monitor",
        "--qemu-timeout", "281s", "--name", "vm1", "--uid", VMI_UID, "--namespace", "default",
        "--kubevirt-share-dir", "/var/run/kubevirt", "--ephemeral-disk-dir",
        "/var/run/kubevirt-ephemeral-disks", "--container-disk-dir",
        "/var/run/kubevirt/container-disks", "--grace-period-seconds", "45",
        "--hook-sidecars", "0", "--ovmf-path", "/usr/share/OVMF", "--disk-memory-limit",
        "2097152000", "--hypervisor", "kvm", "--run-as-nonroot"],
        "env": [{"name": "XDG_CACHE_HOME", "value": "/var/run/kubevirt-private"},
                {"name": "XDG_CONFIG_HOME", "value": "/var/run/kubevirt-private"},
                {"name": "XDG_RUNTIME_DIR", "value": "/var/run"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": {"limits": {"devices.kubevirt.io/kvm": "1", "devices.kubevirt.io/tun": "1",
                                 "devices.kubevirt.io/vhost-net": "1"},
                      "requests": {"cpu": "100m", "ephemeral-storage": "50M",
                                   "memory": "1294Mi"}},
        "volumeMounts": [
            {"name": "private", "mountPath": PRIVATE},
            {"name": "public", "mountPath": "/var/run/kubevirt"},
            {"name": "ephemeral-disks", "mountPath": "/var/run/kubevirt-ephemeral-disks"},
            {"name": "libvirt-runtime", "mountPath": "/var/run/libvirt"},
            {"name": "sockets", "mountPath": "/var/run/kubevirt/sockets"},
            {"name": "container-disks", "mountPath": "/var/run/kubevirt/container-disks",
             "mountPropagation": "HostToContainer"},
            *filesystem_mounts,
            {"name": "virtiofs-containers", "mountPath": SOCKETS}],
        "terminationMessagePolicy": "FallbackToLogsOnError", "imagePullPolicy": "IfNotPresent",
        "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                            "runAsUser": QEMU, "runAsGroup": QEMU, "runAsNonRoot": True,
                            "allowPrivilegeEscalation": False}}


def pod(filesystems: list[tuple[str, str, dict[str, Any]]], *, console_log: bool = True,
        seccomp: dict[str, Any] | None = None, annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None, service_account: str = "") -> dict[str, Any]:
    """renderLaunchManifest for a VMI named vm1 with these filesystems: (volume, kind,
    the pod volume's source)."""
    volumes = [{"name": n, "emptyDir": {}} for n in (
        "private", "public", "sockets", "virt-bin-share-dir", "libvirt-runtime",
        "ephemeral-disks", "container-disks")]  # rendervolumes.go Volumes()
    volumes += [{"name": name, **source} for name, kind, source in filesystems
                if kind != "serviceAccount"]
    volumes.append({"name": "virtiofs-containers", "emptyDir": {}})  # withVirioFS
    containers = [compute([])]
    containers += [virtiofs_container(name, kind) for name, kind, _ in filesystems]
    metadata: dict[str, Any] = {
        "generateName": "virt-launcher-vm1-", "namespace": "default",
        "labels": {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": VMI_UID,
                   "kubevirt.io/vm": "vm1", "vm.kubevirt.io/name": "vm1",
                   "vmi.kubevirt.io/id": "vm1", **(labels or {})},
        "annotations": {"descheduler.alpha.kubernetes.io/request-evict-only": "",
                        "kubectl.kubernetes.io/default-container": "compute",
                        "kubevirt.io/domain": "vm1", "kubevirt.io/migrationTransportUnix": "true",
                        **(annotations or {})},
        "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                             "name": "vm1", "uid": VMI_UID, "controller": True,
                             "blockOwnerDeletion": True}]}
    metadata["labels"] = dict(sorted(metadata["labels"].items()))
    metadata["annotations"] = dict(sorted(metadata["annotations"].items()))
    security: dict[str, Any] = {"runAsUser": QEMU, "runAsGroup": QEMU, "runAsNonRoot": True,
                                "fsGroup": QEMU}
    if seccomp:
        security["seccompProfile"] = seccomp
    spec: dict[str, Any] = {"volumes": volumes}
    if console_log:
        spec["initContainers"] = [guest_console_log()]
    spec |= {"containers": containers, "restartPolicy": "Never",
             "terminationGracePeriodSeconds": 60,
             "nodeSelector": {"kubevirt.io/schedulable": "true"}}
    if service_account:
        spec["serviceAccountName"] = service_account
    spec |= {"automountServiceAccountToken": bool(service_account),
             "securityContext": security, "hostname": "vm1",
             "readinessGates": [{"conditionType": "kubevirt.io/virtual-machine-unpaused"}],
             "enableServiceLinks": False}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


PVC = ("data", "pvc", {"persistentVolumeClaim": {"claimName": "data-pvc"}})
DATAVOLUME = ("rootdv", "pvc", {"persistentVolumeClaim": {"claimName": "rootdv"}})
CONFIGMAP = ("settings", "configMap", {"configMap": {"name": "app-settings"}})
SECRET = ("credentials", "secret", {"secret": {"secretName": "app-credentials"}})
SERVICEACCOUNT = ("sa", "serviceAccount", {})
DOWNWARDAPI = ("podinfo", "downwardAPI", {"downwardAPI": {"items": [
    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}})


def fixtures() -> dict[str, tuple[str, dict[str, Any]]]:
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    out["default"] = ("The default source pod: a PVC and a DataVolume filesystem, the "
                      "guest-console-log native sidecar.", pod([PVC, DATAVOLUME]))
    out["no-init-containers"] = ("Serial console log disabled: no initContainers at all.",
                                 pod([PVC], console_log=False))
    target = pod([PVC, DATAVOLUME])
    # watch/migration/migration.go createTargetPod: the job label and name annotation, the
    # anti-affinity to the source node.
    target["metadata"]["labels"]["kubevirt.io/migrationJobUID"] = (
        "1d1f9d7e-5b8c-4f7e-9a0b-7c2d3e4f5a6b")
    target["metadata"]["labels"] = dict(sorted(target["metadata"]["labels"].items()))
    target["metadata"]["annotations"]["kubevirt.io/migrationJobName"] = "vm1-migration"
    target["metadata"]["annotations"] = dict(sorted(target["metadata"]["annotations"].items()))
    target["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                   "values": ["node-a"]}]}]}}}
    out["migration-target"] = ("The target pod of a live migration.", target)
    hco = pod([PVC], seccomp={"type": "Localhost",
                              "localhostProfile": "kubevirt/kubevirt.json"})
    hco["metadata"]["namespace"] = "vms"
    out["hco"] = ("OpenShift Virtualization: HCO sets seccompConfiguration to Localhost "
                  "kubevirt/kubevirt.json, rendered pod-level.", hco)
    out["runtime-default"] = ("seccompConfiguration with runtimeDefaultProfile: pod-level "
                              "RuntimeDefault.", pod([PVC], seccomp={"type": "RuntimeDefault"}))
    out["unknown-localhost"] = ("A Localhost profile fhmon has no replacement for.",
                                pod([PVC], seccomp={"type": "Localhost",
                                                    "localhostProfile": "site/custom.json"}))
    out["non-pvc-filesystems"] = (
        "ConfigMap, Secret, ServiceAccount (--translate-uid, the automounted token) and "
        "DownwardAPI filesystems: nothing to inject.",
        pod([CONFIGMAP, SECRET, SERVICEACCOUNT, DOWNWARDAPI], service_account="vm1-sa"))
    out["mixed-filesystems"] = ("A PVC beside ConfigMap, Secret, ServiceAccount and "
                                "DownwardAPI filesystems.",
                                pod([PVC, CONFIGMAP, SECRET, SERVICEACCOUNT, DOWNWARDAPI],
                                    service_account="vm1-sa"))
    containerpath = pod([PVC])
    compute_mounts = containerpath["spec"]["containers"][0]["volumeMounts"]
    compute_mounts.insert(-1, {"name": "kube-api-access", "readOnly": True,
                               "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"})
    containerpath["spec"]["volumes"].append({"name": "kube-api-access", "projected": {
        "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}],
        "defaultMode": 420}})
    containerpath["spec"]["containers"].append(containerpath_virtiofs_container(
        "token", "kube-api-access", translate_uid=True))
    out["containerpath"] = ("After virt-api's virt-launcher-pod-mutator added the virtiofs "
                            "container of a containerPath volume (a projected "
                            "service-account token).", containerpath)
    ephemeral = pod([PVC], annotations={"kubevirt.io/ephemeral-provisioning": "true"})
    out["ephemeral-provisioning"] = ("RenderLaunchManifestNoVm: the temporary pod that binds "
                                     "WaitForFirstConsumer volumes.", ephemeral)
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (about, value) in fixtures().items():
        text = yaml.safe_dump(copy.deepcopy(value), sort_keys=False, width=100)
        (OUT / f"{name}.yaml").write_text(f"# {about}\n" + text)


if __name__ == "__main__":
    main()
