"""The credential switch fhmon makes for every open: the thread's fsuid, fsgid and
effective capabilities inside and after the switch, read back from the kernel.

Each case runs in a fresh root process: capabilities fhmon drops cannot come back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CAP_DAC_READ_SEARCH, CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SYS_PTRACE = 2, 5, 6, 7, 19
NEUTRAL = 1 << CAP_KILL | 1 << CAP_SETGID | 1 << CAP_SETUID | 1 << CAP_SYS_PTRACE

PROBE = """
import json, sys
from monitor import credentials, hardening, linux
from monitor.proc_status import Credentials
if sys.argv[1] == "hardened":
    hardening.drop_capabilities()
creds = Credentials(65534, 65534, (), int(sys.argv[2]))
base = credentials._base()
def now():
    return {"effective": linux.capget_thread()[0], "fsuid": linux.setfsuid(-1),
            "fsgid": linux.setfsgid(-1)}
out = {"fast": base.fsuid_drops_caps, "before": now()}
with credentials.acting_as(creds, reopen_only=sys.argv[3] == "reopen"):
    out["during"] = now()
out["after"] = now()
print(json.dumps(out))
"""


def switch(caps: str, target_caps: int, kind: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", PROBE, caps, str(target_caps), kind],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("kind", ["reopen", "walk"])
def test_hardened_fhmon_acts_with_no_capability_that_opens_files(kind: str) -> None:
    got = switch("hardened", 0, kind)
    assert got["fast"] is True  # this kernel drops the file-system set with the fsuid
    during = got["during"]
    assert (during["fsuid"], during["fsgid"]) == (65534, 65534)
    assert not during["effective"] & 1 << CAP_DAC_READ_SEARCH
    assert during["effective"] & ~NEUTRAL == 0
    if kind == "walk":  # a path walk may consult CAP_SYS_PTRACE: the full switch
        assert during["effective"] == 0
    assert got["after"] == got["before"]
    assert got["before"]["fsuid"] == 0 and got["before"]["effective"] & 1 << CAP_DAC_READ_SEARCH


def test_unhardened_fhmon_keeps_the_full_switch() -> None:
    got = switch("all", 0, "reopen")
    assert got["fast"] is False  # CAP_SYS_ADMIN and others would survive setfsuid
    assert got["during"]["effective"] == 0
    assert got["after"] == got["before"]


def test_a_target_with_capabilities_gets_exactly_its_own() -> None:
    target_caps = 1 << CAP_DAC_READ_SEARCH | 1 << CAP_KILL
    got = switch("hardened", target_caps, "reopen")
    assert got["during"]["effective"] == target_caps
    assert got["after"] == got["before"]
