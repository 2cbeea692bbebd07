"""tests/support/runc.py cleans up after a test that fails half-way: a running container is
killed and deleted, the image's mounts are gone, the run's folder is removed."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from monitor.kubevirt import containers, inject
from tests.support import cri_spec, runc
from tests.support.kubevirt import LAUNCHER_POD

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runc and mounts need root")


def test_close_kills_the_container_and_unmounts_the_image(tmp_path: Path) -> None:
    pod = yaml.safe_load(inject.inject(LAUNCHER_POD, containers.Settings()))
    virtiofs = cri_spec.find_container(pod, "virtiofs-data")
    virtiofs["command"], virtiofs["args"] = ["/usr/bin/sleep"], ["600"]
    for name in ("vc", "data", "launcher"):
        (tmp_path / name).mkdir()
    rt = runc.Runtime()
    root = rt.rootfs("virtiofs", runc.Image(usr_files={"libexec/marker": ("x", 0o644)},
                                            binds=[str(tmp_path / "launcher")]))
    assert (root / "usr" / "libexec" / "marker").read_text() == "x"   # the overlay layer
    assert (root / "usr" / "bin" / "sleep").exists()                    # the host's /usr
    context = cri_spec.NodeContext(rootfs=str(root), volume_paths={
        "virtiofs-containers": str(tmp_path / "vc"), "data": str(tmp_path / "data"),
        containers.LAUNCHER_VOLUME: str(tmp_path / "launcher")})
    container_id, bundle = rt.bundle("virtiofs", cri_spec.translate(pod, "virtiofs-data",
                                                                    context))
    proc = subprocess.Popen(rt.run_argv(container_id, bundle), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while (state := rt.state_of(container_id)) is None or state["status"] != "running":
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        pid = int(state["pid"])
        assert Path(f"/proc/{pid}/cmdline").read_bytes() == b"/usr/bin/sleep\x00600\x00"
        # The test fails here: close() must undo everything anyway.
        assert rt.mounts_made() >= 3
    finally:
        leftovers = rt.close()
        proc.wait(30)
    assert leftovers == [f"container {container_id} still existed"]
    assert runc.mounts_under(rt.base) == [] and not rt.base.exists()
    assert rt.runc_processes() == [] and proc.returncode is not None
    assert not os.path.exists(f"/proc/{pid}") or b"Z" in Path(f"/proc/{pid}/stat").read_bytes()
