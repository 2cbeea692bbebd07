"""The injected virt-launcher pod's containers under a real OCI runtime (Debian's runc), from
OCI configs translated from the pod spec as the kubelet and containerd's CRI plugin translate
them (cri_spec.py), serving the e2e guest.

For each case the pod is injected by `fhmon inject`, then, as on a node:
  1. the kubelet's volumes: the PVC `data` is the run's share, the virtiofs-containers
     emptyDir is the folder QEMU (the compute container) finds virtiofsd's socket in, the
     launcher emptyDir is a fresh folder with fsGroup ownership;
  2. the device plugin's Allocate answer for devices.kubevirt.io/fhmon gives the mount of
     fhmon's socket directory (here the run's folder, where `fhmon serve` listens);
  3. the init container `fhmon-launcher` runs `install-launcher` under runc (uid 107, no
     capabilities, no_new_privs, read-only root) from fhmon's image as scripts/build-image.sh
     builds it (cached under build/image, unpacked by umoci): the launcher the virtiofs
     container then runs is the image's;
  4. the container `virtiofs-data` runs under runc from the virt-launcher "image" (the host's
     /usr plus KubeVirt's /usr/libexec/virtiofsd, a script exec'ing the e2e environment's
     virtiofsd), with the seccomp profile the pod asks for; the guest runs its workload.

Cases: (a) the stock KubeVirt pod (no seccomp profile: Unconfined): handles through fhmon;
(b) the HCO pod (pod-level Localhost kubevirt/kubevirt.json): handles through fhmon once the
injection gives the virtiofs container fhmon's own profile; (c) no fhmon at VM start: the guest
works without handles, virtiofsd runs KubeVirt's command line. And why (b) needs fhmon's
profile: under the runtime's profile alone (HCO's as CRI-O reads it, containerd's
RuntimeDefault) open_by_handle_at never reaches fhmon.

Not modelled: the pod sandbox (each container has its own namespaces; the compute container
is the harness's QEMU on the host), the kubelet's /etc/hosts and termination-log mounts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.kubevirt import containers, deviceplugin, inject, seccomp
from protocol import deviceplugin as api
from tests.support import cri_spec, runc
from tests.support.kubevirt import LAUNCHER_POD

from . import expect, harness

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SECCOMP_DATA = REPO / "tests" / "data" / "seccomp"
QEMU_UID = 107
HOST_SOCKET_DIR = "/var/run/kubevirt/fhmon"   # the DaemonSet's hostPath
VIRTIOFS = "virtiofs-data"
HCO_PROFILE = "kubevirt/kubevirt.json"
ALL_STEPS = {"create", "append", "readback", "stat", "rename", "hardlink", "symlink", "chmod",
             "unlink", "lsR", "find", "checksum", "dropcache"}
NOT_SUPPORTED = {"ENOTSUP", "EOPNOTSUPP"}


def stock_pod() -> dict[str, Any]:
    """KubeVirt's virt-launcher pod, injected."""
    loaded: dict[str, Any] = yaml.safe_load(inject.inject(LAUNCHER_POD, containers.Settings()))
    return loaded


def hco_pod() -> dict[str, Any]:
    """The pod as HCO makes KubeVirt render it: pod-level Localhost kubevirt/kubevirt.json
    (the KubeVirt CR's seccompConfiguration), then injected."""
    pod = yaml.safe_load(LAUNCHER_POD)
    pod["spec"]["securityContext"]["seccompProfile"] = {
        "type": "Localhost", "localhostProfile": HCO_PROFILE}
    loaded: dict[str, Any] = yaml.safe_load(inject.inject(yaml.safe_dump(pod, sort_keys=False),
                                                          containers.Settings()))
    return loaded


