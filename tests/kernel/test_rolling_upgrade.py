"""A DaemonSet rolling upgrade of fhmon under a busy virtiofsd-like target loses no call.

What deploy/base/daemonset.yaml makes the kubelet do on one node, played here with the real
binaries: the old pod's containers get SIGTERM (no preStop hook, no STOPSIGNAL in the image,
tests/deploy checks both) and must be gone within terminationGracePeriodSeconds; the new
pod's init container runs `fhmon check` with its arguments, then `fhmon serve` and `fhmon
keeper` start with theirs. The manifests' paths are mapped to local ones; everything else
(socket mode and group, log level, keeper, the ConfigMap's config.toml, a key directory laid
out as kubelet lays out the Secret volume, with its defaultMode) is taken from the manifests.
The target is registered by `fhmon launch`, as in the virtiofs container, and makes a
virtiofsd-like mix of lookups and opens on several threads through every upgrade.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from monitor import signing
from tests.support import FHMON, Agent, Service, World
from tests.support.load import Load, start_and_see_it_register

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "base"
UPGRADES = 3
THREADS = 4


def manifest(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((BASE / name).read_text()))


class Node:
    """One node's fhmon pod, as the DaemonSet describes it, with local paths."""

    def __init__(self, world: World, root: Path, socket_dir: Path) -> None:
        ds = manifest("daemonset.yaml")
        self.spec = ds["spec"]
        pod = ds["spec"]["template"]["spec"]
        self.grace = float(pod.get("terminationGracePeriodSeconds", 30))
        containers = {c["name"]: c for c in pod["containers"]}
        # `check` gates the server; the other init container only copies seccomp profiles
        # into the kubelet's directory, which this node does not have
        self.init = next(c for c in pod["initContainers"] if c["name"] == "check")
        self.server, self.keeper_spec = containers["fhmon"], containers["keeper"]
        root.mkdir(mode=0o755)
        self.root = root
        secret = next(v for v in pod["volumes"] if "secret" in v)["secret"]
        self.key_dir = self._secret_volume(root / "keys", secret["defaultMode"])
        config = root / "config.toml"
        config.write_text(manifest("configmap.yaml")["data"]["config.toml"])
        self.paths = {"/var/run/kubevirt/fhmon": str(socket_dir),
                      "/etc/fhmon/keys/..data": str(self.key_dir),
                      "/etc/fhmon/config.toml": str(config)}
        socket_dir.mkdir(mode=0o755, exist_ok=True)
        self.share_glob = str(world.shares / "*")
        self.keeper: subprocess.Popen[bytes] | None = None

    def _secret_volume(self, mount: Path, mode: int) -> Path:
        """kubelet's layout: a timestamped directory, the `..data` link, files of mode."""
        staging = self.root / "keygen"
        signing.keygen(staging)
        mount.mkdir()
        data = mount / "..2026_01_01_00_00_00.000000001"
        data.mkdir(mode=0o755)
        for path in staging.iterdir():
            (data / path.name).write_bytes(path.read_bytes())
            (data / path.name).chmod(mode)
            (mount / path.name).symlink_to(f"..data/{path.name}")
        (mount / "..data").symlink_to(data.name)
        return mount / "..data"

    def local(self, args: list[str]) -> list[str]:
        out = []
        for arg in args:
            for remote, here in self.paths.items():
                if arg == remote or arg.startswith(remote + "/"):
                    arg = here + arg[len(remote):]
            out.append(arg)
        return out

    def serve_extra(self) -> list[str]:
        """The server's flags other than those Service sets (socket, key dir, allow)."""
        args = self.local(self.server["args"])
        assert args[0] == "serve"
        extra, i = [], 1
        while i < len(args):
            flag, value = args[i], args[i + 1]
            if flag == "--metrics-address":
                value = "127.0.0.1:0"
            if flag not in ("--socket", "--key-dir", "--allow"):
                extra += [flag, value]
            i += 2
        return extra

    @property
    def socket(self) -> str:
        args = self.local(self.server["args"])
        return args[args.index("--socket") + 1]

    def run_init(self) -> None:
        """The init container: `fhmon check` with its (mapped) arguments must pass."""
        args = self.local(self.init["args"])
        args = [self.share_glob if a.startswith("/var/lib/kubelet/") else a for a in args]
        res = subprocess.run([FHMON, *args], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr

    def start_keeper(self) -> None:
        self.keeper = subprocess.Popen([FHMON, *self.local(self.keeper_spec["args"])],
                                       stderr=subprocess.DEVNULL)
        path = self.local(self.keeper_spec["args"])[-1]
        deadline = time.monotonic() + 15
        while not os.path.exists(path):
            assert time.monotonic() < deadline and self.keeper.poll() is None
            time.sleep(0.02)

    def terminate_keeper(self) -> float:
        assert self.keeper is not None
        started = time.monotonic()
        self.keeper.send_signal(signal.SIGTERM)
        self.keeper.wait(timeout=self.grace)
        return time.monotonic() - started


def test_rolling_upgrade_under_load_loses_no_call(world: World, tmp_path: Path) -> None:
    node = Node(world, tmp_path / "node", world.base / "rolling")
    assert node.spec["updateStrategy"]["type"] == "RollingUpdate"
    node.run_init()
    node.start_keeper()
    service = Service(world.base, [node.share_glob], name="rolling", key_dir=node.key_dir,
                      extra=node.serve_extra())
    assert service.socket == node.socket  # the DaemonSet's socket, mapped
    agent = Agent(world, "fhmon", world.main, node.socket)
    try:
        load = Load(agent, world.base / "rolling.done", THREADS)
        stops: list[float] = []
        for round_ in range(UPGRADES):
            time.sleep(0.3)
            assert load.worker.is_alive(), f"the load ended before upgrade {round_ + 1}"
            # The old pod: every container gets SIGTERM at once.
            started = time.monotonic()
            code = service.stop(signal.SIGTERM)
            stops.append(time.monotonic() - started)
            node.terminate_keeper()
            assert code == 0, service.log_text()[-2000:]
            # The new pod: the init container, then the containers.
            node.run_init()
            node.start_keeper()
            start_and_see_it_register(service)
        result = load.finish("upgrades")
        total = sum(result["results"].values())
        assert total > 0 and result["results"] == {"0": total}, result
        assert max(stops) < node.grace, f"fhmon took {max(stops):.1f}s to stop after SIGTERM"
        assert agent.call("obh", **load.obh)["errno"] == 0
        assert agent.call("fdcount")["fds"] == load.fds_before, "fds leaked into the target"
        print(f"rolling upgrade: {UPGRADES} upgrades, {total} calls, all answered; "
              f"fhmon stopped {max(stops) * 1000:.0f} ms after SIGTERM at most")
    finally:
        agent.close()
        service.stop()
        if node.keeper is not None and node.keeper.poll() is None:
            node.terminate_keeper()
