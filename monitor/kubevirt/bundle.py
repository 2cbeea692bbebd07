"""`fhmon install-launcher DIR`: copy a self-contained `fhmon launch` out of the fhmon image.

The virtiofs containers of virt-launcher pods run KubeVirt's image, which has no Python. The
injected init container (fhmon's image) copies into a shared emptyDir everything the
launcher needs: the dynamic loader, the shared libraries this interpreter has mapped, the
interpreter itself, its standard library and the packages the launcher imports. The
virtiofs container then runs

    DIR/ld.so --library-path DIR/lib DIR/bin/python3 -I -m monitor.kubevirt.bundled launch ...

Nothing it loads comes from the container's own filesystem, and nothing leaks into
virtiofsd: --library-path is the loader's argument, not an environment variable, so the
exec'ed virtiofsd uses its own image's libraries. `-I` makes CPython find its prefix from
DIR/bin/python3 (the landmark DIR/lib/pythonX.Y/os.py) and ignore PYTHON* variables.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Parts of the standard library the launcher never needs (the build configuration alone is
# 25 MB on Debian).
_SKIP_STDLIB = frozenset({
    "site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo",
    "ensurepip", "lib2to3", "pydoc_data", "distutils", "venv", "__phello__",
})
# Loaded by glibc only when needed (thread cancellation): not in /proc/self/maps yet.
_LATE_LIBRARIES = ("libgcc_s.so.1",)
# Site hooks of the installing environment (setuptools, editable installs): not the launcher's.
_NOT_FOR_THE_LAUNCHER = frozenset({"__main__", "sitecustomize", "usercustomize",
                                   "_distutils_hack"})
ENTRY_MODULE = "monitor.kubevirt.bundled"


class BundleError(Exception):
    """The launcher could not be copied; the message says what is missing."""


@dataclass(frozen=True, slots=True)
class Bundle:
    root: Path
    libraries: tuple[str, ...]
    packages: tuple[str, ...]
    size: int


def python_subdir() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}"


def install_launcher(dest: str | os.PathLike[str]) -> Bundle:
    """Fill `dest` (created or emptied) with the launcher; returns what went in.

    The copy runs in a fresh interpreter that has imported only the launcher, so that
    /proc/self/maps and sys.modules name what the launcher needs and nothing the caller
    (the whole `fhmon` command line, cryptography...) happened to load.
    """
    proc = subprocess.run([sys.executable, "-m", __name__, os.fspath(dest)],
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise BundleError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip()
                          else f"exit status {proc.returncode}")
    made = json.loads(proc.stdout)
    return Bundle(Path(made["root"]), tuple(made["libraries"]), tuple(made["packages"]),
                  int(made["size"]))


def _install_here(dest: str | os.PathLike[str]) -> Bundle:
    importlib.import_module(ENTRY_MODULE)  # everything the launcher imports is now loaded
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    for entry in root.iterdir():  # an init container that runs again starts clean
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    stdlib = Path(os.__file__).resolve().parent
    lib = root / "lib"
    target_stdlib = lib / python_subdir()
    _copy_tree(stdlib, target_stdlib, skip=_SKIP_STDLIB)
    dynload = _lib_dynload(stdlib)
    if dynload is not None and not (target_stdlib / "lib-dynload").exists():
        _copy_tree(dynload, target_stdlib / "lib-dynload", skip=frozenset())
    packages = _copy_packages(stdlib, dynload, target_stdlib)
    loader, libraries = _mapped_libraries()
    for path in libraries:
        shutil.copy2(path, lib / path.name)
        for alias in _aliases(path):  # the loader asks for the soname: libz.so.1, not 1.2.13
            if not (lib / alias).exists():
                os.symlink(path.name, lib / alias)
    (root / "bin").mkdir()
    shutil.copy2(Path(sys.executable).resolve(), root / "bin" / "python3")
    shutil.copy2(loader, root / "ld.so")
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return Bundle(root, tuple(sorted(p.name for p in libraries)), packages, size)


def _lib_dynload(stdlib: Path) -> Path | None:
    for entry in sys.path:
        if entry.endswith("lib-dynload") and os.path.isdir(entry):
            return Path(entry).resolve()
    candidate = stdlib / "lib-dynload"
    return candidate if candidate.is_dir() else None


def _copy_tree(source: Path, target: Path, skip: frozenset[str]) -> None:
    def ignore(directory: str, names: list[str]) -> set[str]:
        if Path(directory) == source:
            return {n for n in names if n in skip or n.startswith("config-")}
        return set()

    shutil.copytree(source, target, ignore=ignore, symlinks=False)


def _copy_packages(stdlib: Path, dynload: Path | None, target: Path) -> tuple[str, ...]:
    """Copy every loaded top-level module from outside the standard library into `target`
    (which is on the bundled interpreter's sys.path)."""
    copied: list[str] = []
    for name, module in sorted(sys.modules.items()):
        if "." in name or module is None or name in _NOT_FOR_THE_LAUNCHER:
            continue
        if name.startswith("__editable__"):
            continue
        paths = list(getattr(module, "__path__", []) or [])
        file = getattr(module, "__file__", None)
        origin = Path(paths[0]) if paths else (Path(file) if isinstance(file, str) else None)
        if origin is None or not origin.exists():
            continue  # built in, or a namespace without files
        origin = origin.resolve()
        inside_stdlib = origin.is_relative_to(stdlib) and not any(
            part in ("site-packages", "dist-packages") for part in origin.relative_to(stdlib).parts)
        if inside_stdlib or (dynload is not None and origin.is_relative_to(dynload)):
            continue
        if origin.is_dir():
            shutil.copytree(origin, target / origin.name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("tests"))
        else:
            shutil.copy2(origin, target / origin.name)
        copied.append(name)
    return tuple(copied)


def _aliases(path: Path) -> list[str]:
    """Names in the library's directory that are symlinks to it (its soname among them)."""
    stem = path.name.split(".so", 1)[0] + ".so"
    return sorted(p.name for p in path.parent.glob(stem + "*")
                  if p.is_symlink() and p.resolve() == path.resolve())


def _mapped_libraries() -> tuple[Path, list[Path]]:
    """The dynamic loader and every shared library mapped into this process."""
    loader: Path | None = None
    found: dict[str, Path] = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) < 6 or not fields[5].startswith("/"):
                continue
            path = Path(fields[5].strip())
            if ".so" not in path.name or not path.exists():
                continue
            if path.name.startswith(("ld-linux", "ld64")):
                loader = path
            elif "cpython-" not in path.name and ".abi3." not in path.name:
                # Extension modules travel with their packages; the rest are libraries.
                found.setdefault(path.name, path)
    if loader is None:
        raise BundleError("no dynamic loader in /proc/self/maps (a static interpreter?)")
    libc = found.get("libc.so.6")
    for name in _LATE_LIBRARIES:
        if libc is not None and name not in found and (libc.parent / name).exists():
            found[name] = libc.parent / name
    return loader, sorted(found.values())


if __name__ == "__main__":
    bundle = _install_here(sys.argv[1])
    print(json.dumps({"root": str(bundle.root), "libraries": bundle.libraries,
                      "packages": bundle.packages, "size": bundle.size}))
