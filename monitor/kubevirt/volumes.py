"""Which volumes get file handles: one decision for the webhook and for the node.

The webhook sees a pod, not its PersistentVolumes: a `persistentVolumeClaim` pod volume may
be bound to a CSI volume, an in-tree NFS export, a `local` PV or a `hostPath` PV (the
local-path provisioner's), and the webhook cannot tell which. So the node must accept every
place the kubelet puts what a claim can be bound to, or a VM whose container the webhook
injected would find its registration refused. These are those places, as globs relative to
the kubelet's root (`--root-dir`, /var/lib/kubelet by default) or absolute for hostPath PVs;
deploy/base/daemonset.yaml passes exactly `node_allow_globs()` as fhmon's --allow flags
(tests/deploy checks), and mounts each glob's fixed root into the fhmon container.

Not in the list on purpose: ConfigMap, Secret, DownwardAPI and projected volumes (small,
read-only, served without handles; the webhook never injects them), and other in-tree
plugins of retired drivers (iSCSI, RBD, ... now CSI; add a glob where a cluster still has one).
"""

from __future__ import annotations

from typing import Any

# Pod volume sources whose virtiofs container the webhook injects.
INJECTED_SOURCES = frozenset({"persistentVolumeClaim"})

KUBELET_ROOT = "/var/lib/kubelet"
# Per pod, where the kubelet mounts a PV (kubelet/volume/util: pods/<uid>/volumes/<plugin>/<pv>).
KUBELET_VOLUME_GLOBS = (
    "pods/*/volumes/kubernetes.io~csi/*/mount",  # CSI: the publish target is <pv>/mount
    "pods/*/volumes/kubernetes.io~nfs/*",  # in-tree NFS PVs
    "pods/*/volumes/kubernetes.io~local-volume/*",  # `local` PVs
    # emptyDir: not injected by the webhook; for hand-written pods (deploy/examples).
    "pods/*/volumes/kubernetes.io~empty-dir/*",
)
# hostPath PVs are bind-mounted from the host path itself; this is the local-path
# provisioner's default (k3s: /var/lib/rancher/k3s/storage/*; add it where used).
HOSTPATH_PV_GLOBS = ("/opt/local-path-provisioner/*",)


def qualifies(volume: Any) -> bool:
    """Whether the webhook injects the virtiofs container of this pod volume."""
    return isinstance(volume, dict) and any(
        isinstance(volume.get(source), dict) for source in INJECTED_SOURCES)


def node_allow_globs(kubelet_root: str = KUBELET_ROOT,
                     hostpath_globs: tuple[str, ...] = HOSTPATH_PV_GLOBS) -> list[str]:
    """fhmon's --allow globs on a node, as paths the fhmon container sees."""
    root = kubelet_root.rstrip("/")
    return [f"{root}/{glob}" for glob in KUBELET_VOLUME_GLOBS] + list(hostpath_globs)
