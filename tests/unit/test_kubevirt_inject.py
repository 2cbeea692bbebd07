"""monitor.kubevirt.inject: `fhmon inject` edits only what it must; the webhook's patch agrees."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from monitor.kubevirt import containers as kc
from monitor.kubevirt import spans
from monitor.kubevirt.containers import Settings
from monitor.kubevirt.inject import InjectError, inject
from monitor.kubevirt.patch import plan_pod, pod_patch
from tests.support.kubevirt import LAUNCHER_POD, apply_patch

PVC_CONTAINERS = {"virtiofs-data", "virtiofs-rootdv"}

# Documents that must come out exactly as they went in (odd formatting on purpose).
CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap    # spacing and comments kept
metadata: {name: settings,   namespace: default}
data:
  key: "value"   # quoted
  other: 'single'
"""
PLAIN_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: plain
spec:
  containers:
  - name: app
    image: busybox
    command: ["/usr/libexec/virtiofsd"]
"""


def container_lines(text: str, names: set[str]) -> set[int]:
    """0-based line numbers that belong to the named containers of the (single) pod."""
    node = yaml.compose(text)
    spec = next(v for k, v in node.value if k.value == "spec")
    containers = next(v for k, v in spec.value if k.value == "containers")
    lines: set[int] = set()
    for item in containers.value:
        name = next(v.value for k, v in item.value if k.value == "name")
        if name in names:
            end = spans.content_end(item)
            lines.update(range(item.start_mark.line, text.count("\n", 0, end) + 1))
    return lines


# --------------------------------------------------------------------------------------------
# The virt-launcher pod


def test_only_the_pvc_virtiofs_containers_change() -> None:
    out = inject(LAUNCHER_POD)
    touched = container_lines(LAUNCHER_POD, PVC_CONTAINERS)
    before, after = LAUNCHER_POD.splitlines(), out.splitlines()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, before, after,
                                                     autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            assert set(range(i1, i2)) <= touched, (tag, before[i1:i2])
    # And the inserted lines sit inside those containers or at the ends of the pod's lists.
    assert out.count("\n") > LAUNCHER_POD.count("\n")


def test_the_injected_container() -> None:
    pod = yaml.safe_load(inject(LAUNCHER_POD))
    by_name = {c["name"]: c for c in pod["spec"]["containers"]}
    data = by_name["virtiofs-data"]
    assert data["command"][-1] == "/usr/libexec/virtiofsd"
    # the native launcher, alone in the emptyDir: nothing of KubeVirt's image runs it
    assert data["command"][0] == f"{kc.LAUNCHER_DIR}/{kc.LAUNCHER_BINARY}"
    assert data["command"][1] == "launch"
    launch = data["command"][data["command"].index("launch"):]
    assert launch[:5] == ["launch", "--socket", "/var/run/kubevirt/fhmon/fhmon.sock",
                          "--share", "/data"]
    # KubeVirt's args run unchanged without fhmon; the launcher adds the handle flags, and
    # keeps find-paths migration (a target without fhmon could not open the handles):
    # migrating by handle is an opt-in (fhmon.io/migration).
    original = {c["name"]: c for c in yaml.safe_load(LAUNCHER_POD)["spec"]["containers"]}
    assert data["args"] == original["virtiofs-data"]["args"]
    assert launch[5:] == ["--fail-open", "--virtiofsd-handles=prefer", "--",
                          "/usr/libexec/virtiofsd"]
    assert kc.LAUNCHER_MIGRATION_FLAG not in data["command"]
    assert data["resources"]["limits"]["fhmon.io/virtiofs"] == "1"
    assert data["resources"]["limits"]["memory"] == "89M"  # 80M + 8 MiB, whole megabytes
    assert data["resources"]["requests"]["memory"] == "1M"  # a Burstable request kept
    assert data["securityContext"] == yaml.safe_load(LAUNCHER_POD)["spec"]["containers"][1][
        "securityContext"]
    # KubeVirt never asked this one's virtiofsd for a migration mode: none is added.
    rootdv = by_name["virtiofs-rootdv"]
    assert not any(a.startswith("--migration-mode") for a in rootdv["args"])
    assert by_name["virtiofs-settings"]["command"] == ["/usr/libexec/virtiofsd"]
    (init,) = [c for c in pod["spec"]["initContainers"] if c["name"] == kc.LAUNCHER_INIT]
    assert init["args"] == ["install-launcher", kc.LAUNCHER_DIR]
    assert {"name": kc.LAUNCHER_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}} in pod["spec"][
        "volumes"]


def test_guaranteed_pod_stays_guaranteed() -> None:
    pod = yaml.safe_load(LAUNCHER_POD)
    pod["spec"]["containers"][1]["resources"] = {"limits": {"cpu": "1", "memory": "80Mi"},
                                                 "requests": {"cpu": "1", "memory": "80Mi"}}
    (op, *_) = plan_pod(pod)
    resources = op.value["resources"]
    assert resources["limits"]["memory"] == resources["requests"]["memory"] == "88Mi"


def test_idempotent() -> None:
    once = inject(LAUNCHER_POD)
    assert once != LAUNCHER_POD
    assert inject(once) == once
    assert plan_pod(yaml.safe_load(once)) == []


def test_patch_gives_exactly_what_inject_gives() -> None:
    pod = yaml.safe_load(LAUNCHER_POD)
    patch = pod_patch(pod)
    assert [p["op"] for p in patch] == ["replace", "replace", "add", "add"]
    assert apply_patch(pod, patch) == yaml.safe_load(inject(LAUNCHER_POD))
    json.dumps(patch)  # serialisable as is


def test_patch_creates_missing_lists() -> None:
    pod = yaml.safe_load(LAUNCHER_POD)
    del pod["spec"]["initContainers"]
    pod["spec"]["volumes"] = pod["spec"]["volumes"]
    patch = pod_patch(pod)
    assert {"op": "add", "path": "/spec/initContainers",
            "value": [kc.launcher_init_container()]} in patch
    assert apply_patch(pod, patch)["spec"]["initContainers"] == [kc.launcher_init_container()]


# --------------------------------------------------------------------------------------------
# Streams, lists, JSON


def test_multi_document_stream_other_documents_byte_identical() -> None:
    stream = CONFIGMAP + "---\n" + LAUNCHER_POD + "---\n" + PLAIN_POD + "...\n"
    out = inject(stream)
    assert out.startswith(CONFIGMAP + "---\n")
    assert out.endswith("---\n" + PLAIN_POD + "...\n")
    assert out[len(CONFIGMAP) + 4:-len(PLAIN_POD) - 8] == inject(LAUNCHER_POD)


def test_nothing_to_do_is_byte_identical() -> None:
    for text in (CONFIGMAP, PLAIN_POD, CONFIGMAP + "---\n" + PLAIN_POD, "", "# only\n"):
        assert inject(text) == text


def test_configmap_and_secret_volumes_untouched() -> None:
    pod = yaml.safe_load(LAUNCHER_POD)
    for c in pod["spec"]["containers"]:
        if c["name"] in PVC_CONTAINERS:
            vol = c["name"].removeprefix("virtiofs-")
            for v in pod["spec"]["volumes"]:
                if v["name"] == vol:
                    v.pop("persistentVolumeClaim")
                    v["secret" if vol == "data" else "configMap"] = {"name": vol}
    text = yaml.safe_dump(pod, sort_keys=False)
    assert inject(text) == text
    assert pod_patch(pod) == []


def test_seccomp_profiles_are_replaced_or_the_pod_left_alone() -> None:
    pod = yaml.safe_load(LAUNCHER_POD)
    context = pod["spec"]["securityContext"]

    def profile_of(settings: Settings = kc.DEFAULT_SETTINGS) -> object:
        ops = plan_pod(pod, settings)
        if not ops:
            return "left alone"
        return ops[0].value["securityContext"].get("seccompProfile")

    assert profile_of() is None  # unconfined: nothing added
    assert profile_of(Settings(seccomp_default=True)) == {
        "type": "Localhost", "localhostProfile": "fhmon/containerd-runtime-default.json"}
    context["seccompProfile"] = {"type": "RuntimeDefault"}
    assert profile_of() == {"type": "Localhost",
                            "localhostProfile": "fhmon/containerd-runtime-default.json"}
    assert profile_of(Settings(runtime="cri-o")) == {
        "type": "Localhost", "localhostProfile": "fhmon/cri-o-runtime-default.json"}
    context["seccompProfile"] = {"type": "Localhost", "localhostProfile": "kubevirt/kubevirt.json"}
    assert profile_of() == {"type": "Localhost", "localhostProfile": "fhmon/kubevirt.json"}
    context["seccompProfile"] = {"type": "Localhost", "localhostProfile": "site/other.json"}
    assert profile_of() == "left alone"
    # A container-level profile decides over the pod's.
    pod["spec"]["containers"][1]["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    assert next(op.path for op in plan_pod(pod)) == ("spec", "containers", 1)
    assert plan_pod(pod)[0].value["securityContext"]["seccompProfile"] == {"type": "Unconfined"}


def test_list_json_pretty_keeps_other_items_and_indent() -> None:
    pod = yaml.safe_load(LAUNCHER_POD)
    other = yaml.safe_load(PLAIN_POD)
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": [other, pod, other]},
                      indent=4) + "\n"
    out = inject(text)
    value = json.loads(out)
    assert value["items"][0] == value["items"][2] == other
    assert value["items"][1] == apply_patch(pod, pod_patch(pod))
    # Pretty JSON written as `json.dumps(indent=4)` would: the edits are invisible.
    assert out == json.dumps({**value}, indent=4) + "\n"
    assert inject(out) == out


def test_compact_json_and_a_json_stream() -> None:
    pod = yaml.safe_load(LAUNCHER_POD)
    compact = json.dumps(pod)
    out = inject(compact)
    assert json.loads(out) == apply_patch(pod, pod_patch(pod))
    assert "\n" not in out
    stream = json.dumps(yaml.safe_load(PLAIN_POD)) + "\n" + compact + "\n"
    out = inject(stream)
    first, second = out.split("\n")[:2]
    assert first == json.dumps(yaml.safe_load(PLAIN_POD))
    assert json.loads(second) == json.loads(inject(compact))
    assert inject(out) == out


def test_yaml_list_and_flow_style_pod() -> None:
    pod = yaml.safe_load(LAUNCHER_POD)
    flow = yaml.safe_dump({"kind": "PodList", "apiVersion": "v1", "items": [pod]},
                          default_flow_style=True, width=100)
    out = inject(flow)
    assert yaml.safe_load(out)["items"][0] == apply_patch(pod, pod_patch(pod))
    assert inject(out) == out


def test_block_spec_without_init_containers_gets_the_key() -> None:
    text = LAUNCHER_POD.replace("  initContainers:\n", "  otherInitContainers:\n")
    out = inject(text)
    pod = yaml.safe_load(out)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [kc.LAUNCHER_INIT]
    assert pod["spec"]["otherInitContainers"][0]["name"] == "container-disk-binary"
    assert inject(out) == out


INIT_CONTAINER_SHAPES = ("absent", "null", "empty", "present")
SPEC_ORDERS = ("as rendered", "containers last", "volumes last", "initContainers last")


def _serialisations(value: object) -> dict[str, str]:
    return {
        "compact JSON": json.dumps(value),
        "JSON indent 2": json.dumps(value, indent=2),
        "JSON indent 4": json.dumps(value, indent=4) + "\n",
        "YAML block": yaml.safe_dump(value, sort_keys=False),
        "YAML flow": yaml.safe_dump(value, sort_keys=False, default_flow_style=True, width=80),
    }


@pytest.mark.parametrize("order", SPEC_ORDERS)
@pytest.mark.parametrize("init", INIT_CONTAINER_SHAPES)
def test_inject_equals_the_patch_for_every_shape_of_spec(init: str, order: str) -> None:
    """The class of the JSON bug (a key added after a flow mapping's closing brace): for
    every place a list can be created or appended to, in every style, the text `inject`
    writes parses to the pod the webhook's patch gives, and injects to itself."""
    pod = yaml.safe_load(LAUNCHER_POD)
    spec = pod["spec"]
    if init == "absent":
        del spec["initContainers"]
    elif init == "null":
        spec["initContainers"] = None
    elif init == "empty":
        spec["initContainers"] = []
    key = order.removesuffix(" last")
    if key in spec:
        spec[key] = spec.pop(key)  # moved to the end of spec
    pod["spec"] = spec
    expected = apply_patch(pod, pod_patch(pod))
    assert [c["name"] for c in expected["spec"]["initContainers"]][-1] == kc.LAUNCHER_INIT
    for style, text in _serialisations(pod).items():
        out = inject(text)
        assert yaml.safe_load(out) == expected, style
        assert set(yaml.safe_load(out)) == set(pod), style  # nothing at the top level
        assert inject(out) == out, style
        if "JSON" in style:
            assert json.loads(out) == expected, style


def test_null_init_containers() -> None:
    start = LAUNCHER_POD.index("  initContainers:\n")
    end = LAUNCHER_POD.index("  containers:\n")
    for null in ("  initContainers:\n", "  initContainers: null\n", "  initContainers: ~ # no\n"):
        text = LAUNCHER_POD[:start] + null + LAUNCHER_POD[end:]
        out = inject(text)
        value = yaml.safe_load(out)
        assert value["spec"]["initContainers"] == [kc.launcher_init_container()], null
        before = yaml.safe_load(text)
        assert before["spec"]["initContainers"] is None
        assert value == apply_patch(before, pod_patch(before))
        assert inject(out) == out


def test_crlf_kept() -> None:
    text = LAUNCHER_POD.replace("\n", "\r\n")
    out = inject(text)
    assert "\n" not in out.replace("\r\n", "")
    assert yaml.safe_load(out) == yaml.safe_load(inject(LAUNCHER_POD))


def test_other_settings() -> None:
    settings = Settings(image="registry.example/fhmon@sha256:" + "0" * 64,
                        socket="/run/x/fhmon.sock", inode_file_handles="mandatory")
    pod = yaml.safe_load(inject(LAUNCHER_POD, settings))
    data = next(c for c in pod["spec"]["containers"] if c["name"] == "virtiofs-data")
    assert "/run/x/fhmon.sock" in data["command"]
    assert "--virtiofsd-handles=mandatory" in data["command"]
    assert pod["spec"]["initContainers"][-1]["image"] == settings.image


@pytest.mark.parametrize("bad", ["a: [1, 2\n", "{\"a\": ", "a: b: c\n",
                                 '{"a":' * 5000 + "1" + "}" * 5000, "[" * 5000 + "]" * 5000])
def test_bad_input_is_a_clear_error(bad: str) -> None:
    with pytest.raises(InjectError):
        inject(bad)


def test_virtiofsd_args_are_kubevirts_unchanged() -> None:
    """The launcher adds the handle flags only once fhmon serves (tests/kernel/test_intake.py
    TestFailOpen); the pod keeps KubeVirt's command line for when it does not."""
    args = ["--inode-file-handles", "never", "--migration-mode", "find-paths", "-x"]
    container = {"name": "virtiofs-disk", "command": ["/usr/libexec/virtiofsd"], "args": args}
    for by_handle in (False, True):
        assert kc.inject_container(container, "disk", migrate_by_handle=by_handle)[
            "args"] == args
    prefix = kc.launcher_command(kc.Settings(), "/disk")
    assert prefix[-3:] == ["--fail-open", "--virtiofsd-handles=prefer", "--"]
    # An opted-in pod's launcher fails closed: a migration target without fhmon must not
    # start (it could not open the source's handles), so the VM stays on its source.
    by_handle = kc.launcher_command(kc.Settings(), "/disk", migration_by_handle=True)
    assert "--virtiofsd-migration=file-handles" in by_handle
    assert "--fail-open" not in by_handle


# --------------------------------------------------------------------------------------------
# The command line


def run_inject(data: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "monitor.cli", "inject", *args],
                          input=data, capture_output=True, timeout=60, check=False)


def test_cli_stdin_and_file(tmp_path: Path) -> None:
    result = run_inject(LAUNCHER_POD.encode(), "-f", "-")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == inject(LAUNCHER_POD)
    path = tmp_path / "pod.yaml"
    path.write_bytes(result.stdout)
    again = run_inject(b"", "-f", str(path))
    assert again.stdout == result.stdout


def test_cli_errors_name_the_file(tmp_path: Path) -> None:
    result = run_inject(b"", "-f", str(tmp_path / "missing.yaml"))
    assert result.returncode == 1
    assert b"missing.yaml" in result.stderr and b"Traceback" not in result.stderr
    result = run_inject(b"a: [1\n", "-f", "-")
    assert result.returncode == 1 and b"not valid YAML" in result.stderr
