"""docs/deploy.md agrees with the manifests: the names it uses, the capability lists, and
the documented key set-up and rotation, run.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.checks import CAPABILITIES, KEY_SECRET, SECRET_DATA
from tests.deploy.flags import ds_socket, serve_flags
from tests.deploy.render import BASE, CONTAINERFILE, DOCS, REPO, SERVICE_UNIT
from tests.deploy.steps import doc_block, secret_volume_layout


def test_docs_name_the_real_things(
    daemonset: dict[str, Any], unit: configparser.ConfigParser
) -> None:
    text = DOCS.read_text()
    assert "kubectl apply -k deploy/base" in text
    assert f"kubectl create secret generic {KEY_SECRET}" in text
    assert "fhmon keygen --key-dir" in text
    assert ds_socket(daemonset) in text
    unit_socket = serve_flags(shlex.split(unit["Service"]["ExecStart"])[1:])[0]["--socket"][0]
    assert unit_socket in text
    assert "deploy/systemd/fhmon.service" in text


def documented_capability_sets() -> dict[str, set[str]]:
    """Every place that lists fhmon's capabilities, as CAP_ names."""
    from monitor import check, hardening

    ds = yaml.safe_load((BASE / "daemonset.yaml").read_text())
    spec = ds["spec"]["template"]["spec"]
    sets = {"monitor/hardening.py KEPT": set(hardening.KEPT.values()),
            "monitor/check.py CAPS": set(check.CAPS)}
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        add = c.get("securityContext", {}).get("capabilities", {}).get("add")
        if add:
            sets[f"daemonset.yaml {c['name']}"] = {f"CAP_{a}" for a in add}
    unit_text = SERVICE_UNIT.read_text()
    (bounding,) = re.findall(r"(?m)^CapabilityBoundingSet=(.*)$", unit_text)
    sets["fhmon.service CapabilityBoundingSet"] = set(bounding.split())
    sets["fhmon.service comment"] = set(re.findall(r"(?m)^#\s+(CAP_[A-Z_]+)\s", unit_text))
    names = "|".join(sorted({n.removeprefix("CAP_") for n in hardening.KEPT.values()}
                            | {"CHOWN", "DAC_OVERRIDE", "SYS_ADMIN", "FOWNER"}))
    cf = re.search(r"capabilities fhmon needs \(([^)]*)\)", CONTAINERFILE.read_text())
    assert cf, "the Containerfile no longer says which capabilities fhmon needs"
    sets["Containerfile comment"] = {f"CAP_{n}" for n in re.findall(names, cf.group(1))}
    for doc in ("deploy.md", "operations.md"):
        text = (REPO / "docs" / doc).read_text()
        for para in re.split(r"\n\s*\n", text):
            if re.search(r"(capabilities|bounding set|keeps only)", para, re.I):
                found = set(re.findall(r"CAP_(?:" + names + r")\b", para))
                if len(found) >= 3:  # a paragraph that lists them
                    sets[f"docs/{doc}: {para.strip()[:40]}..."] = found
    return sets


def test_every_capability_list_is_the_same() -> None:
    sets = documented_capability_sets()
    expected = {"CAP_DAC_READ_SEARCH", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
                "CAP_SYS_PTRACE"}
    assert {f"CAP_{c}" for c in CAPABILITIES} == expected
    assert sum(1 for name in sets if name.startswith("docs/deploy.md")) >= 2
    wrong = {name: sorted(found) for name, found in sets.items() if found != expected}
    assert not wrong, wrong


def fake_cluster(tmp_path: Path) -> dict[str, str]:
    """PATH with a `kubectl` that keeps one Secret in a file: create/replace store it, get
    renders it with the real kubectl's go-template (offline, through create --dry-run)."""
    real = shutil.which("kubectl")
    if real is None:
        pytest.skip("kubectl is not installed")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    store = tmp_path / "secret.yaml"
    script = bindir / "kubectl"
    script.write_text(f'''#!{sys.executable}
import base64, os, subprocess, sys, tempfile, yaml
REAL, STORE = {str(real)!r}, {str(store)!r}
args = sys.argv[1:]
if args[:2] == ["replace", "-f"] and args[2] == "-":
    open(STORE, "w").write(sys.stdin.read()); sys.exit(0)
if args[:2] == ["create", "secret"] and "--dry-run=client" not in args:
    out = subprocess.run([REAL, *args, "--dry-run=client", "-o", "yaml"], check=True,
                         capture_output=True, text=True).stdout
    open(STORE, "w").write(out); sys.exit(0)
if args[:4] == ["-n", "kubevirt", "get", "secret"] and args[4] == "fhmon-keys":
    data = yaml.safe_load(open(STORE))["data"]
    with tempfile.TemporaryDirectory() as d:
        for name, value in data.items():
            open(os.path.join(d, name), "wb").write(base64.b64decode(value))
        os.execv(REAL, [REAL, "create", "secret", "generic", "fhmon-keys", "-n", "kubevirt",
                        f"--from-file={{d}}/", "--dry-run=client", *args[5:]])
os.execv(REAL, [REAL, *args])
''')
    script.chmod(0o755)
    fhmon_bin = Path(sys.executable).parent
    return {**os.environ, "PATH": f"{bindir}:{fhmon_bin}:/usr/bin:/bin", "STORE": str(store)}


def test_documented_key_setup_and_rotation_run(tmp_path: Path) -> None:
    """docs/deploy.md's commands, run as written against a one-Secret fake cluster."""
    from monitor import signing

    env = fake_cluster(tmp_path)
    setup = doc_block("2. Create the signing keys once")
    setup = "\n".join(line.strip() for line in setup.splitlines())
    rotation = doc_block("### Key rotation")
    keygen = "fhmon keygen --no-sign --key-dir ./fhmon-keys"
    assert rotation.count(keygen) == 1 and rotation.count("OLDID") == 1
    rotation = rotation.replace(keygen, f"NEWID=$({keygen})")
    rotation = rotation.replace("NEWID --key-dir", '"$NEWID" --key-dir')
    rotation = rotation.replace("retire OLDID", 'retire "$OLDID"')
    script = ("set -euo pipefail\n" + setup
              + '\nOLDID=$(python3 -c "import yaml,base64,os; print(base64.b64decode('
              "yaml.safe_load(open(os.environ['STORE']))['data']['signing-key-id'])"
              '.decode().strip())")\n' + rotation
              + '\necho "old=$OLDID new=$NEWID"\n')
    res = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    old, new = re.findall(r"old=(\w+) new=(\w+)", res.stdout)[0]
    assert old != new
    assert not (tmp_path / "fhmon-keys").exists()  # the docs remove the local copy again
    secret = yaml.safe_load((tmp_path / "secret.yaml").read_text())
    volume = tmp_path / "volume"
    files = {name: __import__("base64").b64decode(v) for name, v in secret["data"].items()}
    secret_volume_layout(volume, files, 0o400)
    ring = signing.KeyRing.load(volume / SECRET_DATA)
    assert ring.key_ids == (int(new, 16),) and ring.signer == int(new, 16)
    assert f"{old}.key" not in secret["data"]
