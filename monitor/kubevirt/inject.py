"""Put KubeVirt's virtiofs containers under fhmon: text in, text out, nothing else touched.

virt-controller renders one container `virtiofs-<volume>` per filesystem volume of a VMI
(`/usr/libexec/virtiofsd --socket-path=... --shared-dir=/<volume> ...`, uid 107, no
capabilities). For those whose pod volume is a PersistentVolumeClaim (PVC and DataVolume
volumes both become one; monitor/kubevirt/volumes.py), the injection

- wraps virtiofsd in `fhmon launch` run by a self-contained launcher that an init container
  (from the fhmon image) copies into an emptyDir (the virt-launcher image has no Python),
  leaving KubeVirt's virtiofsd args as they are: the launcher adds the handle flags once
  fhmon serves it, and otherwise runs KubeVirt's command line unchanged (fails open);
- requests the device-plugin resource whose Allocate mounts fhmon's socket directory into
  the container (no hostPath in the pod);
- gives a container that would run under a seccomp profile fhmon's replacement for it
  (replacement_profile), and leaves alone one under a profile fhmon has none for;
- keeps KubeVirt's migration mode, unless the pod's VM opted in (fhmon.io/migration:
  file-handles), when the launcher is told to migrate by handle.

virt-controller's temporary ephemeral-provisioning pods are left alone.

Why the text is edited rather than re-serialised: `fhmon inject` promises that every other
document, pod, container and field stays byte-for-byte as it was (comments included), so the
edits are applied to spans of the original text found through PyYAML's node marks. The
webhook uses the same plan as a JSON Patch (`pod_patch`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from monitor.kubevirt import volumes
from monitor.kubevirt.containers import (
    DEFAULT_SETTINGS,
    LAUNCHER_INIT,
    LAUNCHER_VOLUME,
    MIGRATION_BY_HANDLE,
    MIGRATION_LABEL,
    Settings,
    as_list,
    inject_container,
    launcher_init_container,
    launcher_volume,
)

VIRTIOFSD = "/usr/libexec/virtiofsd"
CONTAINER_PREFIX = "virtiofs-"
# virt-controller's temporary pod that only binds WaitForFirstConsumer volumes
# (RenderLaunchManifestNoVm): it never runs a VM, so it gets nothing.
EPHEMERAL_PROVISIONING = "kubevirt.io/ephemeral-provisioning"
# KubeVirt's own Localhost profile (virt-handler installs it; HCO selects it).
KUBEVIRT_PROFILE = "kubevirt/kubevirt.json"


class InjectError(ValueError):
    """The input is not YAML/JSON we can edit; the message says where."""


Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Op:
    """One JSON Patch operation; `path` ends in "-" to append to a list."""

    op: Literal["add", "replace"]
    path: Path
    value: Any

    def as_json_patch(self) -> dict[str, Any]:
        pointer = "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in self.path)
        return {"op": self.op, "path": pointer, "value": self.value}


# --------------------------------------------------------------------------------------------
# The plan for one Pod (pure data)


def plan_pod(pod: Any, settings: Settings = DEFAULT_SETTINGS) -> list[Op]:
    """The operations that put the pod's PVC virtiofs containers under fhmon ([] if none)."""
    if not isinstance(pod, dict) or not isinstance(pod.get("spec"), dict):
        return []
    found_metadata = pod.get("metadata")
    metadata: dict[str, Any] = found_metadata if isinstance(found_metadata, dict) else {}
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict) and annotations.get(EPHEMERAL_PROVISIONING) == "true":
        return []
    labels = metadata.get("labels")
    by_handle = isinstance(labels, dict) and labels.get(MIGRATION_LABEL) == MIGRATION_BY_HANDLE
    spec = pod["spec"]
    pod_volumes = {v["name"]: v for v in as_list(spec.get("volumes"))
                   if isinstance(v, dict) and isinstance(v.get("name"), str)}
    pod_seccomp = _seccomp_profile(spec.get("securityContext"))
    ops: list[Op] = []
    for index, container in enumerate(as_list(spec.get("containers"))):
        volume = _pvc_virtiofs_volume(container, pod_volumes)
        if volume is None:
            continue
        seccomp = _seccomp_profile(container.get("securityContext")) or pod_seccomp
        replacement = replacement_profile(seccomp, settings)
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


def _append(spec: dict[str, Any], key: str, value: Any) -> Op:
    if isinstance(spec.get(key), list):
        return Op("add", ("spec", key, "-"), value)
    # Absent (or null): create the list. "replace" for null so that a JSON Patch applies.
    return Op("replace" if key in spec else "add", ("spec", key), [value])


def _seccomp_profile(security_context: Any) -> dict[str, Any] | None:
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


