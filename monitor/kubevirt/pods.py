"""What a Pod says about itself: which of its containers are KubeVirt's virtiofsd of a PVC,
which seccomp profile each would run under, and which Pods a document holds.

Read-only and pure: monitor/kubevirt/patch.py turns these answers into a plan of edits.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from monitor.kubevirt import volumes
from monitor.kubevirt.containers import MIGRATION_BY_HANDLE, MIGRATION_LABEL, Settings, as_list

VIRTIOFSD = "/usr/libexec/virtiofsd"
CONTAINER_PREFIX = "virtiofs-"
# virt-controller's temporary pod that only binds WaitForFirstConsumer volumes
# (RenderLaunchManifestNoVm): it never runs a VM, so it gets nothing.
EPHEMERAL_PROVISIONING = "kubevirt.io/ephemeral-provisioning"
# KubeVirt's own Localhost profile (virt-handler installs it; HCO selects it).
KUBEVIRT_PROFILE = "kubevirt/kubevirt.json"

Path = tuple[str | int, ...]


def metadata_of(pod: dict[str, Any]) -> dict[str, Any]:
    found = pod.get("metadata")
    return found if isinstance(found, dict) else {}


def is_ephemeral_provisioning(metadata: dict[str, Any]) -> bool:
    annotations = metadata.get("annotations")
    return isinstance(annotations, dict) and annotations.get(EPHEMERAL_PROVISIONING) == "true"


def migrates_by_handle(metadata: dict[str, Any]) -> bool:
    """The pod's VM opted in to migration by file handle (fhmon.io/migration label)."""
    labels = metadata.get("labels")
    return isinstance(labels, dict) and labels.get(MIGRATION_LABEL) == MIGRATION_BY_HANDLE


def seccomp_profile(security_context: Any) -> dict[str, Any] | None:
    if isinstance(security_context, dict):
        profile = security_context.get("seccompProfile")
        if isinstance(profile, dict) and isinstance(profile.get("type"), str):
            return profile
    return None


def replacement_profile(profile: dict[str, Any] | None,
                        settings: Settings) -> str | Literal[False] | None:
    """The Localhost profile an injected virtiofs container gets instead of `profile` (the
    one it would run under: its own, else the pod's): None for none (unconfined), False to
    leave the container alone.

    The runtime's filter and the launcher's notify filter stack, and an ERRNO answer outranks
    USER_NOTIF: under the runtimes' defaults open_by_handle_at would fail before fhmon is
    asked. Each replacement is the profile it replaces with the two handle calls allowed and
    nothing else (monitor/kubevirt/seccomp.py; deploy/seccomp/). A Localhost profile fhmon
    has no replacement for is left as it is, and so is the container.
    """
    kind = profile.get("type") if profile else None
    if kind is None and settings.seccomp_default:
        kind = "RuntimeDefault"  # what the kubelet will apply
    if kind in (None, "Unconfined"):
        return None
    if kind == "RuntimeDefault":
        return f"{settings.profile_dir}/{settings.runtime}-runtime-default.json"
    if kind == "Localhost" and profile and profile.get("localhostProfile") == KUBEVIRT_PROFILE:
        return f"{settings.profile_dir}/kubevirt.json"
    return False


def pvc_virtiofs_volume(container: Any, pod_volumes: dict[Any, Any]) -> str | None:
    """The volume name if this is KubeVirt's (not yet injected) virtiofsd of a PVC."""
    if not isinstance(container, dict):
        return None
    name = container.get("name")
    if not isinstance(name, str) or not name.startswith(CONTAINER_PREFIX):
        return None
    volume = name[len(CONTAINER_PREFIX):]
    if container.get("command") != [VIRTIOFSD]:
        return None  # already injected, or not KubeVirt's rendering
    if not any(isinstance(m, dict) and m.get("name") == volume
               and m.get("mountPath") == f"/{volume}"
               for m in as_list(container.get("volumeMounts"))):
        return None
    if not volumes.qualifies(pod_volumes.get(volume)):
        return None  # ConfigMap, Secret, DownwardAPI, ServiceAccount...: no handles needed
    resources = container.get("resources")
    if resources is not None and not (isinstance(resources, dict) and all(
            isinstance(resources.get(key), dict | None) for key in ("limits", "requests"))):
        return None  # not KubeVirt's rendering (nor a pod the API server would take)
    return volume


def pods_in(document: Any) -> Iterator[tuple[Path, Any]]:
    """(path, pod) for a Pod document or each Pod of a List (kind List, PodList, ...)."""
    if not isinstance(document, dict):
        return
    if document.get("kind") == "Pod":
        yield (), document
    elif (isinstance(document.get("kind"), str) and document["kind"].endswith("List")
          and isinstance(document.get("items"), list)):
        for index, item in enumerate(document["items"]):
            if isinstance(item, dict) and item.get("kind", "Pod") == "Pod":
                yield ("items", index), item
