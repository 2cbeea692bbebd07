"""Smoke test of `python -m bench.run --perf OP`: perf samples fhmon and the report splits
its CPU into layers and syscalls. No timing assertions; scripts/test.sh installs perf."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_perf_splits_fhmon_cpu() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--perf", "obh", "--calls",
                           "3000"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    layers = {line.rsplit(None, 3)[0].strip() for line in lines if line.endswith("us/call")}
    # fhmon's own work shows up where it must: the kernel and the syscalls
    # open_by_handle_at is made of. (The code that answers is, with the defaults, the
    # native plane: well under a microsecond a call, too few samples to require a row.)
    for name in ("kernel", "ioctl", "open_by_handle_at", "openat"):
        assert name in layers, proc.stdout
    assert re.search(r"fhmon's CPU by layer \(\d+ samples", proc.stdout), proc.stdout