def device_plugin_mount() -> Any:
    """What the kubelet gets from the plugin's Allocate for one devices.kubevirt.io/fhmon."""
    plugin = deviceplugin.DevicePlugin(deviceplugin.PluginConfig(socket_dir=HOST_SOCKET_DIR,
                                                                 devices=1))
    request = api.AllocateRequest(container_requests=[
        api.ContainerAllocateRequest(devices_ids=plugin.ids)])
    response = asyncio.run(plugin.allocate(request, None))
    (mount,) = response.container_responses[0].mounts
    return mount


def kubelet_volumes(pod: dict[str, Any], rd: harness.RunDir) -> dict[str, str]:
    """Each volume's host directory; emptyDirs get the kubelet's fsGroup ownership
    (group fsGroup, setgid, group-writable)."""
    fs_group = pod["spec"]["securityContext"]["fsGroup"]
    dirs: dict[str, str] = {}
    for volume in pod["spec"]["volumes"]:
        name = volume["name"]
        if name == "data":
            dirs[name] = str(rd.share)   # the PVC
        elif name == "virtiofs-containers":
            dirs[name] = str(rd.sock_dir)   # shared with QEMU (the compute container)
        elif "emptyDir" in volume:
            d = rd.base / "volumes" / name
            d.mkdir(parents=True)
            os.chown(d, 0, fs_group)
            d.chmod(0o2777)
            dirs[name] = str(d)
    return dirs


def install_profiles(pod: dict[str, Any], seccomp_root: Path) -> dict[str, bytes]:
    """The kubelet's seccomp root as the node has it: KubeVirt's kubevirt/kubevirt.json
    (virt-handler writes it) and the profiles fhmon ships in deploy/seccomp (the DaemonSet
    writes them under fhmon/); returns the files the pod's containers name, read as
    containerd reads them (a missing one fails the translation, as it fails CreateContainer)."""
    (seccomp_root / "kubevirt").mkdir(parents=True)
    shutil.copyfile(SECCOMP_DATA / "kubevirt.json", seccomp_root / HCO_PROFILE)
    (seccomp_root / seccomp.PROFILE_DIR).mkdir()
    for shipped in (REPO / "deploy" / "seccomp").glob("*.json"):
        shutil.copyfile(shipped, seccomp_root / seccomp.PROFILE_DIR / shipped.name)
    profiles = {}
    ctx = cri_spec.NodeContext(rootfs="/", volume_paths={}, seccomp_root=str(seccomp_root))
    for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
        path = cri_spec.localhost_profile_path(pod, c["name"], ctx)
        if path is not None and os.path.exists(path):
            profiles[path] = Path(path).read_bytes()
    return profiles


@dataclass
class PodRun:
    """What a case observed."""

    res: harness.RunResult
    seen: dict[int, dict[str, str]]
    virtiofsd_cmdlines: list[list[str]]
    config: dict[str, Any]
    leftovers: list[str]
    idle: bool = True                      # fhmon noticed virtiofsd was gone
    shutdown: dict[str, Any] | None = None  # fhmon's shutdown event, when it ran
    events: list[dict[str, Any]] = field(default_factory=list)
    fhmon_log: str = ""
    fhmon_rc: int | None = None


def container_processes(init_pid: int) -> list[int]:
    """Every process in the container's pid namespace (the launcher and virtiofsd)."""
    try:
        ns = os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/pid") == ns:
                    found.append(int(entry))
    return found


