"""Runs containers of a pod under Debian's runc, from configs made by cri_spec.translate.

Why a runner of its own: the e2e tests need what the kubelet, containerd and a snapshotter do
around runc -- a root filesystem for the container's image, a bundle, a container id, runc's
state -- and all of it must be gone after the test even when it fails, on a machine where other
runs do the same at once.  So every run gets its own directory (bundles, root filesystems) and
its own runc state root (--root), container ids are unique, and close() kills and deletes every
container it created, unmounts every mount it made and removes the directory only once nothing
is mounted under it any more.

The images: the virt-launcher and fhmon images are not available here, so an image is the
host's /usr (read-only; a bind, or an overlay when the image adds files to /usr, such as
KubeVirt's /usr/libexec/virtiofsd), the usual /bin, /lib, /sbin links into it, the host's
/etc (read-only), and read-only binds of host directories the image needs at the same path (the
e2e environment's virtiofsd, the checkout and virtualenv that are fhmon's "image").  Those are
mounted on the host before runc runs, as a snapshotter mounts an image's layers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUNC = "/usr/sbin/runc"
SECCOMP_DATA = Path(__file__).resolve().parents[1] / "data" / "seccomp"
RUNTIME_DEFAULT = "containerd-runtime-default-amd64.json"


def runtime_default(caps: Any) -> dict[str, Any]:
    """containerd's RuntimeDefault, as tests/data/seccomp renders it for a container without
    capabilities (every container these tests run that asks for it drops ALL): the
    NodeContext.runtime_default of their cri_spec translations."""
    from tests.support import cri_spec

    if list(caps):
        raise cri_spec.TranslationError(f"no rendering of RuntimeDefault for {list(caps)}")
    return cri_spec.decode_linux_seccomp((SECCOMP_DATA / RUNTIME_DEFAULT).read_bytes())


class RuncError(RuntimeError):
    """runc or a mount failed; the message carries its output."""


@dataclass(frozen=True)
class Image:
    """A container image made from the host: /usr, extra files in /usr, read-only binds."""

    usr_files: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # path under /usr
    binds: Sequence[str] = ()   # host paths shown at the same path, read-only


def _run(argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _mount(argv: Sequence[str]) -> None:
    done = _run(["mount", *argv])
    if done.returncode != 0:
        raise RuncError(f"mount {' '.join(argv)}: {done.stderr.strip()}")


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below path, from this process's mountinfo."""
    prefix = str(path).rstrip("/") + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(path) or point.startswith(prefix):
            found.append(point)
    return found