def _pvc_virtiofs_volume(container: Any, pod_volumes: dict[Any, Any]) -> str | None:
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


# --------------------------------------------------------------------------------------------
# Documents: which Pods a document holds


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


def plan_document(document: Any, settings: Settings = DEFAULT_SETTINGS) -> list[Op]:
    return [Op(op.op, prefix + op.path, op.value)
            for prefix, pod in pods_in(document) for op in plan_pod(pod, settings)]


# --------------------------------------------------------------------------------------------
# Text: apply a plan to spans of the original


@dataclass(frozen=True, slots=True)
class _Edit:
    start: int
    end: int
    text: str


class _Document:
    """One document's node tree (for spans) and how new text is written into it."""

    def __init__(self, text: str, root: yaml.Node, is_json: bool, newline: str) -> None:
        self.text = text
        self.root = root
        self.is_json = is_json
        self.newline = newline
        self.json_indent = _json_indent(text, root) if is_json else 0

    def node_at(self, path: Path) -> yaml.Node:
        node = self.root
        for part in path:
            if isinstance(node, yaml.MappingNode):
                node = next(v for k, v in node.value if k.value == part)
            elif isinstance(node, yaml.SequenceNode):
                assert isinstance(part, int)
                node = node.value[part]
            else:
                raise InjectError(f"no {part!r} in the document's structure")
        return node

    def edits(self, ops: Sequence[Op]) -> list[_Edit]:
        out: list[_Edit] = []
        for op in ops:
            if op.op == "replace" and op.path[-1] != "-":
                node = self.node_at(op.path)
                if isinstance(node, yaml.ScalarNode):  # `volumes: null` / `volumes:`
                    parent = self.node_at(op.path[:-1])
                    out.append(self._set_key(parent, node, op.value))
                else:
                    out.append(_Edit(node.start_mark.index, _content_end(node),
                                     self.render(op.value, node)))
            elif op.path[-1] == "-":
                out.append(self._append(self.node_at(op.path[:-1]), op.value))
            else:
                parent = self.node_at(op.path[:-1])
                out.append(self._add_key(parent, str(op.path[-1]), op.value))
        return out

    def _flow(self, node: yaml.Node) -> bool:
        return self.is_json or bool(getattr(node, "flow_style", False))

    def render(self, value: Any, node: yaml.Node) -> str:
        """`value` written to sit where `node` starts."""
        if self._flow(node):
            return self._json(value, _line_indent(self.text, node.start_mark.index))
        return self._block(value, node.start_mark.column)

    def _json(self, value: Any, base: int) -> str:
        if self.json_indent:
            text = json.dumps(value, indent=self.json_indent, default=str)
        else:
            text = json.dumps(value, default=str)
        return (self.newline + " " * base).join(text.split("\n"))

    def _block(self, value: Any, column: int) -> str:
        text = yaml.dump(value, Dumper=_IndentedDumper, default_flow_style=False,
                         sort_keys=False, allow_unicode=True, width=10**6).rstrip("\n")
        return (self.newline + " " * column).join(text.split("\n"))

    def _append(self, seq: yaml.Node, value: Any) -> _Edit:
        assert isinstance(seq, yaml.SequenceNode)
        if self._flow(seq):
            if not seq.value:
                closing = seq.end_mark.index - 1
                return _Edit(closing, closing,
                             self._json(value, _line_indent(self.text, seq.start_mark.index)))
            last = seq.value[-1]
            at = _content_end(last)
            base = _line_indent(self.text, last.start_mark.index)
            if "\n" in self.text[seq.start_mark.index:seq.end_mark.index]:
                separator = "," + self.newline + " " * base
            else:
                separator = ", "
            return _Edit(at, at, separator + self._json(value, base))
        column = seq.start_mark.column
        at = _content_end(seq)
        return _Edit(at, at, self.newline + " " * column + "- " + self._block(value, column + 2))

    def _add_key(self, mapping: yaml.Node, key: str, value: Any) -> _Edit:
        assert isinstance(mapping, yaml.MappingNode)
        if self._flow(mapping):
            entry = json.dumps(key) + ": "
            if not mapping.value:
                closing = mapping.end_mark.index - 1
                base = _line_indent(self.text, mapping.start_mark.index)
                return _Edit(closing, closing, entry + self._json(value, base))
            last_key, last_value = mapping.value[-1]
            # After the last value, inside the braces: a flow mapping's own end is past "}".
            at = _content_end(last_value)
            base = _line_indent(self.text, last_key.start_mark.index)
            multi_line = "\n" in self.text[mapping.start_mark.index:mapping.end_mark.index]
            separator = ("," + self.newline + " " * base) if multi_line else ", "
            return _Edit(at, at, separator + entry + self._json(value, base))
        column = mapping.start_mark.column
        at = _content_end(mapping)
        return _Edit(at, at, self.newline + " " * column + self._keyed_block(key, value, column))

    def _set_key(self, mapping: yaml.Node, scalar: yaml.Node, value: Any) -> _Edit:
        """Replace a null value (`key:` or `key: null`) by a collection."""
        if self._flow(mapping) or self._flow(scalar):
            base = _line_indent(self.text, scalar.start_mark.index)
            return _Edit(scalar.start_mark.index, scalar.end_mark.index, self._json(value, base))
        key_node = next(k for k, v in mapping.value if v is scalar)
        # `key:` alone gives an empty scalar whose marks sit at the colon.
        end = max(scalar.end_mark.index, key_node.end_mark.index + 1)
        return _Edit(key_node.start_mark.index, end,
                     self._keyed_block(str(key_node.value), value, key_node.start_mark.column))

    def _keyed_block(self, key: str, value: Any, column: int) -> str:
        head = key + ":"
        if isinstance(value, list) and value:
            inner = column + 2
            return head + self.newline + " " * inner + self._block(value, inner)
        return head + " " + self._json(value, column)


