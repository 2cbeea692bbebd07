"""A `fhmon keeper` process for the tests that restart fhmon and the keeper in turn."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.support.world import FHMON, wait_until


class KeeperProc:
    """A `fhmon keeper` whose log is kept across restarts (one file, runs appended)."""

    def __init__(self, base: Path, name: str) -> None:
        self.socket = str(base / f"{name}.sock")
        self.log_path = base / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            log.write(b"--- start\n")
            self.proc = subprocess.Popen([FHMON, "keeper", "--socket", self.socket],
                                         stdout=log, stderr=log)
        self.runs += 1
        assert wait_until(lambda: '"event":"keeper_serving"' in self.this_run(), 15), \
            self.log_path.read_text()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def this_run(self) -> str:
        return self.log_path.read_text(errors="replace").rsplit("--- start\n", 1)[-1]

    def holds(self) -> int:
        return self.this_run().count('"event":"keeper_holds"')

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
            self.proc = None
