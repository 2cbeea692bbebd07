"""A virt-launcher pod injected by `fhmon inject`, its virtiofs container run as the kubelet
would, serving the e2e guest with handles from fhmon (issue 18).

The pod is tests/unit/kubevirt/virt-launcher-pod.yaml (KubeVirt's rendering), injected. Then:
  1. its init container `fhmon-launcher` runs (uid 107, no capabilities, no_new_privs) with
     the launcher emptyDir mounted: `fhmon install-launcher` copies the launcher;
  2. the device plugin's Allocate answer for `fhmon.io/virtiofs` is asked for the
     mount of fhmon's socket directory;
  3. the container `virtiofs-data` runs its injected command + args, exactly as written in
     the pod, through tests/e2e/pod_runtime.py: a new root with only the host's /usr (the
     image: no fhmon installation, no checkout, no virtualenv), the pod's volumes at their
     mount paths (the PVC is the run's share), the launcher read-only, the device plugin's
     mount read-only, uid/gid 107, no capabilities, no_new_privs. KubeVirt's image's
     /usr/libexec/virtiofsd is a two-line script exec'ing the e2e environment's virtiofsd.
The guest workload must pass with fhmon answering the handle calls, as in
test_virtiofsd_e2e.py's run 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.kubevirt import containers, deviceplugin, inject
from protocol import deviceplugin as api
from tests.support.kubevirt import LAUNCHER_POD

from . import expect, harness

pytestmark = pytest.mark.e2e

POD_RUNTIME = Path(__file__).with_name("pod_runtime.py")
REPO = Path(__file__).resolve().parents[2]
QEMU_UID = 107
HOST_SOCKET_DIR = "/var/run/kubevirt/fhmon"  # the DaemonSet's hostPath, here the run dir
ALL_STEPS = {"create", "append", "readback", "stat", "rename", "hardlink", "symlink", "chmod",
             "unlink", "lsR", "find", "checksum", "dropcache"}
NOT_SUPPORTED = {"ENOTSUP", "EOPNOTSUPP"}


def container(pod: dict[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    key = "initContainers" if init else "containers"
    (found,) = [c for c in pod["spec"][key] if c["name"] == name]
    return found


def device_plugin_mount() -> Any:
    """What the kubelet gets from the plugin's Allocate for one fhmon.io/virtiofs."""
    plugin = deviceplugin.DevicePlugin(deviceplugin.PluginConfig(socket_dir=HOST_SOCKET_DIR,
                                                                 devices=1))
    request = api.AllocateRequest(container_requests=[
        api.ContainerAllocateRequest(devices_ids=plugin.ids)])
    response = asyncio.run(plugin.allocate(request, None))
    (mount,) = response.container_responses[0].mounts
    return mount


def run_spec(base: Path, name: str, spec: dict[str, Any]) -> list[str]:
    root = base / f"{name}-root"
    root.mkdir()
    path = base / f"{name}.json"
    path.write_text(json.dumps({"root": str(root), **spec}))
    return [sys.executable, str(POD_RUNTIME), str(path)]


def volume_dirs(pod: dict[str, Any], rd: harness.RunDir) -> dict[str, Path]:
    """Where each of the pod's volumes is on this host (kubelet's job)."""
    dirs: dict[str, Path] = {}
    for volume in pod["spec"]["volumes"]:
        name = volume["name"]
        if name == "data":
            dirs[name] = rd.share  # the PVC
        elif name == "virtiofs-containers":
            dirs[name] = rd.sock_dir  # shared with QEMU (the compute container)
        elif "emptyDir" in volume:
            d = rd.base / "volumes" / name
            d.mkdir(parents=True)
            os.chown(d, QEMU_UID, QEMU_UID)  # fsGroup 107
            dirs[name] = d
    return dirs


def mounts_of(c: dict[str, Any], dirs: dict[str, Path]) -> list[dict[str, Any]]:
    return [{"source": str(dirs[m["name"]]), "target": m["mountPath"],
             "readonly": bool(m.get("readOnly"))} for m in c.get("volumeMounts", [])]


