"""The wheel is whole (issue 36.3): `pip install` of a fresh clone, and of its sdist, alone
gives an `fhmon launch` and an `fhmon install-launcher` that work, with nothing built before.

Each install goes into a new venv from a copy of the checkout's files as git knows them (what
a fresh clone holds, no build output), with pip's build isolation: maturin is fetched, the
build backend (build_backend/fhmon_build.py) builds the launcher and the extension. Then that
venv's own `fhmon serve` serves a target started by that venv's `fhmon launch`, and by the
launcher `fhmon install-launcher` copied out, as uid 65534 under the real filter: a handle is
signed, and opened again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitor.launcher import INSTALLED_NAME
from tests.support import Agent, Service, World
from tests.support.handles import N2HResult
from tests.support.world import NOBODY, REPO

# pip's own output and a fresh build of both Rust artifacts: ~30 s each on 2 cores
INSTALL_TIMEOUT = 1200


def fresh_clone(dest: Path) -> Path:
    """The files a fresh clone of this checkout has (tracked and new, not ignored ones)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if not source.is_file() and not source.is_symlink():
            continue  # deleted in the work tree, not yet in the index
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / name, follow_symlinks=False)
    assert not (dest / "monitor" / "_bin").exists() and not (dest / "native" / "target").exists()
    return dest


def clean_env() -> dict[str, str]:
    """The environment without this venv's traces: no development build flags, no path to the
    checkout's packages (an install must stand on its own)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MATURIN_PEP517_ARGS", "CARGO_TARGET_DIR")}
    cargo_bin = Path(env.get("CARGO_HOME", Path.home() / ".cargo")) / "bin"
    env["PATH"] = os.pathsep.join([str(cargo_bin), env.get("PATH", "/usr/bin:/bin")])
    return env


def new_venv_with(where: Path, requirement: str) -> Path:
    """A new venv in `where` with `pip install requirement` done; its `fhmon`."""
    venv.create(where, with_pip=True)
    pip = subprocess.run([str(where / "bin" / "pip"), "install", "--disable-pip-version-check",
                          requirement], cwd=where, env=clean_env(), capture_output=True,
                         text=True, timeout=INSTALL_TIMEOUT)
    assert pip.returncode == 0, (
        f"pip install {requirement}:\n{pip.stdout[-3000:]}\n{pip.stderr[-6000:]}")
    return where / "bin" / "fhmon"


def handle_round_trip(world: World, fhmon: Path, launcher: list[str]) -> None:
    """`fhmon serve` of this install serves a target `launcher` started: sign, then open."""
    with Service(world.base, [str(world.shares / "*")], name=f"wheel-{fhmon.parent.parent.name}",
                 command=str(fhmon)) as service:
        agent = Agent(world, "fhmon", world.main, service.socket, launcher=launcher)
        try:
            assert os.stat(f"/proc/{agent.pid}").st_uid == NOBODY  # the launcher's --user
            signed = N2HResult.of(agent.call("n2h", path="file"))
            assert signed.ret == 0 and signed.errno == 0, signed
            opened = agent.call("obh", f_handle=signed.f_handle.hex(),
                                handle_type=signed.handle_type)
            assert opened["errno"] == 0, opened
            assert bytes.fromhex(opened["head"]) == b"main file\n"
            status = service.status()
            assert status["targets"], status
        finally:
            agent.close()


def check_install(fhmon: Path, world: World) -> None:
    site = subprocess.run([str(fhmon.with_name("python")), "-c",
                           "import monitor, sys; sys.stdout.write(monitor.__file__)"],
                          capture_output=True, text=True, cwd="/", env=clean_env())
    assert site.returncode == 0 and "site-packages" in site.stdout, site
    # the venv's own `fhmon launch` (it execs the launcher the wheel put beside monitor/)
    handle_round_trip(world, fhmon, [str(fhmon), "launch"])
    # `fhmon install-launcher` writes the launcher alone, which runs on its own
    pod_dir = world.base / f"launcher-{fhmon.parent.parent.name}"
    install = subprocess.run([str(fhmon), "install-launcher", str(pod_dir)], cwd="/",
                             env=clean_env(), capture_output=True, text=True, timeout=60)
    assert install.returncode == 0, install.stderr
    assert sorted(p.name for p in pod_dir.iterdir()) == [INSTALLED_NAME]
    pod_dir.chmod(0o755)
    handle_round_trip(world, fhmon, [str(pod_dir / INSTALLED_NAME), "launch"])


@pytest.fixture
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh one for each test (an in-tree build leaves monitor/_bin behind)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.fail("the wheel test copies the checkout as git lists it: needs git and .git",
                    pytrace=False)
    yield fresh_clone(tmp_path_factory.mktemp("clone"))


def test_pip_install_of_the_clone(clone: Path, world: World,
                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    fhmon = new_venv_with(tmp_path_factory.mktemp("venv-dir"), str(clone))
    check_install(fhmon, world)


def test_pip_install_of_its_sdist(clone: Path, world: World,
                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path_factory.mktemp("sdist")
    built = subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out),
                            str(clone)], env=clean_env(), capture_output=True, text=True,
                           timeout=INSTALL_TIMEOUT)
    assert built.returncode == 0, f"{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
    (sdist,) = out.glob("fhmon-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
        top = tar.getnames()[0].split("/", 1)[0]
        manifest = tar.extractfile(f"{top}/native/Cargo.toml").read().decode()  # type: ignore[union-attr]
    assert {"native/launcher/Cargo.toml", "native/launcher/src/main.rs",
            "scripts/build-launcher.sh", "build_backend/fhmon_build.py"} <= names
    assert not any(name.startswith(("native/target/", "monitor/_bin/")) for name in names)
    assert "[workspace]" in manifest and '"launcher"' in manifest
    fhmon = new_venv_with(tmp_path_factory.mktemp("venv-sdist"), str(sdist))
    check_install(fhmon, world)
