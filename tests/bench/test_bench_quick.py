"""Smoke test of the benchmark: `python -m bench.run --quick` runs end to end.

No timing assertions (machines here are shared and noisy): only that every call succeeded
(exit status 0), that the table names every configuration, and that the JSON is written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = ("kernel", "refmon", "fhmon", "fhmon-nosign", "fhmon-nosync")


def test_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = [line.split() for line in proc.stdout.splitlines()]
    seen = {words[4] for words in table if len(words) > 4 and words[0] in ("n2h", "obh", "mix")}
    for config in CONFIGS:
        assert config in seen, proc.stdout
    report = json.loads(out.read_text())
    assert {r["op"] for r in report["results"]} == {"n2h", "obh", "mix"}
    assert all(not r["errors"] for r in report["results"])
    assert report["levers"]["floor"] and report["levers"]["primitives"]


def test_a_second_build_serves_its_own_configuration(tmp_path: Path) -> None:
    """--build NAME=FHMON: NAME is served by that executable (here a wrapper that leaves a
    mark before it execs this checkout's fhmon), side by side with fhmon."""
    mark = tmp_path / "served"
    wrapper = tmp_path / "other-fhmon"
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" >> {mark}\n"
                       f"exec {Path(sys.executable).with_name('fhmon')} \"$@\"\n")
    wrapper.chmod(0o755)
    out = tmp_path / "build.json"
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--no-levers", "--ops", "n2h",
                           "--threads", "1", "--targets", "1", "--pinning", "unpinned",
                           "--repeat", "1", "--calls", "500", "--configs", "fhmon,other",
                           "--build", f"other={wrapper}", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    served = mark.read_text().splitlines()
    assert [line.split()[0] for line in served] == ["keygen", "serve"]
    report = json.loads(out.read_text())
    assert {r["config"] for r in report["results"]} == {"fhmon", "other"}


def test_a_build_that_is_no_executable_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--no-levers",
                           "--build", f"other={tmp_path / 'missing'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "is not an executable fhmon" in proc.stderr


def served_run(tmp_path: Path, ops: tuple[str, ...], *extra: str) -> tuple[dict, set]:
    """A small 1-thread run of ops against refmon and fhmon with the extra options: its
    report, and the (op, config) cells whose every call succeeded."""
    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--no-levers", "--ops",
                           ",".join(ops), "--threads", "1", "--targets", "1",
                           "--pinning", "unpinned", "--repeat", "1", "--calls", "500",
                           "--configs", "refmon,fhmon", *extra, "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    cells = {(r["op"], r["config"]) for r in report["results"] if not r["errors"]}
    return report, cells


def test_targets_without_no_new_privs_are_served(tmp_path: Path) -> None:
    """--no-new-privs off: targets whose filter was loaded while root, registered by the
    bench's own HELLO, answered by fhmon and refmon alike, every call a success."""
    ops = ("n2h", "n2h-path", "obh")
    report, cells = served_run(tmp_path, ops, "--no-new-privs", "off")
    assert report["targets_no_new_privs"] == "off"
    assert cells == {(op, config) for op in ops for config in ("refmon", "fhmon")}


def test_a_share_that_is_a_bind_mount_of_a_directory_is_served(tmp_path: Path) -> None:
    """--share mount: the share is a bind mount of a directory (lookups pay the subtree
    walk), and the report says so; every call of fhmon and refmon a success."""
    ops = ("n2h", "obh")
    report, cells = served_run(tmp_path, ops, "--share", "mount")
    assert report["machine"]["share"] == "mount"
    assert cells == {(op, config) for op in ops for config in ("refmon", "fhmon")}