def user_of(c: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    context = {**pod["spec"].get("securityContext", {}), **c.get("securityContext", {})}
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    groups = [context["fsGroup"]] if "fsGroup" in context else []
    return {"uid": context["runAsUser"], "gid": context["runAsGroup"], "groups": groups}


def test_injected_virt_launcher_pod_serves_the_guest_with_fhmon(e2e_env: harness.Env) -> None:
    pod = yaml.safe_load(inject.inject(LAUNCHER_POD, containers.Settings()))
    init = container(pod, containers.LAUNCHER_INIT, init=True)
    virtiofs = container(pod, "virtiofs-data")
    assert virtiofs["resources"]["limits"]["fhmon.io/virtiofs"] == "1"
    mount = device_plugin_mount()
    assert (mount.container_path, mount.host_path, mount.read_only) == (
        HOST_SOCKET_DIR, HOST_SOCKET_DIR, True)
    path = "/usr/sbin:/usr/bin:/sbin:/bin"
    with harness.run_dir(QEMU_UID) as rd:
        dirs = volume_dirs(pod, rd)
        # 1. The init container: the fhmon image's entrypoint (`fhmon`) with its args.
        entrypoint = harness.fhmon_command()
        init_argv = run_spec(rd.base, "init", {
            "host": ["/usr", "/etc", "/dev", "/proc", str(REPO)],
            "links": {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"},
            "mounts": mounts_of(init, dirs), "files": {},
            "argv": [entrypoint, *init["args"]], "env": {"PATH": path},
            **user_of(init, pod)})
        copied = subprocess.run(init_argv, capture_output=True, text=True, timeout=300)
        assert copied.returncode == 0, copied.stderr
        # 2 + 3. The virtiofs container, with KubeVirt's image reduced to the host's /usr and
        # its virtiofsd; the device plugin's mount of the socket directory (the run dir,
        # where fhmon_service puts fhmon.sock).
        script = (f"#!/bin/sh\nexec {' '.join(e2e_env.virtiofsd_argv())} \"$@\"\n", 0o755)
        device_mount = {"source": str(rd.base), "target": mount.container_path,
                        "readonly": mount.read_only}
        argv = run_spec(rd.base, "virtiofs", {
            "host": ["/usr", "/etc", "/dev", "/proc", str(e2e_env.cache)],
            "links": {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"},
            "mounts": [*mounts_of(virtiofs, dirs), device_mount],
            "files": {"/usr/libexec/virtiofsd": script},
            "argv": [*virtiofs["command"], *virtiofs["args"]], "env": {"PATH": path},
            **user_of(virtiofs, pod)})
        # virtiofsd's socket, as QEMU (the compute container) finds it in the shared emptyDir.
        os.symlink("data.sock", rd.socket)
        seen: dict[int, dict[str, str]] = {}
        with harness.fhmon_service(rd, serve_args=["--socket-mode", "0660",
                                                   "--socket-group", str(QEMU_UID)]) as svc:
            def observe(_res: harness.RunResult) -> None:
                svc.snapshot()
                for target in (svc.status_snapshots[-1].get("targets") or [] if
                               svc.status_snapshots else []):
                    pid = int(target["pid"])
                    if pid not in seen:
                        with contextlib.suppress(OSError):
                            seen[pid] = harness.process_status(pid)
            res = harness.run_scenario(e2e_env, rd, mode="prefer", uid=QEMU_UID, argv=argv,
                                       on_virtiofsd_ready=observe, on_tick=observe,
                                       tick_seconds=2.0)
            idle = svc.wait_idle()
        shutdown = svc.shutdown_event()
        events = svc.events()
    summary = (f"{res.summary()}\ninit: {copied.stderr[-2000:]}\nshutdown={json.dumps(shutdown)}"
               f"\nseen={seen}\nfhmon log tail: {svc.log_text()[-3000:]}")
    print(summary)
    assert res.virtiofsd_started, summary
    assert res.workload_passed, summary
    assert set(res.steps) == ALL_STEPS and res.failed_steps() == set(), summary
    assert res.host_check_passed, summary
    assert (res.qemu_rc, res.virtiofsd_rc, svc.returncode) == (0, 0, 0), summary
    assert res.leftovers == [] and idle, summary
    # virtiofsd ran as the pod says: uid/gid 107, no capabilities, no_new_privs.
    assert seen, summary
    for status in seen.values():
        assert status["Uid"].split() == [str(QEMU_UID)] * 4, summary
        assert status["Gid"].split() == [str(QEMU_UID)] * 4, summary
        assert status["CapEff"] == status["CapPrm"] == "0000000000000000", summary
        assert status["NoNewPrivs"] == "1", summary
    # fhmon made and opened the handles; only symlinks were refused (virtiofsd kept O_PATH
    # fds for them, as --inode-file-handles=prefer allows).
    assert shutdown is not None, summary
    counters = shutdown["counters"]
    counts = expect.expected_counts(harness.DEFAULT_DIRS, harness.DEFAULT_FILES)
    n2h, obh = counters.get("name_to_handle_at", {}), counters.get("open_by_handle_at", {})
    assert n2h.get("ok", 0) > counts["entries"] and obh.get("ok", 0) > counts["entries"], summary
    assert set(obh) == {"ok"} and set(n2h) - {"ok"} <= NOT_SUPPORTED, summary
    assert shutdown.get("registrations") == {"accepted": 1}, summary
    assert not [e for e in events if e.get("level") in ("error", "critical")], summary
    handle_lines = [line for line in res.virtiofsd_stderr.splitlines() if "file handle" in line]
    assert handle_lines and all("falling back to O_PATH FDs" in line for line in handle_lines), \
        summary
