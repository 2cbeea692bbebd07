"""Every inject and webhook check over the pods KubeVirt renders (tests/data/kubevirt/pods/),
in every serialisation: strict schema validation, inject == webhook, idempotent, and nothing
but the PVC virtiofs containers (and the pod's two additions) changed."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from monitor.kubevirt import containers as kc
from monitor.kubevirt import inject, webhook
from monitor.kubevirt.containers import Settings
from monitor.kubevirt.patch import plan_pod
from tests.support.kubevirt import Server, apply_patch, review

PODS = Path(__file__).resolve().parents[1] / "data" / "kubevirt" / "pods"
FIXTURES = sorted(p.stem for p in PODS.glob("*.yaml"))
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())

# Which virtiofs containers each pod gets injected, and the Localhost profile they get.
EXPECTED: dict[str, tuple[set[str], str | None]] = {
    "default": ({"virtiofs-data", "virtiofs-rootdv"}, None),
    "no-init-containers": ({"virtiofs-data"}, None),
    "migration-target": ({"virtiofs-data", "virtiofs-rootdv"}, None),
    "hco": ({"virtiofs-data"}, "fhmon/kubevirt.json"),
    "runtime-default": ({"virtiofs-data"}, "fhmon/containerd-runtime-default.json"),
    "unknown-localhost": (set(), None),
    "non-pvc-filesystems": (set(), None),
    "mixed-filesystems": ({"virtiofs-data"}, None),
    "containerpath": ({"virtiofs-data"}, None),
    "ephemeral-provisioning": (set(), None),
}


def load(name: str) -> dict[str, Any]:
    value = yaml.safe_load((PODS / f"{name}.yaml").read_text())
    assert isinstance(value, dict)
    return value


def serialisations(value: Any) -> dict[str, str]:
    return {
        "JSON compact": json.dumps(value),
        "JSON pretty": json.dumps(value, indent=2) + "\n",
        "YAML block": yaml.safe_dump(value, sort_keys=False),
        "YAML flow": yaml.safe_dump(value, sort_keys=False, default_flow_style=True, width=90),
        "YAML as kubectl": yaml.safe_dump(value, sort_keys=True),
    }


def webhook_patch(pod: dict[str, Any], settings: Settings = kc.DEFAULT_SETTINGS) -> list[Any]:
    """The patch as the webhook answers it (the AdmissionReview round trip, base64 and all)."""
    parsed = webhook.parse_review(review(pod))
    response = webhook.review_response(parsed, settings)["response"]
    assert response["allowed"] is True
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert isinstance(patch, list)
    return patch


def validate(value: Any) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(copy.deepcopy(value), version, strict=True)


def test_every_listed_fixture_exists() -> None:
    assert set(FIXTURES) == set(EXPECTED)


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_validates_strictly(name: str) -> None:
    validate(load(name))


@pytest.mark.parametrize("style", list(serialisations({})))
@pytest.mark.parametrize("name", FIXTURES)
def test_inject_and_webhook_agree(name: str, style: str) -> None:
    pod = load(name)
    expected = apply_patch(pod, webhook_patch(pod))
    text = serialisations(pod)[style]
    out = inject.inject(text)
    got = yaml.safe_load(out)
    assert got == expected
    validate(got)
    assert inject.inject(out) == out  # idempotent, text and plan
    assert plan_pod(got) == [] and webhook_patch(got) == []
    if style.startswith("JSON"):
        assert json.loads(out) == expected
        # JSON written as json.dumps writes it: the edits cannot be told from a re-dump.
        assert out == serialisations(expected)[style]
    if not EXPECTED[name][0]:
        assert out == text  # nothing to do: byte for byte


@pytest.mark.parametrize("name", FIXTURES)
def test_only_the_pvc_virtiofs_containers_change(name: str) -> None:
    pod = load(name)
    out = apply_patch(pod, webhook_patch(pod))
    injected, profile = EXPECTED[name]
    before = {c["name"]: c for c in pod["spec"]["containers"]}
    after = {c["name"]: c for c in out["spec"]["containers"]}
    assert list(before) == list(after)
    assert {n for n in before if before[n] != after[n]} == injected
    assert out["metadata"] == pod["metadata"]
    assert {k: v for k, v in out["spec"].items() if k not in ("containers", "initContainers",
                                                              "volumes")} == {
        k: v for k, v in pod["spec"].items() if k not in ("containers", "initContainers",
                                                          "volumes")}
    old_init = pod["spec"].get("initContainers", [])
    old_volumes = pod["spec"]["volumes"]
    if not injected:
        assert out == pod
        return
    assert out["spec"]["initContainers"][:-1] == old_init
    assert out["spec"]["initContainers"][-1] == kc.launcher_init_container()
    assert out["spec"]["volumes"] == [*old_volumes, kc.launcher_volume()]
    for name_ in injected:
        old, new = before[name_], after[name_]
        assert new["command"][-1:] == old["command"] == ["/usr/libexec/virtiofsd"]
        assert new["args"][:len(old["args"])] == old["args"] or new["args"] == old["args"]
        assert "--migration-mode=find-paths" in new["args"]
        assert kc.LAUNCHER_MIGRATION_FLAG not in new["command"]
        assert new["resources"]["limits"][kc.DEFAULT_RESOURCE] == "1"
        context = dict(new["securityContext"])
        got_profile = context.pop("seccompProfile", None)
        assert context == old["securityContext"]
        if profile is None:
            assert got_profile is None
        else:
            assert got_profile == {"type": "Localhost", "localhostProfile": profile}
        assert {k: v for k, v in new.items() if k not in (
            "command", "args", "volumeMounts", "resources", "securityContext")} == {
            k: v for k, v in old.items() if k not in (
                "command", "args", "volumeMounts", "resources", "securityContext")}


def test_migration_by_handle_is_an_opt_in_label() -> None:
    for name in ("migration-target", "default"):
        pod = load(name)
        pod["metadata"]["labels"][kc.MIGRATION_LABEL] = kc.MIGRATION_BY_HANDLE
        out = apply_patch(pod, webhook_patch(pod))
        validate(out)
        for c in out["spec"]["containers"]:
            if c["name"] in EXPECTED[name][0]:
                launch = c["command"][:c["command"].index("/usr/libexec/virtiofsd")]
                assert kc.LAUNCHER_MIGRATION_FLAG in launch
                assert launch.index(kc.LAUNCHER_MIGRATION_FLAG) < launch.index("--")
                # virtiofsd's own arguments stay KubeVirt's: the launcher switches the
                # mode only once it knows fhmon serves the container.
                assert "--migration-mode=find-paths" in c["args"]
        assert yaml.safe_load(inject.inject(yaml.safe_dump(pod))) == out
        pod["metadata"]["labels"][kc.MIGRATION_LABEL] = "find-paths"  # any other value: no
        assert all(kc.LAUNCHER_MIGRATION_FLAG not in c["command"]
                   for c in apply_patch(pod, webhook_patch(pod))["spec"]["containers"])


def test_ephemeral_provisioning_pod_gets_nothing() -> None:
    pod = load("ephemeral-provisioning")
    assert webhook_patch(pod) == []
    del pod["metadata"]["annotations"]["kubevirt.io/ephemeral-provisioning"]
    assert webhook_patch(pod) != []  # the annotation alone made the difference


def test_seccomp_default_nodes_and_cri_o() -> None:
    pod = load("default")
    settings = Settings(seccomp_default=True, runtime="cri-o")
    out = apply_patch(pod, webhook_patch(pod, settings))
    validate(out)
    profiles = {c["name"]: c["securityContext"].get("seccompProfile")
                for c in out["spec"]["containers"]}
    assert profiles["virtiofs-data"] == {"type": "Localhost",
                                         "localhostProfile": "fhmon/cri-o-runtime-default.json"}
    assert profiles["compute"] is None
    assert yaml.safe_load(inject.inject(json.dumps(pod), settings)) == out


async def test_the_served_webhook_agrees_on_every_fixture(server: Server) -> None:
    for name in FIXTURES:
        pod = load(name)
        reply = await server.call("POST", "/mutate", review(pod, uid=name))
        assert reply.status == 200
        response = reply.json()["response"]
        patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
        assert apply_patch(pod, patch) == yaml.safe_load(inject.inject(
            (PODS / f"{name}.yaml").read_text())), name
