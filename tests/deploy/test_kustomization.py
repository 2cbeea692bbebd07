"""The kustomizations: what the base and overlays render, labels and namespaces, the image,
and agreement with `kubectl kustomize` where it is installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.checks import CONFIG_MAP
from tests.deploy.render import (
    CLUSTER_SCOPED,
    COMPONENTS,
    DEPLOY,
    NAMESPACE,
    OVERLAYS,
    all_containers,
    by_kind,
    key,
    kustomization_roots,
    load_docs,
    render,
    write_composite,
)


def test_base_renders_expected_objects(base: list[dict[str, Any]]) -> None:
    assert sorted(key(o) for o in base) == [
        ("ConfigMap", NAMESPACE, CONFIG_MAP),
        ("DaemonSet", NAMESPACE, "fhmon"),
        ("Service", NAMESPACE, "fhmon-metrics"),
        ("ServiceAccount", NAMESPACE, "fhmon"),
    ]
    # The key Secret is created by the operator from `fhmon keygen` output, never shipped.
    assert by_kind(base, "Secret") == []


def test_overlay_adds_servicemonitor_in_namespace(base: list[dict[str, Any]]) -> None:
    overlay = render(OVERLAYS / "prometheus-operator")
    added = {key(o) for o in overlay} - {key(o) for o in base}
    assert added == {("ServiceMonitor", NAMESPACE, "fhmon"), ("PrometheusRule", NAMESPACE, "fhmon")}


@pytest.mark.parametrize("root", kustomization_roots(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_all_objects_labelled_and_namespaced(root: Path) -> None:
    namespace = yaml.safe_load((root / "kustomization.yaml").read_text())["namespace"]
    assert namespace == ("openshift-cnv" if root.name == "openshift" else NAMESPACE)
    for obj in render(root):
        if obj["kind"] in CLUSTER_SCOPED:
            continue
        assert obj["metadata"]["namespace"] == namespace, key(obj)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "fhmon", key(obj)


def test_image_is_set_by_kustomization(daemonset: dict[str, Any]) -> None:
    images = {c["image"] for c in all_containers(daemonset["spec"]["template"]["spec"])}
    assert images == {"localhost/fhmon:latest"}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
@pytest.mark.parametrize("root", ["base", "overlays/prometheus-operator", "overlays/kubevirt",
                                  "overlays/kubevirt-self-signed", "composite"])
def test_renderer_agrees_with_kubectl_kustomize(root: str, tmp_path: Path) -> None:
    directory = write_composite(tmp_path) if root == "composite" else DEPLOY / root
    out = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    theirs = sorted(yaml.safe_load_all(out), key=key)
    ours = sorted(render(directory), key=key)
    assert [key(o) for o in ours] == [key(o) for o in theirs]
    assert ours == theirs


def test_pod_security_component_labels_the_namespace() -> None:
    (ns,) = load_docs(COMPONENTS / "pod-security" / "namespace.yaml")
    assert ns["kind"] == "Namespace" and ns["metadata"]["name"] == NAMESPACE
    labels = ns["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "privileged"
