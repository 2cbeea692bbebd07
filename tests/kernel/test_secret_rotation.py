"""Key rotation as Kubernetes delivers it: kubelet swaps a Secret volume's `..data` link.

docs/deploy.md says fhmon picks a Secret update up by itself, with no signal and no restart.
This plays kubelet's atomic writer on a real key directory under a running fhmon (the
DaemonSet's --key-dir is the `..data` link) and checks that the new key verifies, then
signs, while handles signed before keep opening; the test sends no signal.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from monitor import signing
from tests.support import Agent, Service, World, wait_until
from tests.support.handles import key_id_of, signed_handle_args

SECRET_MODE = 0o400  # the DaemonSet's defaultMode (tests/deploy checks it)


class SecretVolume:
    """kubelet's layout: `..<timestamp>/` with the files, `..data` -> it, one link per key."""

    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self.generation = 0
        mount.mkdir()

    def publish(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        data = self.mount / f"..2026_01_01_00_00_{self.generation:02d}.000000001"
        data.mkdir(mode=0o755)
        for name, content in files.items():
            (data / name).write_bytes(content)
            (data / name).chmod(SECRET_MODE)
        tmp = self.mount / "..data_tmp"
        tmp.symlink_to(data.name)
        os.rename(tmp, self.mount / "..data")  # the atomic switch
        for name in files:
            link = self.mount / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")
        for old in self.mount.glob("..2026_*"):
            if old != data:
                shutil.rmtree(old)

    @property
    def key_dir(self) -> Path:
        return self.mount / "..data"


def read_dir(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir()}


def test_secret_update_is_picked_up_without_a_signal(world: World, tmp_path: Path) -> None:
    staging = tmp_path / "fhmon-keys"  # the operator's local copy (docs/deploy.md)
    old = f"{signing.keygen(staging):08x}"
    volume = SecretVolume(tmp_path / "etc-fhmon-keys")
    volume.publish(read_dir(staging))
    with Service(world.base, [str(world.shares / "*")], name="secret-rotation",
                 key_dir=volume.key_dir) as service:
        agent = Agent(world, "fhmon", world.main, service.socket)
        try:
            before = signed_handle_args(agent, "file")
            assert key_id_of(before) == old
            # 2. a verify-only key, published
            new = f"{signing.keygen(staging, make_signer=False):08x}"
            volume.publish(read_dir(staging))
            assert wait_until(lambda: len(service.status()["keys"]) == 2, timeout=10), \
                service.status()
            # the signer is still the old key
            assert key_id_of(signed_handle_args(agent, "file")) == old
            # 3. the new key signs, published
            signing.set_signer(staging, int(new, 16))
            volume.publish(read_dir(staging))
            assert wait_until(lambda: key_id_of(signed_handle_args(agent, "file")) == new,
                              timeout=10)
            assert agent.call("obh", **before)["errno"] == 0  # old handles still verify
            # 4. the old key retired, published
            signing.retire(staging, int(old, 16))
            volume.publish(read_dir(staging))
            assert wait_until(lambda: len(service.status()["keys"]) == 1, timeout=10)
            assert agent.call("obh", **before)["errno"] != 0  # ESTALE: its key is gone
            assert agent.call("obh", **signed_handle_args(agent, "file"))["errno"] == 0
            reloads = [e for e in service.events() if e.get("event") == "keys_reloaded"]
            assert len(reloads) >= 3, reloads
            assert not any(e.get("event") == "keys_reload_failed" for e in service.events())
            assert service.proc is not None and service.proc.poll() is None  # never restarted
        finally:
            agent.close()
