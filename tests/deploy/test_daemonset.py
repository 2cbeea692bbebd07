"""The DaemonSet: volumes, references, socket and probes, security context, share globs,
metrics, scheduling, the rolling update, the key Secret, the keeper container, and the
checks against broken copies of it.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.kubevirt import volumes
from tests.deploy.checks import (
    KEY_SECRET,
    SECRET_DATA,
    broken,
    check_kubelet_mount,
    check_metrics,
    check_refs,
    check_security,
    check_socket,
    check_volumes,
)
from tests.deploy.flags import ds_flags, ds_socket, fhmon_container, parse_flags, serve_flags
from tests.deploy.render import CONTAINERFILE, all_containers, one
from tests.deploy.steps import secret_volume_layout


def test_daemonset_volumes(daemonset: dict[str, Any]) -> None:
    assert check_volumes(daemonset["spec"]["template"]["spec"]) == []


def test_daemonset_references(daemonset: dict[str, Any], base: list[dict[str, Any]]) -> None:
    assert check_refs(daemonset, base) == []


def test_daemonset_socket_and_probes(daemonset: dict[str, Any]) -> None:
    assert ds_socket(daemonset) == "/var/run/kubevirt/fhmon/fhmon.sock"
    assert check_socket(daemonset) == []


def test_daemonset_security(daemonset: dict[str, Any]) -> None:
    assert check_security(daemonset) == []


def test_daemonset_share_globs(daemonset: dict[str, Any]) -> None:
    # Exactly what the webhook's decision needs (monitor/kubevirt/volumes.py): whatever it
    # injects, the node accepts; tests/unit/test_kubevirt_volumes.py matches real paths.
    globs = ds_flags(daemonset)["--allow"]
    assert globs == volumes.node_allow_globs()
    assert check_kubelet_mount(daemonset) == []


def test_daemonset_metrics(
    daemonset: dict[str, Any], base: list[dict[str, Any]], servicemonitor: dict[str, Any]
) -> None:
    assert ds_flags(daemonset)["--metrics-address"] == ["0.0.0.0:9464"]
    assert check_metrics(daemonset, one(base, "Service"), servicemonitor) == []


def test_daemonset_scheduling_and_resources(daemonset: dict[str, Any]) -> None:
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "kubevirt-cluster-critical"
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in spec["tolerations"]
    assert {"operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    for c in all_containers(spec):
        assert c["resources"] == {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"memory": "256Mi"},
        }, c["name"]
    assert spec["automountServiceAccountToken"] is False


def check_like_virt_handler(ds: dict[str, Any]) -> list[str]:
    """What KubeVirt's own node agent does and fhmon's DaemonSet must do too."""
    problems: list[str] = []
    template = ds["spec"]["template"]
    spec = template["spec"]
    for c in all_containers(spec):
        limits = c.get("resources", {}).get("limits", {})
        if "cpu" in limits:
            problems.append(f"{c['name']}: a CPU limit throttles the guests' syscall path")
        if "cpu" not in c.get("resources", {}).get("requests", {}):
            problems.append(f"{c['name']}: no CPU request")
        if c.get("terminationMessagePolicy") != "FallbackToLogsOnError":
            problems.append(f"{c['name']}: terminationMessagePolicy is not "
                            f"FallbackToLogsOnError")
    if template["metadata"].get("labels", {}).get("prometheus.kubevirt.io") != "true":
        problems.append('pod label prometheus.kubevirt.io: "true" missing')
    if spec.get("nodeSelector", {}).get("kubernetes.io/os") != "linux":
        problems.append("nodeSelector kubernetes.io/os: linux missing")
    return problems


def check_init_matches_server(ds: dict[str, Any]) -> list[str]:
    """The init container checks the key directory, socket and globs the server uses."""
    spec = ds["spec"]["template"]["spec"]
    (init,) = [c for c in spec.get("initContainers", []) if c["name"] == "check"]
    args = init.get("args", [])
    if args[:1] != ["check"]:
        return ["the init container does not run `fhmon check`"]
    flags, rest = parse_flags(args[1:], {"--key-dir", "--socket", "--allow"})
    problems = [f"unexpected check arguments {rest}"] if rest else []
    served = ds_flags(ds)
    for flag in ("--key-dir", "--socket", "--allow"):
        if flags.get(flag) != served.get(flag):
            problems.append(f"check {flag} {flags.get(flag)} != serve {flag} "
                            f"{served.get(flag)}")
    mounts = {(m["name"], m["mountPath"]) for m in init.get("volumeMounts", [])}
    server_mounts = {(m["name"], m["mountPath"]) for m in fhmon_container(ds)["volumeMounts"]}
    for path in (flags.get("--key-dir", [""])[0], flags.get("--socket", [""])[0]):
        if not any(path.startswith(mp + "/") and (n, mp) in server_mounts for n, mp in mounts):
            problems.append(f"the init container does not mount {path} as the server does")
    return problems


def check_rolling_update(ds: dict[str, Any], containerfile: str) -> list[str]:
    """A rolling upgrade is SIGTERM to the old fhmon, then a new one (what
    tests/kernel/test_rolling_upgrade.py plays); one node at a time, never two at once."""
    problems: list[str] = []
    strategy = ds["spec"].get("updateStrategy", {})
    if strategy.get("type") != "RollingUpdate":
        problems.append(f"updateStrategy {strategy.get('type')}, not RollingUpdate")
    rolling = strategy.get("rollingUpdate", {})
    if rolling.get("maxUnavailable") != 1:
        problems.append("rollingUpdate.maxUnavailable is not 1")
    if rolling.get("maxSurge", 0) != 0:
        problems.append("rollingUpdate.maxSurge would run two fhmon on one node's socket")
    if "lifecycle" in fhmon_container(ds):
        problems.append("a lifecycle hook changes how fhmon is stopped")
    if re.search(r"(?im)^\s*STOPSIGNAL\b", containerfile):
        problems.append("the image's STOPSIGNAL is not SIGTERM")
    if ds["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30) < 10:
        problems.append("terminationGracePeriodSeconds leaves fhmon no time to close")
    return problems


def test_daemonset_like_virt_handler(daemonset: dict[str, Any]) -> None:
    assert check_like_virt_handler(daemonset) == []


def test_daemonset_init_checks_what_the_server_uses(daemonset: dict[str, Any]) -> None:
    assert check_init_matches_server(daemonset) == []


def test_daemonset_rolls_one_node_at_a_time_with_sigterm(daemonset: dict[str, Any]) -> None:
    assert check_rolling_update(daemonset, CONTAINERFILE.read_text()) == []


@pytest.mark.parametrize("breakage", ["cpu-limit", "policy", "label", "os", "init-key-dir",
                                      "init-socket", "on-delete", "surge", "prestop"])
def test_operating_checks_catch_a_broken_copy(daemonset: dict[str, Any], breakage: str) -> None:
    ds = copy.deepcopy(daemonset)
    spec = ds["spec"]["template"]["spec"]
    server = fhmon_container(ds)
    (init,) = [c for c in spec["initContainers"] if c["name"] == "check"]
    match breakage:
        case "cpu-limit":
            server["resources"]["limits"]["cpu"] = "500m"
        case "policy":
            del spec["containers"][-1]["terminationMessagePolicy"]
        case "label":
            del ds["spec"]["template"]["metadata"]["labels"]["prometheus.kubevirt.io"]
        case "os":
            del spec["nodeSelector"]
        case "init-key-dir":
            init["args"] = [a for a in init["args"] if not a.startswith("/etc/fhmon")]
            init["args"].remove("--key-dir")
        case "init-socket":
            init["args"][init["args"].index("--socket") + 1] = "/run/other.sock"
        case "on-delete":
            ds["spec"]["updateStrategy"] = {"type": "OnDelete"}
        case "surge":
            ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] = 1
        case "prestop":
            server["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    problems = (check_like_virt_handler(ds) + check_init_matches_server(ds)
                + check_rolling_update(ds, CONTAINERFILE.read_text()))
    assert problems, breakage


def test_key_secret_mode_is_private(daemonset: dict[str, Any]) -> None:
    (vol,) = [v for v in daemonset["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert vol["secret"]["defaultMode"] == 0o400


def test_key_dir_loads_from_a_secret_volume(daemonset: dict[str, Any], tmp_path: Path) -> None:
    signing = pytest.importorskip("monitor.signing")
    staging = tmp_path / "keygen"
    signing.keygen(staging)
    files = {p.name: p.read_bytes() for p in staging.iterdir()}
    (vol,) = [v for v in daemonset["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    mount = tmp_path / "etc-fhmon-keys"
    secret_volume_layout(mount, files, vol["secret"]["defaultMode"])
    key_dir = ds_flags(daemonset)["--key-dir"][0]
    assert key_dir.endswith(f"/{SECRET_DATA}")
    ring = signing.KeyRing.load(mount / SECRET_DATA)
    assert [k.signing for k in ring.describe()] == [True]


def test_negative_volume_name_mismatch(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    fhmon_container(ds)["volumeMounts"][0]["name"] = "sockets"
    assert any("unknown volume sockets" in p for p in check_volumes(ds["spec"]["template"]["spec"]))


def test_negative_secret_name(daemonset: dict[str, Any], base: list[dict[str, Any]]) -> None:
    ds = broken(daemonset)
    for v in ds["spec"]["template"]["spec"]["volumes"]:
        if "secret" in v:
            v["secret"]["secretName"] = "keys"
    assert any(KEY_SECRET in p for p in check_refs(ds, base))


def test_negative_configmap_missing(daemonset: dict[str, Any], base: list[dict[str, Any]]) -> None:
    objs = [o for o in base if o["kind"] != "ConfigMap"]
    assert any("ConfigMap" in p for p in check_refs(daemonset, objs))


def test_negative_probe_socket(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    fhmon_container(ds)["livenessProbe"]["exec"]["command"][-1] = "/run/fhmon/fhmon.sock"
    assert any("livenessProbe" in p for p in check_socket(ds))


def test_negative_socket_dir_not_shared(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    for v in ds["spec"]["template"]["spec"]["volumes"]:
        if v.get("hostPath", {}).get("path") == "/var/run/kubevirt/fhmon":
            v["hostPath"]["path"] = "/run/fhmon"
    assert check_socket(ds) != []


def test_negative_extra_capability(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    fhmon_container(ds)["securityContext"]["capabilities"]["add"].append("DAC_OVERRIDE")
    problems = check_security(ds)
    assert any("capabilities.add" in p for p in problems)
    assert any("init container" in p for p in problems)


def test_negative_privileged_and_no_hostpid(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    ds["spec"]["template"]["spec"]["hostPID"] = False
    fhmon_container(ds)["securityContext"]["privileged"] = True
    problems = check_security(ds)
    assert "hostPID must be true" in problems and "privileged must be false" in problems


def test_negative_readonly_kubelet(daemonset: dict[str, Any]) -> None:
    ds = broken(daemonset)
    for m in fhmon_container(ds)["volumeMounts"]:
        if m["mountPath"] == "/var/lib/kubelet":
            m["readOnly"] = True
            del m["mountPropagation"]
    problems = check_kubelet_mount(ds)
    assert any("EROFS" in p for p in problems) and any("HostToContainer" in p for p in problems)


def test_negative_metrics_port(
    daemonset: dict[str, Any], base: list[dict[str, Any]], servicemonitor: dict[str, Any]
) -> None:
    service = broken(one(base, "Service"))
    service["spec"]["ports"][0]["port"] = 9090
    assert any("Service port" in p for p in check_metrics(daemonset, service, servicemonitor))
    ds = broken(daemonset)
    ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] = "8080"
    assert any("prometheus.io/port" in p for p in check_metrics(ds, one(base, "Service"), None))
    monitor = broken(servicemonitor)
    monitor["spec"]["endpoints"][0]["port"] = "http"
    problems = check_metrics(daemonset, one(base, "Service"), monitor)
    assert any("ServiceMonitor" in p for p in problems)


def test_negative_unknown_serve_flag() -> None:
    argv = ["serve", "--socket", "/s", "--key-dir", "/k", "--allow", "/a", "--keys", "/k"]
    _, problems = serve_flags(argv)
    assert problems == [
        "unknown or misplaced argument '--keys'",
        "unknown or misplaced argument '/k'",
    ]
    _, problems = serve_flags(["serve", "--socket", "--key-dir", "/k"])
    assert "--socket has no value" in problems
    assert any("missing required" in p for p in problems)


def test_keeper_container_serves_the_socket_fhmon_deposits_to(
        daemonset: dict[str, Any]) -> None:
    spec = daemonset["spec"]["template"]["spec"]
    (keeper,) = [c for c in spec["containers"] if c["name"] == "keeper"]
    fhmon_args = fhmon_container(daemonset)["args"]
    keeper_socket = fhmon_args[fhmon_args.index("--keeper") + 1]
    assert keeper["args"] == ["keeper", "--socket", keeper_socket]
    assert keeper["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"] for m in keeper["volumeMounts"]}
    assert any(keeper_socket.startswith(path + "/") for path in mounts)


def check_seccomp_profiles(daemonset: dict[str, Any],
                           kubelet_root: str = volumes.KUBELET_ROOT) -> list[str]:
    """The init container installs the shipped profiles where the webhook's Localhost
    profiles name them (<kubelet seccomp root>/<Settings.profile_dir>/), before the device
    plugin advertises the resource, from where the image has them."""
    from monitor.kubevirt import containers, seccomp

    problems: list[str] = []
    spec = daemonset["spec"]["template"]["spec"]
    found = [c for c in spec.get("initContainers", []) if c["name"] == "seccomp-profiles"]
    if len(found) != 1:
        return ["no seccomp-profiles init container"]
    (init,) = found
    args = init["args"]
    if args[0] != "install-seccomp-profiles" or len(args) != 2:
        problems.append(f"not `fhmon install-seccomp-profiles DIR`: {args}")
        return problems
    mount = next((m for m in init.get("volumeMounts", [])
                  if args[1].startswith(m["mountPath"] + "/")), None)
    if mount is None:
        return [f"{args[1]} is on no volume"]
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    host = volume.get("hostPath", {}).get("path")
    if host != f"{kubelet_root}/seccomp" or mount["mountPath"] != host:
        problems.append(f"the profiles go to {host}, not the kubelet's seccomp root")
    if args[1][len(mount["mountPath"]) + 1:] != containers.Settings().profile_dir:
        problems.append("the profiles go elsewhere than the webhook's Localhost profiles name")
    if mount.get("readOnly"):
        problems.append("the seccomp root must be writable for the installer")
    names = {p.name for p in (Path(__file__).resolve().parents[2] / "deploy" / "seccomp")
             .glob("*.json")}
    if names != set(seccomp.SHIPPED):
        problems.append(f"deploy/seccomp holds {sorted(names)}, not the shipped profiles")
    return problems


def test_seccomp_profiles_are_installed(daemonset: dict[str, Any]) -> None:
    assert check_seccomp_profiles(daemonset) == []
    containerfile = CONTAINERFILE.read_text()
    assert "COPY --from=build /src/deploy/seccomp/*.json /usr/share/fhmon/seccomp/" in \
        containerfile
    from monitor.kubevirt import seccomp
    assert seccomp.IMAGE_PROFILES == "/usr/share/fhmon/seccomp"
    # Every Localhost profile the injection can give is one that is installed.
    from monitor.kubevirt import pods
    from monitor.kubevirt.containers import Settings
    for settings in (Settings(), Settings(runtime="cri-o")):
        for profile in ({"type": "RuntimeDefault"}, {"type": "Localhost",
                                                      "localhostProfile": pods.KUBEVIRT_PROFILE}):
            name = pods.replacement_profile(profile, settings)
            assert isinstance(name, str) and name.startswith(settings.profile_dir + "/")
            assert name.removeprefix(settings.profile_dir + "/") in seccomp.SHIPPED


@pytest.mark.parametrize("breakage", ["path", "dir", "readonly"])
def test_seccomp_profile_checks_catch_a_broken_copy(daemonset: dict[str, Any],
                                                    breakage: str) -> None:
    ds = copy.deepcopy(daemonset)
    spec = ds["spec"]["template"]["spec"]
    (init,) = [c for c in spec["initContainers"] if c["name"] == "seccomp-profiles"]
    match breakage:
        case "path":
            next(v for v in spec["volumes"] if v["name"] == "kubelet-seccomp")["hostPath"][
                "path"] = "/var/lib/seccomp"
        case "dir":
            init["args"][1] = "/var/lib/kubelet/seccomp/other"
        case "readonly":
            init["volumeMounts"][0]["readOnly"] = True
    assert check_seccomp_profiles(ds) != []


def test_a_non_default_kubelet_root_is_one_substitution(daemonset: dict[str, Any]) -> None:
    """docs/kubevirt.md: `sed s|/var/lib/kubelet|ROOT|g` over the rendered manifests moves
    every kubelet path (volumes, mounts, globs, the device plugin's and the profiles'
    directories) and the checks still hold; the node then accepts the PVs under ROOT."""
    root = "/data/k8s/kubelet"
    moved = yaml.safe_load(yaml.safe_dump(daemonset).replace("/var/lib/kubelet", root))
    assert ds_flags(moved)["--allow"] == volumes.node_allow_globs(root)
    assert check_kubelet_mount(moved) == []
    assert check_seccomp_profiles(moved, root) == []
    spec = moved["spec"]["template"]["spec"]
    (plugin,) = [c for c in spec["containers"] if c["name"] == "device-plugin"]
    plugin_dir = plugin["args"][plugin["args"].index("--plugin-dir") + 1]
    mount = next(m for m in plugin["volumeMounts"] if m["mountPath"] == plugin_dir)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert plugin_dir == volume["hostPath"]["path"] == f"{root}/device-plugins"
    assert "/var/lib/kubelet" not in yaml.safe_dump(moved)