class _IndentedDumper(yaml.SafeDumper):  # type: ignore[misc]
    """Lists indented under their key, the way Kubernetes manifests are usually written."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _content_end(node: yaml.Node) -> int:
    """Where a node's own text ends: block collections' marks run on over comments."""
    if isinstance(node, yaml.MappingNode) and not node.flow_style and node.value:
        return _content_end(node.value[-1][1])
    if isinstance(node, yaml.SequenceNode) and not node.flow_style and node.value:
        return _content_end(node.value[-1])
    return int(node.end_mark.index)


def _line_indent(text: str, index: int) -> int:
    line_start = text.rfind("\n", 0, index) + 1
    line = text[line_start:index]
    return len(line) - len(line.lstrip(" "))


def _json_indent(text: str, root: yaml.Node) -> int:
    """The indentation step of pretty-printed JSON (0 for compact JSON)."""
    if isinstance(root, yaml.MappingNode) and root.value:
        first_key = root.value[0][0]
        if first_key.start_mark.line != root.start_mark.line:
            return max(1, _line_indent(text, first_key.start_mark.index)
                       - _line_indent(text, root.start_mark.index))
    return 0


def inject(text: str, settings: Settings = DEFAULT_SETTINGS) -> str:
    """`fhmon inject`: the text with its Pods' PVC virtiofs containers under fhmon.

    Output is input except for the spans that change; injecting twice equals injecting once.
    """
    try:
        return _inject(text, settings)
    except RecursionError:
        raise InjectError("the input is nested too deeply") from None


def _inject(text: str, settings: Settings) -> str:
    newline = "\r\n" if "\r\n" in text else "\n"
    if _looks_json(text):
        documents = list(_json_documents(text, newline, settings))
    else:
        documents = list(_yaml_documents(text, newline))
    edits: list[_Edit] = []
    for document, value in documents:
        edits.extend(document.edits(plan_document(value, settings)))
    edits.sort(key=lambda e: e.start)
    for earlier, later in itertools.pairwise(edits):
        if earlier.end > later.start:
            raise InjectError("overlapping edits (please report this input)")
    out = text
    for edit in reversed(edits):
        out = out[:edit.start] + edit.text + out[edit.end:]
    return out


def _looks_json(text: str) -> bool:
    """JSON in, JSON out; YAML flow style (`{kind: Pod}`) also starts with a brace."""
    stripped = text.lstrip()
    if stripped[:1] not in ("{", "["):
        return False
    try:
        json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError:
        return False
    return True


def _yaml_documents(text: str, newline: str) -> Iterator[tuple[_Document, Any]]:
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            yield _Document(text, node, False, newline), loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise InjectError(f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _json_documents(text: str, newline: str,
                    settings: Settings) -> Iterator[tuple[_Document, Any]]:
    """One JSON value, or several one after another (a stream, like `kubectl get -o json`)."""
    decoder = json.JSONDecoder()
    at = 0
    while True:
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
        if at >= len(text):
            return
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise InjectError(f"not valid JSON: {exc}") from None
        if plan_document(value, settings):
            # Spans through PyYAML (JSON is YAML flow), its marks indexing the whole text.
            try:
                node = yaml.compose(_blank_before(text[:end], at), Loader=yaml.SafeLoader)
            except yaml.YAMLError as exc:
                raise InjectError(f"JSON that PyYAML cannot read: {exc}") from None
            if node is not None:
                yield _Document(text, node, True, newline), value
        at = end


def _blank_before(text: str, at: int) -> str:
    """`text` with everything before `at` blanked (newlines kept), so marks index `text`."""
    return "".join(c if c == "\n" else " " for c in text[:at]) + text[at:]
