"""The client examples: the seccomp profile and the launch / listener pods that use it."""

from __future__ import annotations

from typing import Any

from tests.deploy.checks import broken, check_launch_pod, check_listener_pod, check_profile
from tests.deploy.flags import ds_socket, split_launch, virtiofsd_options
from tests.deploy.render import SECCOMP_PROFILE


def test_seccomp_profile(
    profile: dict[str, Any], daemonset: dict[str, Any], listener_pod: dict[str, Any]
) -> None:
    share = virtiofsd_options(listener_pod["spec"]["containers"][0]["command"])["shared-dir"]
    assert check_profile(profile, ds_socket(daemonset), share) == []


def test_listener_pod(listener_pod: dict[str, Any], profile: dict[str, Any]) -> None:
    share = profile["listenerMetadata"].removeprefix("share=")
    assert check_listener_pod(listener_pod, SECCOMP_PROFILE, share) == []


def test_launch_pod(launch_pod: dict[str, Any], daemonset: dict[str, Any]) -> None:
    assert check_launch_pod(launch_pod, daemonset) == []


def test_examples_share_the_same_share(
    launch_pod: dict[str, Any], listener_pod: dict[str, Any], profile: dict[str, Any]
) -> None:
    flags, _, _ = split_launch(launch_pod["spec"]["containers"][0]["command"])
    assert f"share={flags['--share'][0]}" == profile["listenerMetadata"]


def test_negative_profile(profile: dict[str, Any]) -> None:
    p = broken(profile)
    p["listenerPath"] = "/run/fhmon/fhmon.sock"
    p["syscalls"][0]["names"] = ["open_by_handle_at"]
    p["listenerMetadata"] = "/srv"
    problems = check_profile(p, "/var/run/kubevirt/fhmon/fhmon.sock", "/srv")
    assert len(problems) == 3


def test_negative_launch_pod(launch_pod: dict[str, Any], daemonset: dict[str, Any]) -> None:
    pod = broken(launch_pod)
    command = pod["spec"]["containers"][0]["command"]
    command[command.index("--socket") + 1] = "/var/run/fhmon/fhmon.sock"
    command[command.index("--share") + 1] = "/elsewhere"
    pod["spec"]["securityContext"]["runAsGroup"] = 1000
    problems = check_launch_pod(pod, daemonset)
    assert any("launch --socket" in p for p in problems)
    assert any("--shared-dir" in p for p in problems)
    assert any("share /elsewhere is on no volume" in p for p in problems)
    assert any("cannot reach the socket" in p for p in problems)


def test_negative_listener_pod(listener_pod: dict[str, Any]) -> None:
    pod = broken(listener_pod)
    pod["spec"]["containers"][0]["securityContext"]["seccompProfile"] = {"type": "RuntimeDefault"}
    problems = check_listener_pod(pod, SECCOMP_PROFILE, "/somewhere/else")
    assert len(problems) == 4
