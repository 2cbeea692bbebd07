"""The container image: the Containerfile's recipe, the .dockerignore, the base pinned by
digest and the dependencies locked with hashes, and the install steps run for real.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.flags import ds_flags
from tests.deploy.render import CONTAINERFILE, DEPLOY, REPO
from tests.deploy.steps import rust_build_env


def containerfile_instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        out.append((op.upper(), rest.strip()))
    return out


def test_containerfile(daemonset: dict[str, Any]) -> None:
    instructions = containerfile_instructions(CONTAINERFILE.read_text())
    assert instructions[0][0] == "FROM"
    froms = [rest.split()[0] for op, rest in instructions if op == "FROM"]
    digest = r"@sha256:[0-9a-f]{64}"
    allowed = rf"(python:3\.1[1-9]-slim-bookworm|debian:bookworm-slim){digest}"
    # the build stage may start from the Rust image (the data plane is a Rust extension) ...
    assert froms and all(re.fullmatch(allowed, f)
                         or re.fullmatch(rf"rust:1\.\d+-slim-bookworm{digest}", f)
                         for f in froms[:-1])
    assert re.fullmatch(allowed, froms[-1])
    # ... but the image that ships carries no toolchain: it only installs the built wheels
    last = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    shipped = " ; ".join(rest for _, rest in instructions[last:])
    assert not re.search(r"\b(cargo|rustc|rustup|maturin|gcc)\b", shipped), shipped
    ops = dict(instructions)  # last one of each wins, as in the image
    assert json.loads(ops["ENTRYPOINT"]) == ["fhmon"]
    cmd = json.loads(ops["CMD"])
    assert cmd[:1] == ["serve"]
    assert cmd[1:] == ["--config", ds_flags(daemonset)["--config"][0]]
    runs = " ; ".join(rest for op, rest in instructions if op == "RUN")
    assert re.search(r"apt-get install .*\blibseccomp2\b", runs)
    assert re.search(r"pip (install|wheel) .*(\.|/wheels/\*\.whl)(\s|$)", runs)
    for op, rest in instructions:
        assert not re.search(r"(curl|wget)[^|;&]*\|\s*(ba|z)?sh\b", rest), rest
        assert not (op == "ADD" and re.search(r"https?://", rest)), rest


def test_dockerignore_excludes_local_state() -> None:
    patterns = (REPO / ".dockerignore").read_text().split()
    assert ".git" in patterns and ".venv" in patterns


LOCK = DEPLOY / "requirements.lock"


def lock_entries(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a pip-compile --generate-hashes file."""
    joined = re.sub(r"\\\n", " ", text)
    out = {}
    for line in joined.splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        spec, *options = line.split()
        name, _, version = spec.partition("==")
        hashes = [o.removeprefix("--hash=sha256:") for o in options
                  if o.startswith("--hash=sha256:")]
        out[re.sub(r"[-_.]+", "-", name).lower()] = (version, hashes)
    return out


def check_locked_image(containerfile: str, lock: str, pyproject: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    instructions = containerfile_instructions(containerfile)
    for op, rest in instructions:
        if op == "FROM" and not re.search(r"@sha256:[0-9a-f]{64}(\s|$)", rest):
            problems.append(f"FROM {rest}: not pinned by digest")
    entries = lock_entries(lock)
    for name, (version, hashes) in entries.items():
        if not re.fullmatch(r"[0-9][0-9A-Za-z.+!]*", version):
            problems.append(f"{name}: not pinned to one version ({version!r})")
        if not hashes or not all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes):
            problems.append(f"{name}: no sha256 hashes")
    for dep in pyproject["project"]["dependencies"]:
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!~ ;\[]", dep, maxsplit=1)[0]).lower()
        if name not in entries:
            problems.append(f"dependency {name} is not in deploy/requirements.lock: run "
                            f"scripts/lock-deps.sh")
    runs = [rest for op, rest in instructions if op == "RUN" and re.search(r"\bpip\b", rest)]
    for run in runs:
        for command in re.split(r"&&|;", run):
            words = command.split()
            if words[:1] != ["pip"] or words[1:2] not in (["install"], ["wheel"]):
                continue
            locked = "--require-hashes" in words and "-r" in words
            own = "--no-deps" in words and (words[-1] == "." or words[-1].startswith(
                "/wheels/fhmon-"))
            if not (locked or own):
                problems.append(f"unlocked install: {command.strip()}")
    return problems


def test_image_is_pinned_and_locked() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert check_locked_image(CONTAINERFILE.read_text(), LOCK.read_text(), pyproject) == []


def test_lock_checks_catch_a_broken_copy() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    cf, lock = CONTAINERFILE.read_text(), LOCK.read_text()
    assert check_locked_image(re.sub(r"@sha256:[0-9a-f]{64}", "", cf, count=1), lock,
                              pyproject)
    assert check_locked_image(cf.replace("--require-hashes", ""), lock, pyproject)
    assert check_locked_image(cf, re.sub(r"(?m)^trio==\S+", "trio>=0.25", lock), pyproject)
    assert check_locked_image(cf, re.sub(r"(?ms)^trio==.*?(?=^\S|\Z)", "", lock), pyproject)
    more = copy.deepcopy(pyproject)
    more["project"]["dependencies"].append("not-locked-anywhere>=0.14")
    assert any("not-locked-anywhere" in p for p in check_locked_image(cf, lock, more))


def test_image_install_steps_run(tmp_path: Path) -> None:
    """The Containerfile's pip steps, run as written with the system Python 3.11 (the
    image's minor version): locked wheels from PyPI, hash-checked, then fhmon."""
    system_python = "/usr/bin/python3"
    if not os.path.exists(system_python):
        pytest.skip("no system python3")
    instructions = containerfile_instructions(CONTAINERFILE.read_text())
    runs = [rest for op, rest in instructions
            if op == "RUN" and re.search(r"\bpip (wheel|install --no-cache-dir --no-index)", rest)]
    assert len(runs) == 2, runs  # the build stage's wheels, then the runtime stage's install
    build_env = {rest.split("=", 1)[0]: rest.split("=", 1)[1].strip('"')
                 for op, rest in instructions if op == "ENV" and "=" in rest}
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
        "target", "results"))
    wheels = tmp_path / "wheels"
    rust = rust_build_env()
    env = {"PATH": f"{rust.pop('CARGO_DIR')}:/usr/bin:/bin", "HOME": str(tmp_path),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", **rust, **build_env}
    for stage, run in zip(("build", "runtime"), runs, strict=True):
        venv = tmp_path / stage
        subprocess.run([system_python, "-m", "venv", str(venv)], check=True)
        script = run.replace("/wheels", str(wheels))
        script = re.sub(r"(^|&&\s*)(/opt/build/bin/)?pip ", rf"\1{venv}/bin/pip ", script)
        res = subprocess.run(["sh", "-ec", script], cwd=source, env=env, capture_output=True,
                             text=True, timeout=900)
        assert res.returncode == 0, f"{stage}: {script}\n{res.stdout[-2000:]}{res.stderr[-3000:]}"
    assert not wheels.exists(), "the runtime step removes /wheels"
    version = subprocess.run([str(tmp_path / "runtime" / "bin" / "fhmon"), "--version"],
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("fhmon "), version
