"""Smoke test of bench.launch_latency: a few launches of each kind, end to end, with a second
build; every launch's first call is answered by fhmon (a launch that fell back fails)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.world import FHMON, REPO


def test_launch_latency_runs(tmp_path: Path) -> None:
    out = tmp_path / "launch.json"
    proc = subprocess.run([sys.executable, "-m", "bench.launch_latency", "--launches", "4",
                           "--block", "2", "--build", f"again={FHMON}", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for name in ("direct", "fhmon quiet", "fhmon loaded", "again quiet", "again loaded"):
        assert result[name]["n"] == 4, name
        assert all(ms > 0 for ms in result["raw"][name]), name
    assert "p99" in proc.stdout
