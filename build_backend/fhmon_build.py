"""fhmon's PEP 517 build backend: maturin's, plus the native launcher.

maturin builds one Rust artifact into a wheel, the extension monitor._native. fhmon's wheel
ships a second one, the static executable `fhmon-launch` (native/launcher) that `fhmon launch`
execs and `fhmon install-launcher` copies into KubeVirt's pods, so a plain `pip install .`
must build it too. This backend builds it first (scripts/build-launcher.sh, into
monitor/_bin/, which pyproject.toml's [tool.maturin] include packs into the wheel) and then
hands over to maturin. Its sdist is maturin's with the cargo workspace put back into
native/Cargo.toml (maturin keeps only the crate it builds; the launcher is a member), so that
the sdist builds the same wheel. docs/architecture.md says why it is done this way.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import maturin

# What maturin does alone: the build's requirements and the wheel's metadata.
get_requires_for_build_wheel = maturin.get_requires_for_build_wheel
get_requires_for_build_editable = maturin.get_requires_for_build_editable
get_requires_for_build_sdist = maturin.get_requires_for_build_sdist
prepare_metadata_for_build_wheel = maturin.prepare_metadata_for_build_wheel
prepare_metadata_for_build_editable = maturin.prepare_metadata_for_build_editable

LAUNCHER_RECIPE = Path("scripts/build-launcher.sh")
WORKSPACE_MANIFEST = "native/Cargo.toml"


def build_launcher() -> None:
    """Build monitor/_bin/fhmon-launch from the source tree (cargo's cache makes a rerun cheap).

    Any failure stops the build: a wheel without its launcher gives an `fhmon launch` that
    cannot run, which is what this backend exists to prevent.
    """
    result = subprocess.run(["bash", str(LAUNCHER_RECIPE)], env=os.environ.copy())
    if result.returncode != 0:
        raise RuntimeError(
            f"fhmon: building the native launcher ({LAUNCHER_RECIPE}) failed with exit status "
            f"{result.returncode}; it needs cargo, rustc >= 1.85 and glibc's static libc "
            "(Debian: libc6-dev)")


def build_wheel(wheel_directory: str, config_settings: Mapping[str, Any] | None = None,
                metadata_directory: str | None = None) -> str:
    build_launcher()
    name: str = maturin.build_wheel(wheel_directory, config_settings, metadata_directory)
    return name


def build_editable(wheel_directory: str, config_settings: Mapping[str, Any] | None = None,
                   metadata_directory: str | None = None) -> str:
    build_launcher()
    name: str = maturin.build_editable(wheel_directory, config_settings, metadata_directory)
    return name


def build_sdist(sdist_directory: str, config_settings: Mapping[str, Any] | None = None) -> str:
    name: str = maturin.build_sdist(sdist_directory, config_settings)
    restore_workspace(Path(sdist_directory) / name, Path(WORKSPACE_MANIFEST).read_bytes())
    return name


def restore_workspace(sdist: Path, manifest: bytes) -> None:
    """Put the source tree's native/Cargo.toml (its [workspace] included) into the sdist.

    Every other member is kept as maturin wrote it (names, modes, times, order).
    """
    with tarfile.open(sdist, "r:gz") as old:
        members = [(info, old.extractfile(info).read() if info.isfile() else None)  # type: ignore[union-attr]
                   for info in old.getmembers()]
    top = members[0][0].name.split("/", 1)[0]
    target = f"{top}/{WORKSPACE_MANIFEST}"
    if not any(info.name == target for info, _ in members):
        raise RuntimeError(f"fhmon: maturin's sdist has no {target}")
    staged = sdist.with_name(sdist.name + ".part")
    with tarfile.open(staged, "w:gz", format=tarfile.PAX_FORMAT) as new:
        for info, data in members:
            if info.name == target:
                data = manifest
                info.size = len(manifest)
            new.addfile(info, io.BytesIO(data) if data is not None else None)
    staged.replace(sdist)
