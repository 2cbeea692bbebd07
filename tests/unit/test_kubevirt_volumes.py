"""One decision about which volumes get handles: the webhook injects a PVC's virtiofs
container whatever its PV is, so the node's allow globs must accept where the kubelet puts
each kind of PV; checked with fhmon's own glob matching (monitor/policy.py) on the paths the
kubelet really uses."""

from __future__ import annotations

import pytest

from monitor import policy
from monitor.kubevirt import volumes

POD = "8f2e7c1a-8d43-4c0e-9a55-3f1f8f2d9c11"
PV = "pvc-5d6f0c0e-2b1d-4f59-9d8c-0b7e3b1f1a22"
# Where a PVC-backed volume's directory is on a node, per PV kind (kubelet's
# pods/<uid>/volumes/<escaped plugin name>/<volume>; CSI publishes to <volume>/mount;
# a hostPath PV is bind-mounted from the host path itself).
PV_PATHS = {
    "CSI": f"{{root}}/pods/{POD}/volumes/kubernetes.io~csi/{PV}/mount",
    "in-tree NFS": f"{{root}}/pods/{POD}/volumes/kubernetes.io~nfs/{PV}",
    "local PV": f"{{root}}/pods/{POD}/volumes/kubernetes.io~local-volume/{PV}",
    "local-path hostPath PV": f"/opt/local-path-provisioner/{PV}_default_data-pvc",
}
# What the webhook does not inject and the node need not accept.
OTHER_PATHS = {
    "Secret": f"{{root}}/pods/{POD}/volumes/kubernetes.io~secret/credentials",
    "ConfigMap": f"{{root}}/pods/{POD}/volumes/kubernetes.io~configmap/settings",
    "projected": f"{{root}}/pods/{POD}/volumes/kubernetes.io~projected/kube-api-access",
    "CSI staging": f"{{root}}/plugins/kubernetes.io/csi/driver/{PV}/globalmount",
    "CSI volume dir": f"{{root}}/pods/{POD}/volumes/kubernetes.io~csi/{PV}",
    "the pods dir": f"{{root}}/pods/{POD}",
}


def accepted(path: str, globs: list[str]) -> bool:
    return any(policy.glob_matches(pattern, path) for pattern in globs)


@pytest.mark.parametrize("root", ["/var/lib/kubelet", "/var/snap/microk8s/common/var/lib/kubelet",
                                  "/data/kubelet/"])
@pytest.mark.parametrize("kind", sorted(PV_PATHS))
def test_the_node_accepts_every_pv_a_claim_can_be_bound_to(root: str, kind: str) -> None:
    globs = volumes.node_allow_globs(root)
    path = PV_PATHS[kind].format(root=root.rstrip("/"))
    assert accepted(path, globs), (kind, path)
    # A default-root node's globs do not cover another root: the kubelet root is a setting.
    if root != volumes.KUBELET_ROOT and "{root}" in PV_PATHS[kind]:
        assert not accepted(path, volumes.node_allow_globs())


@pytest.mark.parametrize("kind", sorted(OTHER_PATHS))
def test_the_node_refuses_what_is_not_a_pv(kind: str) -> None:
    path = OTHER_PATHS[kind].format(root=volumes.KUBELET_ROOT)
    assert not accepted(path, volumes.node_allow_globs()), kind


def test_the_webhook_injects_only_claims() -> None:
    assert volumes.qualifies({"name": "d", "persistentVolumeClaim": {"claimName": "x"}})
    for source in ({"configMap": {"name": "x"}}, {"secret": {"secretName": "x"}},
                   {"downwardAPI": {"items": []}}, {"projected": {"sources": []}},
                   {"emptyDir": {}}, {"hostPath": {"path": "/x"}},
                   {"persistentVolumeClaim": None}, None, "pvc"):
        assert not volumes.qualifies(source if not isinstance(source, dict)
                                     else {"name": "d", **source}), source
