"""scripts/build-image.sh (the daemonless build) and deploy/Containerfile (the daemon one)
describe the same image: runtime packages, user, entrypoint, command, install paths."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from tests.deploy.flags import ds_flags
from tests.deploy.render import CONTAINERFILE, REPO
from tests.deploy.test_containerfile import containerfile_instructions

BUILD_IMAGE = REPO / "scripts" / "build-image.sh"


def script_settings(text: str) -> dict[str, str]:
    """The NAME=value lines at the top level of build-image.sh."""
    out = {}
    for m in re.finditer(r'(?m)^([A-Z_]+)=("[^"]*"|\S+)$', text):
        out[m.group(1)] = shlex.split(m.group(2))[0] if m.group(2) else ""
    return out


def drift(containerfile: str, script: str) -> list[str]:
    problems: list[str] = []
    instructions = containerfile_instructions(containerfile)
    last = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    runtime = instructions[last:]
    ops = dict(runtime)
    s = script_settings(script)
    packages = set(s.get("PACKAGES", "").split())
    runs = " ; ".join(rest for op, rest in runtime if op == "RUN")
    for m in re.finditer(r"apt-get install ((?:\S+ ?)+)", runs):
        for pkg in m.group(1).split():
            if pkg.startswith("-") or pkg in ("&&",):
                continue
            if pkg not in packages:
                problems.append(f"{pkg}: installed by the Containerfile, not by build-image.sh")
    if not {"python3", "libseccomp2"} <= packages:
        problems.append(f"build-image.sh lacks python3 or libseccomp2: {sorted(packages)}")
    if "bookworm" not in ops.get("FROM", "") or s.get("SUITE") != "bookworm":
        problems.append("not both Debian bookworm")
    if ops.get("USER") != s.get("IMAGE_USER"):
        problems.append(f"USER {ops.get('USER')} != {s.get('IMAGE_USER')}")
    if json.loads(ops.get("ENTRYPOINT", "[]")) != [s.get("ENTRYPOINT")]:
        problems.append(f"ENTRYPOINT {ops.get('ENTRYPOINT')} != {s.get('ENTRYPOINT')}")
    if json.loads(ops.get("CMD", "[]")) != s.get("CMD", "").split():
        problems.append(f"CMD {ops.get('CMD')} != {s.get('CMD')}")
    seccomp = [rest.split()[-1].rstrip("/") for op, rest in runtime
               if op == "COPY" and "seccomp" in rest]
    if seccomp != [s.get("SECCOMP_DIR")]:
        problems.append(f"seccomp profiles at {seccomp}, build-image.sh {s.get('SECCOMP_DIR')}")
    return problems


def test_build_image_matches_containerfile(daemonset: dict[str, Any]) -> None:
    script = BUILD_IMAGE.read_text()
    assert drift(CONTAINERFILE.read_text(), script) == []
    # the command both give is the DaemonSet's config path
    cmd = script_settings(script)["CMD"].split()
    assert cmd[:2] == ["serve", "--config"]
    assert cmd[2:] == ds_flags(daemonset)["--config"]


def test_drift_is_caught() -> None:
    cf, script = CONTAINERFILE.read_text(), BUILD_IMAGE.read_text()
    assert drift(cf.replace("libseccomp2", "libseccomp2 tini"), script)
    assert drift(cf.replace("USER 0", "USER 65534"), script)
    assert drift(cf.replace('ENTRYPOINT ["fhmon"]', 'ENTRYPOINT ["fhmon2"]'), script)
    assert drift(cf, script.replace('CMD="serve', 'CMD="keeper'))
    assert drift(cf, script.replace("/usr/share/fhmon/seccomp", "/usr/share/seccomp"))
