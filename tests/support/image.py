"""fhmon's image as scripts/build-image.sh builds it (an OCI layout), unpacked as a snapshotter
would, and a node's directories for its pod: what tests/deploy/test_image_runc.py runs, and
the fhmon image of the runc e2e (tests/e2e/test_runc_e2e.py).

The build is cached under build/image (the bootstrap and the wheels: a rerun redoes only
what changed); the unpacked root filesystem lives as long as the test module.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.cri_spec import ImageConfig

REPO = Path(__file__).resolve().parents[2]
BUILD_IMAGE = REPO / "scripts" / "build-image.sh"
IMAGE_DIR = Path(os.environ.get("FHMON_IMAGE_DIR", REPO / "build" / "image"))
TAG = "latest"


@dataclass(frozen=True)
class BuiltImage:
    layout: Path          # the OCI image layout
    config: ImageConfig   # its entrypoint, cmd, env, user, working dir
    seconds: float        # how long the build took here (a cached rerun: seconds)
    compressed_mb: float


def build() -> BuiltImage:
    """Run scripts/build-image.sh (cached); fails with its output if it fails."""
    import time

    start = time.monotonic()
    done = subprocess.run(["bash", str(BUILD_IMAGE), str(IMAGE_DIR)], capture_output=True,
                          text=True, timeout=3000, cwd=REPO)
    took = time.monotonic() - start
    if done.returncode != 0:
        raise AssertionError(f"build-image.sh failed:\n{done.stdout[-4000:]}\n"
                             f"{done.stderr[-4000:]}")
    layout = IMAGE_DIR / "oci"
    size = sum(p.stat().st_size for p in (layout / "blobs").rglob("*") if p.is_file())
    return BuiltImage(layout, image_config(layout), took, round(size / 1e6, 1))


def _blob(layout: Path, digest: str) -> Any:
    algorithm, _, value = digest.partition(":")
    return json.loads((layout / "blobs" / algorithm / value).read_text())


def image_config(layout: Path, tag: str = TAG) -> ImageConfig:
    """The image config of `tag` in the layout (index -> manifest -> config)."""
    index = json.loads((layout / "index.json").read_text())
    (manifest_ref,) = [m for m in index["manifests"]
                       if m.get("annotations", {}).get("org.opencontainers.image.ref.name")
                       == tag]
    manifest = _blob(layout, manifest_ref["digest"])
    config = _blob(layout, manifest["config"]["digest"]).get("config", {})
    return ImageConfig(entrypoint=config.get("Entrypoint") or (), cmd=config.get("Cmd") or (),
                       env=config.get("Env") or (), working_dir=config.get("WorkingDir") or "",
                       user=config.get("User") or "")


def unpack(layout: Path, dest: Path, tag: str = TAG) -> Path:
    """umoci unpack (as root: owners kept); returns the root filesystem."""
    done = subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(dest)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"umoci unpack: {done.stderr}")
    rootfs = dest / "rootfs"
    rootfs.chmod(0o755)
    return rootfs


def secret_volume(root: Path, files: dict[str, bytes], mode: int,
                  group: int | None = None) -> Path:
    """A Secret volume as the kubelet lays it out: NAME -> ..data/NAME, ..data -> a dated
    directory holding the files with the volume's defaultMode (and the pod's fsGroup as
    their group, when it has one)."""
    dated = root / "..2026_12_07_00_00_00.0"
    dated.mkdir(parents=True)
    dated.chmod(0o755)
    for name, data in files.items():
        (dated / name).write_bytes(data)
        (dated / name).chmod(mode)
        if group is not None:
            os.chown(dated / name, 0, group)
    (root / "..data").symlink_to(dated.name)
    for name in files:
        (root / name).symlink_to(f"..data/{name}")
    return root


@contextlib.contextmanager
def unpacked() -> Iterator[tuple[Path, ImageConfig]]:
    """The image built (cached) and unpacked into a fresh directory, for the block."""
    built = build()
    base = Path(tempfile.mkdtemp(prefix="fhmon-image-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield unpack(built.layout, base / "unpacked"), built.config
    finally:
        shutil.rmtree(base, ignore_errors=True)


def fresh_dir(path: Path, mode: int = 0o755) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    path.chmod(mode)
    return path