def start_node(rt: runc.Runtime, pod: dict[str, Any], rd: harness.RunDir, e2e_env: harness.Env,
               seccomp_reader: str, image: tuple[Path, cri_spec.ImageConfig]
               ) -> tuple[dict[str, Any], str, list[str]]:
    """Runs the init container to completion; returns the virtiofs container's config, id
    and runc argv."""
    mount = device_plugin_mount()
    assert (mount.container_path, mount.host_path, mount.read_only) == (
        HOST_SOCKET_DIR, HOST_SOCKET_DIR, True)
    # The DaemonSet's hostPath is the run's folder here (fhmon_service's fhmon.sock).
    device = cri_spec.DeviceMount(mount.container_path, str(rd.base), mount.read_only)
    volumes = kubelet_volumes(pod, rd)
    seccomp_root = rd.base / "kubelet-seccomp"
    profiles = install_profiles(pod, seccomp_root)

    def ctx(name: str, rootfs: Path, image: cri_spec.ImageConfig,
            devices: tuple[cri_spec.DeviceMount, ...] = ()) -> cri_spec.NodeContext:
        return cri_spec.NodeContext(
            rootfs=str(rootfs), volume_paths=volumes, device_mounts=devices, image=image,
            hostname=pod["spec"].get("hostname", ""),
            cgroups_path=f"/fhmon-e2e/{rt.base.name}-{name}",
            seccomp_root=str(seccomp_root), localhost_profiles=profiles,
            runtime_default=runc.runtime_default, seccomp_reader=seccomp_reader)

    # 1. The init container, from fhmon's image as scripts/build-image.sh builds it (the
    # launcher it copies is the image's, not the checkout's).
    root, fhmon_image = image
    (rt.base / "init").mkdir()
    config = cri_spec.translate(pod, containers.LAUNCHER_INIT, ctx("init", root, fhmon_image))
    init_id, bundle = rt.bundle("init", config)
    copied = rt.run(init_id, bundle)
    assert copied.returncode == 0, f"init container: {copied.stdout}{copied.stderr}"
    # 2. The virtiofs container, from the virt-launcher image; the device's mount.
    script = f"#!/bin/sh\nexec {' '.join(e2e_env.virtiofsd_argv())} \"$@\"\n"
    root = rt.rootfs("virtiofs", runc.Image(usr_files={"libexec/virtiofsd": (script, 0o755)},
                                            binds=[str(e2e_env.cache)]))
    config = cri_spec.translate(pod, VIRTIOFS, ctx("virtiofs", root, cri_spec.ImageConfig(),
                                                   (device,)))
    vfs_id, bundle = rt.bundle("virtiofs", config)
    # virtiofsd's socket, as QEMU (the compute container) finds it in the shared emptyDir.
    os.symlink("data.sock", rd.socket)
    return config, vfs_id, rt.run_argv(vfs_id, bundle)


def serve_pod(pod: dict[str, Any], e2e_env: harness.Env,
              fhmon_image: tuple[Path, cri_spec.ImageConfig], *, with_fhmon: bool,
              seccomp_reader: str = "containerd") -> PodRun:
    """Runs the pod's containers under runc and the guest against them (fhmon or not)."""
    seen: dict[int, dict[str, str]] = {}
    cmdlines: list[list[str]] = []
    svc: harness.FhmonService | None = None
    rt = runc.Runtime()
    leftovers: list[str] = []
    try:
        with harness.run_dir(QEMU_UID) as rd, contextlib.ExitStack() as stack:
            config, vfs_id, argv = start_node(rt, pod, rd, e2e_env, seccomp_reader,
                                              fhmon_image)
            if with_fhmon:
                svc = stack.enter_context(harness.fhmon_service(
                    rd, serve_args=["--socket-mode", "0660", "--socket-group", str(QEMU_UID)]))

            def observe(_res: harness.RunResult) -> None:
                state = rt.state_of(vfs_id)
                for pid in container_processes(int(state["pid"])) if state else []:
                    raw = harness.process_cmdline(pid).split()
                    if raw and raw[0] == e2e_env.ld_so and pid not in seen:
                        with contextlib.suppress(OSError):
                            seen[pid] = harness.process_status(pid)
                            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                            cmdlines.append([a.decode() for a in cmdline.split(b"\0")[:-1]])
                if svc is not None:
                    svc.snapshot()

            res = harness.run_scenario(e2e_env, rd, mode="prefer", uid=QEMU_UID, argv=argv,
                                       on_virtiofsd_ready=observe, on_tick=observe,
                                       tick_seconds=2.0)
            run = PodRun(res=res, seen=seen, virtiofsd_cmdlines=cmdlines, config=config,
                         leftovers=[])
            if svc is not None:
                run.idle = svc.wait_idle()
            stack.close()   # stops fhmon: its shutdown event, before the run dir goes
            if svc is not None:
                run.shutdown, run.events = svc.shutdown_event(), svc.events()
                run.fhmon_log, run.fhmon_rc = svc.log_text(), svc.returncode
    finally:
        leftovers = rt.close()
    run.leftovers = leftovers
    return run


