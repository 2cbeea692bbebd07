"""OpenShift admits fhmon (issue 36.4): deploy/overlays/openshift's SCC is valid by OpenShift's
published schema, admits the DaemonSet's pod, grants nothing the pod does not use, and is
bound to fhmon's ServiceAccount alone; the webhook runs under the default restricted-v2."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.render import OVERLAYS, REPO, by_kind, one, pod_spec, render
from tests.deploy.scc import refusals

OVERLAY = OVERLAYS / "openshift"
SCC_FILE = OVERLAY / "scc.yaml"
CRD = REPO / "tests" / "data" / "openshift" / "securitycontextconstraints.crd.yaml"
CRD_SHA256 = "caeeb85886a16888227e7a924a9e8e861a7aa0cbf62cf0252a316f90692a2837"

# restricted-v2, the SCC every authenticated user gets, as OpenShift ships it
# (openshift/cluster-kube-apiserver-operator, bindata/bootkube/scc-manifests/
# 0000_20_kube-apiserver-operator_00_scc-restricted-v2.yaml): the fields admission reads.
RESTRICTED_V2: dict[str, Any] = {
    "allowHostDirVolumePlugin": False, "allowHostIPC": False, "allowHostNetwork": False,
    "allowHostPID": False, "allowHostPorts": False, "allowPrivilegeEscalation": False,
    "allowPrivilegedContainer": False, "allowedCapabilities": ["NET_BIND_SERVICE"],
    "fsGroup": {"type": "MustRunAs"}, "readOnlyRootFilesystem": False,
    "requiredDropCapabilities": ["ALL"], "runAsUser": {"type": "MustRunAsRange"},
    "seLinuxContext": {"type": "MustRunAs"}, "seccompProfiles": ["runtime/default"],
    "supplementalGroups": {"type": "RunAsAny"},
    "volumes": ["configMap", "downwardAPI", "emptyDir", "persistentVolumeClaim", "projected",
                "secret"],
}


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render(OVERLAY)


@pytest.fixture(scope="module")
def scc(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    return one(rendered, "SecurityContextConstraints")


@pytest.fixture(scope="module")
def fhmon_pod(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    spec = pod_spec(one(rendered, "DaemonSet"))
    assert spec is not None
    return spec


def strict(schema: Any) -> Any:
    """The CRD's schema with unknown fields refused wherever it names the fields (the API
    server prunes them; `kubectl apply --validate=strict` refuses them)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if out.pop("nullable", False) and "type" in out:  # OpenAPI's null, in JSON Schema
            out["type"] = [out["type"], "null"]
        if "properties" in out and "object" in out.get("type", ()):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def scc_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = strict(version["schema"]["openAPIV3Schema"])
    return schema


def test_the_schema_is_the_published_one() -> None:
    assert hashlib.sha256(CRD.read_bytes()).hexdigest() == CRD_SHA256
    crd = yaml.safe_load(CRD.read_text())
    assert crd["metadata"]["name"] == "securitycontextconstraints.security.openshift.io"


def test_scc_matches_openshifts_schema(scc: dict[str, Any]) -> None:
    assert scc["apiVersion"] == "security.openshift.io/v1"
    jsonschema.validate(scc, scc_schema())


def test_schema_check_refuses_a_misspelt_field(scc: dict[str, Any]) -> None:
    bad = copy.deepcopy(scc)
    bad["allowHostPid"] = True
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, scc_schema())
    bad = copy.deepcopy(scc)
    bad["runAsUser"]["uid"] = "0"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, scc_schema())


def test_scc_admits_the_daemonset(scc: dict[str, Any], fhmon_pod: dict[str, Any]) -> None:
    assert refusals(scc, fhmon_pod) == []


