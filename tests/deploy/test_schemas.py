"""Every manifest under deploy/ against the Kubernetes OpenAPI schemas (kubernetes-validate,
strict: unknown fields fail), for the oldest and newest targeted Kubernetes minor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.checks import broken
from tests.deploy.flags import fhmon_container
from tests.deploy.render import (
    COMPONENTS,
    DEPLOY,
    EXAMPLES,
    K8S_VERSIONS,
    kustomization_roots,
    load_docs,
    load_kustomization,
    render,
)


def manifest_cases() -> list[tuple[str, dict[str, Any]]]:
    sources: list[tuple[Path, list[dict[str, Any]]]] = [
        (root, render(root)) for root in kustomization_roots()
    ]
    for comp in sorted(COMPONENTS.iterdir()):
        ck = load_kustomization(comp, "Component")
        sources += [(comp, load_docs(comp / res)) for res in ck.get("resources", [])]
    sources += [(path, load_docs(path)) for path in sorted(EXAMPLES.glob("*.yaml"))]
    return [
        (f"{src.relative_to(DEPLOY)}:{obj['kind']}/{obj['metadata']['name']}", obj)
        for src, objs in sources
        for obj in objs
    ]


CASES = manifest_cases()
# Kinds without a schema in kubernetes-validate (custom resources), checked by hand below.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"),
                ("monitoring.coreos.com/v1", "PrometheusRule"),
                ("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate"),
                # OpenShift's, against its own CRD schema: tests/deploy/test_openshift_scc.py
                ("security.openshift.io/v1", "SecurityContextConstraints")}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name,obj", CASES, ids=[c[0] for c in CASES])
def test_manifest_matches_kubernetes_schema(name: str, obj: dict[str, Any], version: str) -> None:
    if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(obj, version, strict=True)
        return
    kubernetes_validate.validate(obj, version, strict=True)


def test_every_yaml_under_deploy_is_validated() -> None:
    """Each YAML file under deploy/ is a kustomization or a resource the schema test sees."""
    covered = set()
    for root in kustomization_roots() + sorted(COMPONENTS.iterdir()):
        k = yaml.safe_load((root / "kustomization.yaml").read_text())
        covered.add((root / "kustomization.yaml").resolve())
        for res in k.get("resources", []):
            path = (root / res).resolve()
            if path.is_file():
                covered.add(path)
    covered |= {p.resolve() for p in EXAMPLES.glob("*.yaml")}
    on_disk = {p.resolve() for p in DEPLOY.rglob("*.y*ml")}
    assert on_disk - covered == set()


def test_negative_schema_rejects_unknown_field(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    fhmon_container(ds)["securityContext"]["capabilites"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSIONS[0], strict=True)