def summary(run: PodRun) -> str:
    return (f"{run.res.summary()}\nseen={run.seen}\ncmdlines={run.virtiofsd_cmdlines}"
            f"\nshutdown={json.dumps(run.shutdown)}\nfhmon log tail: {run.fhmon_log[-3000:]}")


def assert_guest_served(run: PodRun, text: str) -> None:
    """The workload passed, nothing was left over, virtiofsd ran as the pod says."""
    res = run.res
    assert res.virtiofsd_started, text
    assert res.workload_passed, text
    assert set(res.steps) == ALL_STEPS and res.failed_steps() == set(), text
    assert res.host_check_passed, text
    assert (res.qemu_rc, res.virtiofsd_rc) == (0, 0), text
    assert res.leftovers == [] and run.leftovers == [], text
    assert run.seen, text
    for status in run.seen.values():
        assert status["Uid"].split() == [str(QEMU_UID)] * 4, text
        assert status["Gid"].split() == [str(QEMU_UID)] * 4, text
        assert status["Groups"].split() == [str(QEMU_UID)], text
        assert status["CapEff"] == status["CapPrm"] == status["CapBnd"] == "0" * 16, text
        assert status["NoNewPrivs"] == "1", text


def assert_handles_through_fhmon(run: PodRun, text: str) -> None:
    """fhmon made and opened the handles; only symlinks were refused."""
    assert run.fhmon_rc == 0 and run.idle, text
    shutdown = run.shutdown
    assert shutdown is not None, text
    counters = shutdown["counters"]
    counts = expect.expected_counts(harness.DEFAULT_DIRS, harness.DEFAULT_FILES)
    n2h, obh = counters.get("name_to_handle_at", {}), counters.get("open_by_handle_at", {})
    assert n2h.get("ok", 0) > counts["entries"] and obh.get("ok", 0) > counts["entries"], text
    assert set(obh) == {"ok"} and set(n2h) - {"ok"} <= NOT_SUPPORTED, text
    assert shutdown.get("registrations") == {"accepted": 1}, text
    assert not [e for e in run.events if e.get("level") in ("error", "critical")], text
    handle_lines = [line for line in run.res.virtiofsd_stderr.splitlines()
                    if "file handle" in line]
    assert handle_lines and all("falling back to O_PATH FDs" in line for line in handle_lines), \
        text


def test_stock_kubevirt_pod_under_runc_gets_handles_from_fhmon(
        e2e_env: harness.Env, fhmon_image: tuple[Path, cri_spec.ImageConfig]) -> None:
    """(a) No seccomp profile (Unconfined): the launcher's filter sends the calls to fhmon."""
    pod = stock_pod()
    run = serve_pod(pod, e2e_env, fhmon_image, with_fhmon=True)
    text = summary(run)
    print(text)
    assert "seccomp" not in run.config["linux"], text
    assert_guest_served(run, text)
    assert_handles_through_fhmon(run, text)