class Runtime:
    """Images, bundles and containers of one test; close() undoes all of it."""

    def __init__(self, parent: Path | None = None) -> None:
        if not os.access(RUNC, os.X_OK):
            raise RuncError(f"{RUNC} is missing: scripts/setup.sh installs Debian's runc")
        parent = parent or Path(os.environ.get("FHMON_E2E_TMP", "/tmp"))
        self.base = Path(tempfile.mkdtemp(prefix="fhmon-runc-", dir=parent))
        self.base.chmod(0o711)
        self.state = self.base / "state"        # runc --root: private to this run
        self.state.mkdir(mode=0o700)
        self.mounts: list[Path] = []
        self.containers: list[str] = []

    # ---- the snapshotter's part

    def rootfs(self, name: str, image: Image) -> Path:
        """Mounts image at a new root directory; every host-side mount is read-only."""
        root = self.base / name / "rootfs"
        root.mkdir(parents=True)
        root.chmod(0o755)
        for link in ("bin", "lib", "lib64", "sbin"):
            (root / link).symlink_to(f"usr/{link}")
        for d in ("usr", "etc", "tmp", "var", "run"):
            (root / d).mkdir()
        (root / "tmp").chmod(0o1777)
        # The host's /etc, as the image's: Debian's python3 links files there
        # (sitecustomize.py), and without ld.so.cache ctypes' find_library (trio calls it at
        # import) falls back to gcc and a temporary file, which a read-only root refuses.
        self._bind_readonly("/etc", root / "etc")
        usr = root / "usr"
        if image.usr_files:
            layer = self.base / name / "usr-layer"
            for path, (text, mode) in image.usr_files.items():
                target = layer / path.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
                target.chmod(mode)
            # Two lower layers and no upper one: a read-only overlay.
            self._mounted(usr, ["-t", "overlay", "overlay", "-o",
                                f"lowerdir={layer}:/usr", str(usr)])
        else:
            self._bind_readonly("/usr", usr)
        for host in image.binds:
            target = root / host.lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            self._bind_readonly(host, target)
        return root

    def _bind_readonly(self, source: str, target: Path) -> None:
        self._mounted(target, ["--bind", source, str(target)])
        _mount(["-o", "remount,bind,ro", str(target)])

    def _mounted(self, target: Path, argv: Sequence[str]) -> None:
        _mount(argv)
        self.mounts.append(target)

    # ---- containerd's part

    def bundle(self, name: str, config: Mapping[str, Any]) -> tuple[str, Path]:
        """Writes config.json next to the rootfs; returns a fresh container id and the bundle."""
        bundle = self.base / name
        (bundle / "config.json").write_text(json.dumps(config, indent=1))
        container_id = f"fhmon-e2e-{name}-{uuid.uuid4().hex[:12]}"
        return container_id, bundle

    def run_argv(self, container_id: str, bundle: Path) -> list[str]:
        """runc run in the foreground: create + start, waits, deletes the container at exit;
        its exit status is the container's. Registered for close() before anything starts."""
        self.containers.append(container_id)
        return [RUNC, "--root", str(self.state), "run", "--bundle", str(bundle), container_id]

    def run(self, container_id: str, bundle: Path, timeout: float = 300
            ) -> subprocess.CompletedProcess[str]:
        """Runs a container to completion (an init container); output captured."""
        return _run(self.run_argv(container_id, bundle), timeout=timeout)

    def runc_processes(self) -> list[int]:
        """Live runc processes of this run (their command line names its private --root)."""
        needle = f"\0--root\0{self.state}\0".encode()
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                    stat = Path(f"/proc/{entry}/stat").read_bytes()
                    if needle in b"\0" + cmdline and stat.rsplit(b")", 1)[1].split()[0] != b"Z":
                        found.append(int(entry))
        return found

    def mounts_made(self) -> int:
        """How many host-side mounts the images of this run hold now."""
        return len(mounts_under(self.base))

    def state_of(self, container_id: str) -> dict[str, Any] | None:
        done = _run([RUNC, "--root", str(self.state), "state", container_id])
        if done.returncode != 0:
            return None
        state: dict[str, Any] = json.loads(done.stdout)
        return state

    def close(self) -> list[str]:
        """Kills and deletes every container, unmounts, removes the run's directory.

        Returns what had to be cleaned up forcibly (containers still there), for the test to
        report; raises when a mount cannot be removed (then nothing is deleted under it).
        """
        leftovers = []
        for container_id in reversed(self.containers):
            if self.state_of(container_id) is not None:
                leftovers.append(f"container {container_id} still existed")
                _run([RUNC, "--root", str(self.state), "kill", container_id, "KILL"])
        # A `runc run` still waiting for its container ends once the container is gone; one
        # that does not is killed (it would recreate the state root after it is removed).
        deadline = time.monotonic() + 10
        while (runcs := self.runc_processes()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in runcs:
            leftovers.append(f"runc process {pid} still running")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for container_id in reversed(self.containers):
            _run([RUNC, "--root", str(self.state), "delete", "--force", container_id])
        for target in reversed(self.mounts):
            _run(["umount", "--lazy", str(target)])
        left = mounts_under(self.base)
        if left:
            raise RuncError(f"still mounted under {self.base}: {left}")
        shutil.rmtree(self.base, ignore_errors=True)
        return leftovers


@contextlib.contextmanager
def runtime() -> Iterator[Runtime]:
    """A Runtime closed on exit, even when the test fails."""
    rt = Runtime()
    try:
        yield rt
    finally:
        rt.close()
