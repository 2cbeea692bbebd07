"""Every container of fhmon's DaemonSet, and the webhook and the injected init container,
started from the image scripts/build-image.sh builds, under Debian's runc (issue 36.2).

The image is built here (cached under build/image), unpacked with umoci, and each container
of the rendered manifests translated to an OCI config as the kubelet and containerd would
(tests/support/cri_spec.py: the manifest's user, capabilities, no_new_privs, read-only root,
seccomp profile, mounts, hostPID). The node's hostPath directories are a fresh folder here,
but for the share, which is where the DaemonSet's --allow globs look
(/opt/local-path-provisioner/<a directory of this run>), as on a node. Then, as on a node:

- `check` and `seccomp-profiles` run to completion: `check` exits 0, and the profiles land
  in the kubelet's seccomp root as deploy/seccomp ships them;
- `fhmon serve`, `keeper` and `device-plugin` run: `fhmon probe` answers over the host's
  socket, from the host and from inside the container (the kubelet's exec probe); a target
  on the host, uid 65534 under this checkout's launcher, gets a handle signed and opened; the
  keeper holds fhmon's connection; the device plugin registers with a kubelet stand-in and
  answers Allocate with the socket directory;
- the webhook (its Deployment's container, the TLS Secret mounted) answers /healthz and an
  AdmissionReview over TLS, from a client inside its network namespace;
- the injected virt-launcher pod's init container (`install-launcher`, uid 107, no
  capabilities) copies the launcher out of the image, and that launcher, run as the
  virtiofs container runs it, registers a target with the image's `fhmon serve`.

Each running container's uid, capabilities and root mount are checked against the manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.kubevirt import containers, inject
from protocol import deviceplugin as api
from tests.deploy.render import BASE, COMPONENTS, REPO, load_docs, one, render
from tests.support import FHMON, NOBODY, Agent, World, cri_spec, image, runc
from tests.support.handles import N2HResult
from tests.support.kubelet import FakeKubelet
from tests.support.kubevirt import LAUNCHER_POD, make_certificate, review

SHARE_PARENT = Path("/opt/local-path-provisioner")   # an --allow glob's directory
CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4,
            "KILL": 5, "SETGID": 6, "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10,
            "NET_RAW": 13, "SYS_CHROOT": 18, "SYS_PTRACE": 19, "MKNOD": 27,
            "AUDIT_WRITE": 29, "SETFCAP": 31}
WEBHOOK_CLIENT = r"""
import http.client, json, ssl, sys
context = ssl.create_default_context(cafile="/etc/fhmon/webhook-tls/tls.crt")
def ask(method, path, body=None):
    conn = http.client.HTTPSConnection("127.0.0.1", 8443, context=context, timeout=10)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    return reply.status, reply.read().decode()