@pytest.mark.parametrize("reader", ["cri-o", "containerd"])
def test_hco_pod_under_runc_gets_handles_from_fhmon(
        e2e_env: harness.Env, reader: str,
        fhmon_image: tuple[Path, cri_spec.ImageConfig]) -> None:
    """(b) Pod-level Localhost kubevirt/kubevirt.json: the injected container's own profile
    lets the two calls reach the launcher's filter, the profile read as OpenShift's CRI-O
    reads it (HCO's runtime) and as containerd does."""
    pod = hco_pod()
    assert [c for c in pod["spec"].get("initContainers") or []
            if c["name"] == containers.LAUNCHER_INIT], "fhmon inject left the HCO pod alone"
    run = serve_pod(pod, e2e_env, fhmon_image, with_fhmon=True, seccomp_reader=reader)
    text = summary(run)
    print(text)
    assert "seccomp" in run.config["linux"], text   # a profile is really in force
    assert_guest_served(run, text)
    assert_handles_through_fhmon(run, text)


@pytest.mark.parametrize(("profile", "reader", "reaches_fhmon"), [
    (HCO_PROFILE, "cri-o", False), (HCO_PROFILE, "containerd", True), ("", "containerd", False)])
def test_the_runtimes_profile_alone_decides_whether_open_by_handle_at_reaches_fhmon(
        e2e_env: harness.Env, profile: str, reader: str, reaches_fhmon: bool,
        fhmon_image: tuple[Path, cri_spec.ImageConfig]) -> None:
    """Why (b) needs a profile of fhmon's: the injected pod under HCO's kubevirt.json as is
    (pod level, nothing at container level). Read as CRI-O (OpenShift) reads it, its ERRNO
    rule for open_by_handle_at (for containers without CAP_DAC_READ_SEARCH) applies, and an
    ERRNO outranks the launcher's USER_NOTIF: the call never reaches fhmon, virtiofsd's
    start-up probe fails and it serves the guest without handles. Read as containerd reads
    it (conditions dropped), the profile also keeps the ALLOW meant for holders of
    CAP_DAC_READ_SEARCH, and under runc the calls do reach fhmon. containerd's RuntimeDefault
    (a kubelet with --seccomp-default, profile "") has no rule for open_by_handle_at without
    CAP_DAC_READ_SEARCH: its default action, EPERM, stops it before fhmon."""
    if os.environ.get("FHMON_TEST_CONFIG"):
        # What these three runs measure is decided by the runtime's profile before any data
        # plane is asked (test (a) and (b) serve the guest on every plane): once is enough,
        # and each run is two minutes of TCG guest.
        pytest.skip("the runtime's profile decides before fhmon's plane: run on the default")
    pod = stock_pod()
    pod["spec"]["securityContext"]["seccompProfile"] = (
        {"type": "Localhost", "localhostProfile": profile} if profile
        else {"type": "RuntimeDefault"})
    run = serve_pod(pod, e2e_env, fhmon_image, with_fhmon=True, seccomp_reader=reader)
    text = summary(run)
    print(text)
    seccomp_in_force = run.config["linux"]["seccomp"]
    # kubevirt.json answers unknown calls ENOSYS (38); containerd's default, EPERM.
    assert seccomp_in_force.get("defaultErrnoRet") == (38 if profile else None), text
    assert_guest_served(run, text)
    assert run.shutdown is not None, text
    opened = run.shutdown["counters"].get("open_by_handle_at", {}).get("ok", 0)
    assert (opened > 0) == reaches_fhmon, text


def test_stock_pod_with_fhmon_down_runs_kubevirts_virtiofsd(
        e2e_env: harness.Env, fhmon_image: tuple[Path, cri_spec.ImageConfig]) -> None:
    """(c) No fhmon at VM start: the guest works, virtiofsd runs exactly KubeVirt's command
    line (no handle flags), without handles."""
    pod = stock_pod()
    original = cri_spec.find_container(yaml.safe_load(LAUNCHER_POD), VIRTIOFS)
    run = serve_pod(pod, e2e_env, fhmon_image, with_fhmon=False)
    text = summary(run)
    print(text)
    assert_guest_served(run, text)
    for cmdline in run.virtiofsd_cmdlines:
        assert cmdline[-len(original["args"]):] == original["args"], text
        assert not [a for a in cmdline if a.startswith("--inode-file-handles")], text