def withdrawn(scc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SCC with one of its grants taken away, for each grant it makes."""
    out = []
    for field in ("allowHostPID", "allowHostDirVolumePlugin"):
        less = copy.deepcopy(scc)
        less[field] = False
        out.append((field, less))
    for list_field in ("volumes", "allowedCapabilities", "seccompProfiles"):
        for item in scc[list_field]:
            less = copy.deepcopy(scc)
            less[list_field].remove(item)
            out.append((f"{list_field} {item}", less))
    less = copy.deepcopy(scc)
    less["runAsUser"] = {"type": "MustRunAsNonRoot"}
    out.append(("runAsUser 0", less))
    less = copy.deepcopy(scc)
    less["seLinuxContext"]["seLinuxOptions"]["type"] = "container_t"
    out.append(("seLinux spc_t", less))
    return out


@pytest.mark.parametrize("grant", [name for name, _ in withdrawn(
    next(yaml.safe_load_all(SCC_FILE.read_text())))])
def test_every_grant_is_needed(grant: str, scc: dict[str, Any],
                               fhmon_pod: dict[str, Any]) -> None:
    (less,) = [s for name, s in withdrawn(scc) if name == grant]
    assert refusals(less, fhmon_pod), f"the DaemonSet does not need {grant}"


def test_nothing_else_is_granted(scc: dict[str, Any]) -> None:
    for field in ("allowHostNetwork", "allowHostIPC", "allowHostPorts",
                  "allowPrivilegedContainer", "allowPrivilegeEscalation",
                  "defaultAllowPrivilegeEscalation"):
        assert scc[field] is False, field
    assert scc["readOnlyRootFilesystem"] is True
    assert scc["requiredDropCapabilities"] == ["ALL"]
    assert not scc.get("defaultAddCapabilities")
    assert scc["runAsUser"] == {"type": "MustRunAs", "uid": 0}
    assert scc["seLinuxContext"] == {"type": "MustRunAs", "seLinuxOptions": {"type": "spc_t"}}
    assert "*" not in scc["volumes"] + scc["allowedCapabilities"] + scc["seccompProfiles"]
    assert not scc.get("allowedUnsafeSysctls") and scc["forbiddenSysctls"] == ["*"]


def test_refused_without_its_scc(fhmon_pod: dict[str, Any]) -> None:
    """The default SCC refuses the DaemonSet, for the reasons the SCC exists."""
    why = "\n".join(refusals(RESTRICTED_V2, fhmon_pod))
    for reason in ("pod: hostPID", "hostPath not allowed", "capability DAC_READ_SEARCH",
                   "runAsUser 0 outside", "seccomp profile unconfined",
                   "seLinuxOptions.type spc_t not allowed"):
        assert reason in why


def test_bound_to_the_service_account_alone(rendered: list[dict[str, Any]],
                                            scc: dict[str, Any]) -> None:
    assert scc["users"] == [] and scc["groups"] == [] and scc.get("priority") is None
    daemonset = one(rendered, "DaemonSet")
    namespace = daemonset["metadata"]["namespace"]
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    roles = [r for r in by_kind(rendered, "ClusterRole") + by_kind(rendered, "Role")
             if any("securitycontextconstraints" in rule.get("resources", [])
                    for rule in r["rules"])]
    assert len(roles) == 1 and roles[0]["kind"] == "ClusterRole"
    (rule,) = roles[0]["rules"]
    assert rule == {"apiGroups": ["security.openshift.io"],
                    "resources": ["securitycontextconstraints"],
                    "resourceNames": [scc["metadata"]["name"]], "verbs": ["use"]}
    bindings = [b for b in by_kind(rendered, "RoleBinding") + by_kind(rendered,
                                                                     "ClusterRoleBinding")
                if b["roleRef"]["name"] == roles[0]["metadata"]["name"]]
    assert len(bindings) == 1 and bindings[0]["kind"] == "RoleBinding"
    assert bindings[0]["metadata"]["namespace"] == namespace
    assert bindings[0]["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                        "namespace": namespace}]


def test_pods_name_their_scc(rendered: list[dict[str, Any]], scc: dict[str, Any]) -> None:
    annotations = one(rendered, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["openshift.io/required-scc"] == scc["metadata"]["name"]
    webhook = one(rendered, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert webhook["openshift.io/required-scc"] == "restricted-v2"


def test_the_webhook_runs_under_restricted_v2(rendered: list[dict[str, Any]]) -> None:
    spec = pod_spec(one(rendered, "Deployment"))
    assert spec is not None
    assert refusals(RESTRICTED_V2, spec) == []
    assert spec["securityContext"]["runAsNonRoot"] is True
    # the base's fixed uid, which restricted-v2 refuses, is what the overlay takes out
    base = pod_spec(one(render(OVERLAYS / "kubevirt"), "Deployment"))
    assert base is not None
    assert any("runAsUser 65534 outside" in r for r in refusals(RESTRICTED_V2, base))


RESTRICTIONS = {"readOnlyRootFilesystem", "requiredDropCapabilities", "forbiddenSysctls"}


def test_every_grant_says_why(scc: dict[str, Any]) -> None:
    """Each field of the SCC that grants something comes right after a comment: its reason."""
    grants = {field for field, value in scc.items()
              if value not in (False, [], None) and field not in RESTRICTIONS
              and field not in ("apiVersion", "kind", "metadata")}
    assert {"allowHostPID", "volumes", "allowedCapabilities", "runAsUser"} <= grants
    lines = SCC_FILE.read_text().split("\n---\n", 1)[0].splitlines()
    unexplained = [field for field in sorted(grants)
                   if not any(line.startswith(f"{field}:") and index
                              and lines[index - 1].startswith("#")
                              for index, line in enumerate(lines))]
    assert unexplained == []


def test_scc_file_is_rendered() -> None:
    assert Path("scc.yaml") in {Path(r) for r in
                                yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())[
                                    "resources"]}