health = ask("GET", "/healthz")
answer = ask("POST", "/mutate", sys.stdin.buffer.read())
print(json.dumps({"healthz": health, "mutate": answer}))
"""


@dataclass
class Node:
    """The image, the node's directories and the containers started from the image."""

    built: image.BuiltImage
    rootfs: Path
    dirs: dict[str, Path]
    share: Path
    rt: runc.Runtime
    daemonset: dict[str, Any]
    running: dict[str, tuple[str, subprocess.Popen[bytes]]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    finished: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    @property
    def socket(self) -> str:
        return str(self.dirs["socket-dir"] / "fhmon.sock")

    def context(self, name: str, volumes: dict[str, str],
                image_config: cri_spec.ImageConfig | None = None) -> cri_spec.NodeContext:
        return cri_spec.NodeContext(
            rootfs=str(self.rootfs), volume_paths=volumes,
            image=image_config or self.built.config, hostname="node1",
            cgroups_path=f"/fhmon-image/{self.rt.base.name}-{name}",
            runtime_default=runc.runtime_default)

    def config(self, pod: dict[str, Any], name: str, volumes: dict[str, str]) -> dict[str, Any]:
        (self.rt.base / name).mkdir(exist_ok=True)  # the bundle, beside the shared rootfs
        return cri_spec.translate(pod, name, self.context(name, volumes))

    def run_to_completion(self, pod: dict[str, Any], name: str,
                          volumes: dict[str, str]) -> subprocess.CompletedProcess[str]:
        container_id, bundle = self.rt.bundle(name, self.config(pod, name, volumes))
        done = self.rt.run(container_id, bundle, timeout=120)
        self.finished[name] = done
        return done

    def start(self, pod: dict[str, Any], name: str, volumes: dict[str, str]) -> str:
        container_id, bundle = self.rt.bundle(name, self.config(pod, name, volumes))
        log = self.rt.base / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(self.rt.run_argv(container_id, bundle),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        self.running[name] = (container_id, proc)
        self.logs[name] = log
        return container_id

    def pid(self, name: str) -> int:
        container_id, proc = self.running[name]
        deadline = time.monotonic() + 30
        while (state := self.rt.state_of(container_id)) is None or not state.get("pid"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{name} did not start: {self.log(name)}")
            time.sleep(0.05)
        return int(state["pid"])

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")[-4000:]

    def exec(self, name: str, argv: list[str], stdin: bytes = b"",
             timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
        container_id, _ = self.running[name]
        return subprocess.run([runc.RUNC, "--root", str(self.rt.state), "exec", container_id,
                               *argv], input=stdin, capture_output=True, timeout=timeout)


def pod_of(workload: dict[str, Any]) -> dict[str, Any]:
    return {"spec": workload["spec"]["template"]["spec"]}


def config_map_files(dest: Path, config_map: dict[str, Any]) -> Path:
    for key, value in config_map["data"].items():
        (dest / key).write_text(value)
        (dest / key).chmod(0o644)
    return dest


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    for tool in ("umoci", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: scripts/setup.sh installs it (apt-get install "
                        "mmdebstrap umoci)", pytrace=False)
    built = image.build()
    base = Path(tempfile.mkdtemp(prefix="fhmon-image-", dir="/tmp"))
    base.chmod(0o755)
    share = SHARE_PARENT / f"fhmon-image-test-{uuid.uuid4().hex[:12]}"
    made_parent = not SHARE_PARENT.exists()
    rt = runc.Runtime()
    node = None
    try:
        rootfs = image.unpack(built.layout, base / "unpacked")
        dirs = {name: image.fresh_dir(base / name) for name in
                ("socket-dir", "config", "kubelet", "tmp", "device-plugins", "kubelet-seccomp",
                 "launcher")}
        rendered = render(BASE)
        daemonset = one(rendered, "DaemonSet")
        config_map_files(dirs["config"], one(rendered, "ConfigMap"))
        keys = base / "keygen"
        subprocess.run([FHMON, "keygen",
                        "--key-dir", str(keys)], check=True, capture_output=True)
        (keys_volume,) = [v for v in daemonset["spec"]["template"]["spec"]["volumes"]
                          if v["name"] == "keys"]
        mode = keys_volume["secret"]["defaultMode"]
        dirs["keys"] = image.secret_volume(base / "keys", {p.name: p.read_bytes()
                                                            for p in keys.iterdir()}, mode)
        share.mkdir(parents=True)
        share.chmod(0o755)
        (share / "file").write_text("served from the image\n")
        (share / "file").chmod(0o644)
        node = Node(built, rootfs, dirs, share, rt, daemonset)
        yield node
    finally:
        if node is not None:
            for _, proc in node.running.values():
                if proc.poll() is None:
                    proc.terminate()
        rt.close()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(share, ignore_errors=True)
        if made_parent:
            with contextlib.suppress(OSError):
                SHARE_PARENT.rmdir()  # only if nothing else came to live there


def daemonset_volumes(node: Node) -> dict[str, str]:
    d = node.dirs
    return {"socket-dir": str(d["socket-dir"]), "keys": str(d["keys"]),
            "config": str(d["config"]), "kubelet": str(d["kubelet"]), "tmp": str(d["tmp"]),
            "device-plugins": str(d["device-plugins"]),
            "kubelet-seccomp": str(d["kubelet-seccomp"]), "local-path": str(SHARE_PARENT)}


@pytest.fixture(scope="module")
def pod(node: Node) -> Iterator[Node]:
    """The DaemonSet's pod as the kubelet starts it: init containers in order, then the
    containers, with a kubelet stand-in serving the device-plugin registration."""
    spec = pod_of(node.daemonset)
    volumes = daemonset_volumes(node)
    for init in spec["spec"]["initContainers"]:
        done = node.run_to_completion(spec, init["name"], volumes)
        assert done.returncode == 0, f"init container {init['name']}: {done.stdout}{done.stderr}"
    node.start(spec, "keeper", volumes)
    node.start(spec, "fhmon", volumes)
    deadline = time.monotonic() + 60
    while not os.path.exists(node.socket):
        assert time.monotonic() < deadline, f"fhmon serve did not listen: {node.log('fhmon')}"
        assert node.running["fhmon"][1].poll() is None, node.log("fhmon")
        time.sleep(0.1)
    yield node


def status_of(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def declared_caps(container: dict[str, Any]) -> set[str]:
    caps = container["securityContext"].get("capabilities", {})
    assert caps.get("drop") == ["ALL"]
    return set(caps.get("add", []))


def check_as_declared(pid: int, container: dict[str, Any]) -> None:
    """The container's process runs with the manifest's uid, capabilities and root."""
    sc = container["securityContext"]
    status = status_of(pid)
    uids = status["Uid"].split()
    assert set(uids) == {str(sc["runAsUser"])}, (container["name"], uids)
    effective = int(status["CapEff"], 16)
    wanted = sum(1 << CAP_BITS[c] for c in declared_caps(container))
    assert effective == wanted, (container["name"], hex(effective), hex(wanted))
    assert int(status["NoNewPrivs"]) == int(sc["allowPrivilegeEscalation"] is False)
    root = [line for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
            if line.split()[4] == "/"]
    assert root and "ro" in root[-1].split()[5].split(","), (container["name"], root)


def test_image_size_and_contents(node: Node) -> None:
    """Under 150 MB compressed; no compiler, cargo or pip cache inside."""
    assert node.built.compressed_mb < 150, node.built.compressed_mb
    for absent in ("usr/bin/gcc", "usr/bin/cc", "usr/bin/cargo", "usr/bin/rustc", "root/.cache",
                   "root/.cargo"):
        assert not (node.rootfs / absent).exists(), absent
    assert (node.rootfs / "usr/local/bin/fhmon").exists()


def test_init_containers_check_and_install_the_profiles(pod: Node) -> None:
    assert pod.finished["check"].returncode == 0
    installed = pod.dirs["kubelet-seccomp"] / "fhmon"
    shipped = {p.name: p.read_bytes() for p in (REPO / "deploy" / "seccomp").glob("*.json")}
    assert {p.name: p.read_bytes() for p in installed.iterdir()} == shipped


def test_serve_answers_probes_and_a_target(pod: Node, world: World) -> None:
    fhmon = pod.running["fhmon"]
    check_as_declared(pod.pid("fhmon"), next(c for c in pod.daemonset["spec"]["template"]
                                             ["spec"]["containers"] if c["name"] == "fhmon"))
    host = subprocess.run([FHMON, "probe", "--socket",
                           pod.socket], capture_output=True, text=True, timeout=30)
    assert host.returncode == 0, host.stderr + pod.log("fhmon")
    # the kubelet's liveness probe: exec of the image's own fhmon in the container
    inside = pod.exec("fhmon", ["fhmon", "probe", "--liveness", "--socket",
                                "/var/run/kubevirt/fhmon/fhmon.sock"])
    assert inside.returncode == 0, inside.stderr
    agent = Agent(world, "fhmon", pod.share, pod.socket)
    try:
        assert os.stat(f"/proc/{agent.pid}").st_uid == NOBODY
        signed = N2HResult.of(agent.call("n2h", path="file"))
        assert signed.errno == 0, signed
        opened = agent.call("obh", f_handle=signed.f_handle.hex(),
                            handle_type=signed.handle_type)
        assert opened["errno"] == 0 and bytes.fromhex(opened["head"]) == b"served from the image\n"
    finally:
        agent.close()
    assert fhmon[1].poll() is None, pod.log("fhmon")


def test_keeper_runs_beside_serve(pod: Node) -> None:
    """The keeper listens on the socket directory, and fhmon serve (--keeper) reaches it."""
    check_as_declared(pod.pid("keeper"), next(c for c in pod.daemonset["spec"]["template"]
                                              ["spec"]["containers"] if c["name"] == "keeper"))
    assert (pod.dirs["socket-dir"] / "keeper.sock").exists()
    time.sleep(1.0)
    assert pod.running["keeper"][1].poll() is None, pod.log("keeper")
    assert "keeper_unreachable" not in pod.log("fhmon"), pod.log("fhmon")


def test_device_plugin_registers_and_allocates(pod: Node) -> None:
    spec = pod_of(pod.daemonset)
    volumes = daemonset_volumes(pod)

    async def body() -> Any:
        kubelet = FakeKubelet(pod.dirs["device-plugins"])
        await kubelet.start()
        try:
            pod.start(spec, "device-plugin", volumes)
            registration = await kubelet.next_registration()
            async with kubelet.dial(registration.endpoint) as call:
                devices = await call("ListAndWatch", api.Empty(), api.ListAndWatchResponse,
                                     stream=True).read()
                request = api.AllocateRequest(container_requests=[
                    api.ContainerAllocateRequest(devices_ids=[devices.devices[0].ID])])
                answer = await call("Allocate", request, api.AllocateResponse)
            return registration, answer
        finally:
            await kubelet.stop()

    registration, answer = asyncio.run(body())
    assert registration.resource_name == "fhmon.io/virtiofs"
    (mount,) = answer.container_responses[0].mounts
    assert (mount.container_path, mount.host_path, mount.read_only) == (
        "/var/run/kubevirt/fhmon", "/var/run/kubevirt/fhmon", True)
    check_as_declared(pod.pid("device-plugin"), next(
        c for c in pod.daemonset["spec"]["template"]["spec"]["containers"]
        if c["name"] == "device-plugin"))


def test_webhook_answers_over_tls(node: Node) -> None:
    (deployment,) = [d for d in load_docs(COMPONENTS / "kubevirt-webhook" / "webhook.yaml")
                     if d["kind"] == "Deployment"]
    spec = pod_of(deployment)
    tls = image.fresh_dir(node.rt.base / "webhook-tls")
    cert, key, _ = make_certificate(tls, "fhmon-webhook")
    (secret,) = [v["secret"] for v in spec["spec"]["volumes"] if v["name"] == "tls"]
    fs_group = spec["spec"]["securityContext"]["fsGroup"]
    volume = image.secret_volume(tls / "volume", {"tls.crt": cert, "tls.key": key},
                                 secret["defaultMode"], group=fs_group)
    node.start(spec, "webhook", {"tls": str(volume)})
    pid = node.pid("webhook")
    status = status_of(pid)
    assert status["Uid"].split()[0] == "65534" and int(status["CapEff"], 16) == 0
    deadline = time.monotonic() + 30
    while True:
        asked = node.exec("webhook", ["python3", "-c", WEBHOOK_CLIENT],
                          stdin=review(yaml.safe_load(LAUNCHER_POD)))
        if asked.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert asked.returncode == 0, asked.stderr.decode()[-2000:] + node.log("webhook")
    answers = json.loads(asked.stdout)
    assert answers["healthz"][0] == 200
    status_code, body = answers["mutate"]
    assert status_code == 200
    response = json.loads(body)["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"


def test_installed_launcher_registers_a_target(pod: Node, world: World) -> None:
    """The injected pod's init container copies the launcher out of the image; run as the
    virtiofs container runs it, it registers with the image's fhmon serve."""
    injected = yaml.safe_load(inject.inject(LAUNCHER_POD, containers.Settings()))
    launcher_dir = pod.dirs["launcher"]
    fs_group = injected["spec"]["securityContext"]["fsGroup"]
    os.chown(launcher_dir, 0, fs_group)
    launcher_dir.chmod(0o2777)
    volumes = {v["name"]: str(launcher_dir) for v in injected["spec"]["volumes"]
               if "emptyDir" in v}
    done = pod.run_to_completion(injected, containers.LAUNCHER_INIT, volumes)
    assert done.returncode == 0, done.stdout + done.stderr
    installed = launcher_dir / "fhmon-launch"
    assert installed.is_file() and sorted(p.name for p in launcher_dir.iterdir()) == [
        "fhmon-launch"]
    image_launcher = pod.rootfs / "usr/local/lib/python3.11/dist-packages/monitor/_bin"
    assert installed.read_bytes() == (image_launcher / "fhmon-launch").read_bytes()
    agent = Agent(world, "fhmon", pod.share, pod.socket, launcher=[str(installed), "launch"])
    try:
        signed = N2HResult.of(agent.call("n2h", path="file"))
        assert signed.errno == 0, signed
    finally:
        agent.close()
