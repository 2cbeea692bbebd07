"""The deploy/ kustomizations rendered offline: a small kustomize subset renderer (no PyPI
package renders kustomize offline), the paths of the artefacts, and lookups in the result.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, cast

import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BASE = DEPLOY / "base"
EXAMPLES = DEPLOY / "examples"
COMPONENTS = DEPLOY / "components"
OVERLAYS = DEPLOY / "overlays"
SECCOMP_PROFILE = EXAMPLES / "seccomp" / "virtiofs-notify.json"
LAUNCH_POD = EXAMPLES / "virtiofs-launch-pod.yaml"
LISTENER_POD = EXAMPLES / "virtiofs-listener-pod.yaml"
CONTAINERFILE = DEPLOY / "Containerfile"
SERVICE_UNIT = DEPLOY / "systemd" / "fhmon.service"
DOCS = REPO / "docs" / "deploy.md"

NAMESPACE = "kubevirt"


# The oldest Kubernetes minor the manifests target (appArmorProfile is a field since 1.30)
# and the newest one kubernetes-validate ships.
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]


CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "SecurityContextConstraints",
    "ClusterRoleBinding",
    "PriorityClass",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
}
WORKLOADS = {"DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job"}
KUSTOMIZATION_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "labels",
    "commonLabels",
    "resources",
    "components",
    "images",
    "replacements",
    "patches",
}


def load_docs(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def load_kustomization(directory: Path, kind: str) -> dict[str, Any]:
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert k["kind"] == kind, f"{directory}: expected kind {kind}, got {k['kind']}"
    unsupported = set(k) - KUSTOMIZATION_KEYS
    # A new kustomize feature must be taught to this renderer before it is used.
    assert not unsupported, f"{directory}: renderer does not support {sorted(unsupported)}"
    return cast(dict[str, Any], k)


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    spec: dict[str, Any] | None = None
    if obj["kind"] == "Pod":
        spec = obj["spec"]
    elif obj["kind"] in WORKLOADS:
        spec = obj["spec"]["template"]["spec"]
    return spec


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("initContainers", [])) + list(spec.get("containers", []))


def apply_transformers(objs: list[dict[str, Any]], k: dict[str, Any]) -> None:
    namespace = k.get("namespace")
    if namespace:
        for obj in objs:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = namespace

    label_sets = list(k.get("labels", []))
    if k.get("commonLabels"):
        label_sets.append({"pairs": k["commonLabels"], "includeSelectors": True})
    for entry in label_sets:
        pairs = entry["pairs"]
        selectors = entry.get("includeSelectors", False)
        templates = selectors or entry.get("includeTemplates", False)
        for obj in objs:
            obj["metadata"].setdefault("labels", {}).update(pairs)
            if obj["kind"] in WORKLOADS:
                if templates:
                    meta = obj["spec"]["template"].setdefault("metadata", {})
                    meta.setdefault("labels", {}).update(pairs)
                if selectors:
                    obj["spec"]["selector"].setdefault("matchLabels", {}).update(pairs)
            if obj["kind"] == "Service" and selectors:
                obj["spec"].setdefault("selector", {}).update(pairs)

    for image in k.get("images", []):
        for obj in objs:
            spec = pod_spec(obj)
            if spec is None:
                continue
            for c in all_containers(spec):
                name = re.split(r"[:@]", c["image"], maxsplit=1)[0]
                if name != image["name"]:
                    continue
                new = image.get("newName", name)
                if "digest" in image:
                    new += "@" + image["digest"]
                elif "newTag" in image:
                    new += ":" + str(image["newTag"])
                else:
                    new = new + c["image"][len(name) :]
                c["image"] = new


def _path_parts(field_path: str) -> list[str]:
    """kustomize's fieldPath: dot-separated, `[key]` for a key holding dots, `*` for every
    item of a list."""
    return [m.group(1) or m.group(2) for m in re.finditer(r"\[([^\]]+)\]|([^.\[]+)",
                                                           field_path)]


def _get(obj: Any, parts: list[str]) -> Any:
    for part in parts:
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


def _set(obj: Any, parts: list[str], value: str, options: dict[str, Any]) -> None:
    head, rest = parts[0], parts[1:]
    if head == "*" and isinstance(obj, list):
        for index in range(len(obj)):
            _set(obj, [str(index), *rest], value, options)
        return
    key: Any = int(head) if isinstance(obj, list) else head
    if rest:
        _set(obj[key], rest, value, options)
        return
    if "delimiter" in options:
        pieces = str(obj[key]).split(options["delimiter"])
        pieces[options.get("index", 0)] = value
        value = options["delimiter"].join(pieces)
    obj[key] = value


def apply_replacements(objs: list[dict[str, Any]], k: dict[str, Any]) -> None:
    """The subset of kustomize's replacements the overlays use: a source object's field
    copied into target fields (all objects of a kind, or one by name), whole or as one
    delimited piece."""
    for replacement in k.get("replacements", []):
        source = replacement["source"]
        (origin,) = [o for o in objs if o["kind"] == source["kind"]
                     and o["metadata"]["name"] == source["name"]]
        value = _get(origin, _path_parts(source["fieldPath"]))
        for target in replacement["targets"]:
            select = target["select"]
            for obj in objs:
                if obj["kind"] != select["kind"] or select.get("name", obj["metadata"][
                        "name"]) != obj["metadata"]["name"]:
                    continue
                for field_path in target["fieldPaths"]:
                    _set(obj, _path_parts(field_path), value, target.get("options", {}))


def apply_patches(objs: list[dict[str, Any]], k: dict[str, Any]) -> None:
    """Inline JSON 6902 patches (add/replace) on the objects a target names."""
    from tests.support.kubevirt import apply_patch

    for entry in k.get("patches", []):
        target = entry["target"]
        operations = yaml.safe_load(entry["patch"])
        for index, obj in enumerate(objs):
            if obj["kind"] == target["kind"] and obj["metadata"]["name"] == target["name"]:
                objs[index] = apply_patch(obj, operations)


def render(directory: Path) -> list[dict[str, Any]]:
    """Render a kustomization: resources (files or directories), components, transformers."""
    k = load_kustomization(directory, "Kustomization")
    objs: list[dict[str, Any]] = []
    for res in k.get("resources", []):
        path = directory / res
        objs += render(path) if path.is_dir() else load_docs(path)
    for comp in k.get("components", []):
        ck = load_kustomization(directory / comp, "Component")
        for res in ck.get("resources", []):
            objs += load_docs(directory / comp / res)
        apply_transformers(objs, ck)
    apply_patches(objs, k)
    apply_transformers(objs, k)
    apply_replacements(objs, k)
    return objs


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected exactly one {kind}, found {len(found)}"
    return found[0]


def kustomization_roots() -> list[Path]:
    return [BASE, *sorted(p for p in OVERLAYS.iterdir() if (p / "kustomization.yaml").exists())]


def write_composite(tmp_path: Path) -> Path:
    """A kustomization of base + every component, to render the components too."""

    def rel(path: Path) -> str:
        return os.path.relpath(path, tmp_path)

    components = sorted(p for p in COMPONENTS.iterdir() if (p / "kustomization.yaml").exists())
    k = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": NAMESPACE,
        "resources": [rel(BASE)],
        "components": [rel(c) for c in components],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(k))
    return tmp_path
