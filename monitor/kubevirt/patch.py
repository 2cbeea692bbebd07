"""The plan that puts KubeVirt's virtiofs containers under fhmon, as JSON Patch operations.

virt-controller renders one container `virtiofs-<volume>` per filesystem volume of a VMI
(`/usr/libexec/virtiofsd --socket-path=... --shared-dir=/<volume> ...`, uid 107, no
capabilities). For those whose pod volume is a PersistentVolumeClaim (PVC and DataVolume
volumes both become one; monitor/kubevirt/volumes.py), the plan

- wraps virtiofsd in `fhmon launch` run by a self-contained launcher that an init container
  (from the fhmon image) copies into an emptyDir (the virt-launcher image has no Python),
  leaving KubeVirt's virtiofsd args as they are: the launcher adds the handle flags once
  fhmon serves it, and otherwise runs KubeVirt's command line unchanged (fails open);
- requests the device-plugin resource whose Allocate mounts fhmon's socket directory into
  the container (no hostPath in the pod);
- gives a container that would run under a seccomp profile fhmon's replacement for it
  (pods.replacement_profile), and leaves alone one under a profile fhmon has none for;
- keeps KubeVirt's migration mode, unless the pod's VM opted in (fhmon.io/migration:
  file-handles), when the launcher is told to migrate by handle.

virt-controller's temporary ephemeral-provisioning pods are left alone. Pure data: the
webhook sends the plan as a JSON Patch (`pod_patch`), `fhmon inject` applies the same plan
to the manifest's text (monitor/kubevirt/inject.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from monitor.kubevirt import pods
from monitor.kubevirt.containers import (
    DEFAULT_SETTINGS,
    LAUNCHER_INIT,
    LAUNCHER_VOLUME,
    Settings,
    as_list,
    inject_container,
    launcher_init_container,
    launcher_volume,
)
from monitor.kubevirt.pods import Path


@dataclass(frozen=True, slots=True)
class Op:
    """One JSON Patch operation; `path` ends in "-" to append to a list."""

    op: Literal["add", "replace"]
    path: Path
    value: Any

    def as_json_patch(self) -> dict[str, Any]:
        pointer = "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in self.path)
        return {"op": self.op, "path": pointer, "value": self.value}


def plan_pod(pod: Any, settings: Settings = DEFAULT_SETTINGS) -> list[Op]:
    """The operations that put the pod's PVC virtiofs containers under fhmon ([] if none)."""
    if not isinstance(pod, dict) or not isinstance(pod.get("spec"), dict):
        return []
    metadata = pods.metadata_of(pod)
    if pods.is_ephemeral_provisioning(metadata):
        return []
    by_handle = pods.migrates_by_handle(metadata)
    spec = pod["spec"]
    pod_volumes = {v["name"]: v for v in as_list(spec.get("volumes"))
                   if isinstance(v, dict) and isinstance(v.get("name"), str)}
    pod_seccomp = pods.seccomp_profile(spec.get("securityContext"))
    ops: list[Op] = []
    for index, container in enumerate(as_list(spec.get("containers"))):
        volume = pods.pvc_virtiofs_volume(container, pod_volumes)
        if volume is None:
            continue
        seccomp = pods.seccomp_profile(container.get("securityContext")) or pod_seccomp
        replacement = pods.replacement_profile(seccomp, settings)
        if replacement is False:
            continue
        ops.append(Op("replace", ("spec", "containers", index),
                      inject_container(container, volume, settings, seccomp_profile=replacement,
                                       migrate_by_handle=by_handle)))
    if not ops:
        return []
    if LAUNCHER_VOLUME not in pod_volumes:
        ops.append(_append(spec, "volumes", launcher_volume()))
    if not any(isinstance(c, dict) and c.get("name") == LAUNCHER_INIT
               for c in as_list(spec.get("initContainers"))):
        ops.append(_append(spec, "initContainers", launcher_init_container(settings)))
    return ops


def pod_patch(pod: Any, settings: Settings = DEFAULT_SETTINGS) -> list[dict[str, Any]]:
    """RFC 6902 JSON Patch for one Pod: exactly the edits `inject` makes to its text."""
    return [op.as_json_patch() for op in plan_pod(pod, settings)]


def plan_document(document: Any, settings: Settings = DEFAULT_SETTINGS) -> list[Op]:
    """The plans of every Pod in a document, their paths from the document's root."""
    return [Op(op.op, prefix + op.path, op.value)
            for prefix, pod in pods.pods_in(document) for op in plan_pod(pod, settings)]


def _append(spec: dict[str, Any], key: str, value: Any) -> Op:
    if isinstance(spec.get(key), list):
        return Op("add", ("spec", key, "-"), value)
    # Absent (or null): create the list. "replace" for null so that a JSON Patch applies.
    return Op("replace" if key in spec else "add", ("spec", key), [value])
